"""Full load with writers running: each chunk equals the source AS OF that chunk's recorded binlog position.

The state of the table at a position P is rebuilt from the final table by undoing, newest first, every row
event the binlog holds after P (FULL row images give the before-values). A chunk is right only if its rows
equal that state restricted to its key range. A negative control shows the check tells positions apart.
"""

from __future__ import annotations

import random
import threading
import time
import uuid

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.positions import BinlogPosition
from tests.mysql_support import connect, unique_name

INITIAL = 4000


def _writer(stack, table, stop, stats, seed):
    rng = random.Random(seed)
    conn = connect(stack)
    cur = conn.cursor()
    next_id = INITIAL + 1 + seed * 1_000_000
    while not stop.is_set():
        op = rng.random()
        if op < 0.35:
            cur.execute(f"INSERT INTO `{table}` (id, v, s) VALUES (%s, 0, 'new')", (next_id,))
            next_id += 1
        elif op < 0.45:  # rows below every chunk boundary land in the first (open-ended) chunk
            cur.execute(f"INSERT IGNORE INTO `{table}` (id, v, s) VALUES (%s, 0, 'neg')", (-rng.randint(1, 10**6),))
        elif op < 0.8:
            cur.execute(f"UPDATE `{table}` SET v = v + 1, s = 'upd' WHERE id = %s", (rng.randint(1, INITIAL),))
        else:
            cur.execute(f"DELETE FROM `{table}` WHERE id = %s", (rng.randint(1, INITIAL),))
        stats["ops"] += 1
    conn.close()


def _long_transactions(stack, table, stop, stats):
    """Transactions that stay open across several chunk snapshots, touching keys in every chunk."""
    rng = random.Random(7)
    conn = connect(stack)
    cur = conn.cursor()
    while not stop.is_set():
        cur.execute("START TRANSACTION")
        for _ in range(8):
            cur.execute(f"UPDATE `{table}` SET v = v + 1000, s = 'long' WHERE id = %s", (rng.randint(1, INITIAL),))
        cur.execute(f"INSERT INTO `{table}` (id, v, s) VALUES (%s, 0, 'long')", (10**8 + stats["long"],))
        time.sleep(1.5)
        cur.execute("COMMIT")
        stats["long"] += 1
    conn.close()


def _binlog_row_events(stack, table, start: BinlogPosition):
    stream = BinLogStreamReader(
        connection_settings={
            "host": stack.HOST,
            "port": stack.MARIADB_PORT,
            "user": stack.DB_USER,
            "passwd": stack.DB_PASSWORD,
        },
        server_id=5000 + uuid.uuid4().int % 1000,
        resume_stream=True,
        log_file=start.file,
        log_pos=start.pos,
        is_mariadb=False,
        blocking=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        only_schemas=[stack.DB_NAME],
        only_tables=[table],
    )
    events = [(BinlogPosition(stream.log_file, event.packet.log_pos), event) for event in stream]
    stream.close()
    return events


def _state_at(final: dict, events, position: BinlogPosition) -> dict:
    state = dict(final)
    for at, event in reversed(events):
        if at <= position:
            break
        for row in reversed(event.rows):
            if isinstance(event, WriteRowsEvent):
                state.pop(row["values"]["id"])
            elif isinstance(event, DeleteRowsEvent):
                state[row["values"]["id"]] = (row["values"]["v"], row["values"]["s"])
            else:
                state.pop(row["after_values"]["id"])
                state[row["before_values"]["id"]] = (row["before_values"]["v"], row["before_values"]["s"])
    return state


def _in_chunk(key, chunk) -> bool:
    return (chunk.lower is None or (key,) > chunk.lower) and (chunk.upper is None or (key,) <= chunk.upper)


def test_every_chunk_equals_the_source_at_its_own_position(stack, spark, airflow_connections, tmp_path):
    table = unique_name("fl_live")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, v INT NOT NULL, s VARCHAR(8) NOT NULL)")
    cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s, 'init')", [(i, i) for i in range(1, INITIAL + 1)])
    stop, stats = threading.Event(), {"ops": 0, "long": 0}
    threads = [threading.Thread(target=_writer, args=(stack, table, stop, stats, seed)) for seed in (1, 2)]
    threads.append(threading.Thread(target=_long_transactions, args=(stack, table, stop, stats)))
    for thread in threads:
        thread.start()
    try:
        time.sleep(1)
        sink = str(tmp_path / "sink")
        # One chunk per Spark job: the chunks' snapshots are taken seconds apart while the writers run.
        result = run_full_load(
            spark,
            MySqlSourceHook(),
            FullLoadRequest(schema="eo", table=table, sink_path=sink, chunk_rows=500, chunks_per_job=1),
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    cur.execute(f"SELECT id, v, s FROM `{table}`")
    final = {row[0]: (row[1], row[2]) for row in cur.fetchall()}
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()

    h = result.handoff
    loaded = [(r.id, r.v, r.s) for r in spark.read.format("delta").load(sink).collect()]
    assert len(loaded) == len({r[0] for r in loaded}), "a key was loaded twice"
    events = _binlog_row_events(stack, table, h.min_position)
    positions = {c.position for c in h.chunks}
    # Chunks whose waves run while both writers wait on a long transaction's row lock share a position, and the
    # faster the load the more of them do: three distinct positions already make a single load-wide position wrong.
    assert len(positions) >= 3, f"chunks should be snapshotted at different positions, got {positions}"
    assert stats["long"] >= 2 and stats["ops"] > 200, stats
    assert sum(1 for at, _ in events if at > h.min_position) > 100, "writers must change the table during the load"

    for entry in h.chunks:
        expected = {k: v for k, v in _state_at(final, events, entry.position).items() if _in_chunk(k, entry.chunk)}
        got = {k: (v, s) for k, v, s in loaded if _in_chunk(k, entry.chunk)}
        assert got == expected, f"chunk {entry.chunk.index} differs from the source at {entry.position}"
        assert entry.rows == len(got)

    # Negative control: judged against the LAST chunk's position, some earlier chunk must differ.
    wrong = _state_at(final, events, h.max_position)
    mismatched = [
        e.chunk.index
        for e in h.chunks
        if {k: v for k, v in wrong.items() if _in_chunk(k, e.chunk)}
        != {k: (v, s) for k, v, s in loaded if _in_chunk(k, e.chunk)}
    ]
    assert mismatched, "the check cannot tell positions apart: it would pass for any position"
