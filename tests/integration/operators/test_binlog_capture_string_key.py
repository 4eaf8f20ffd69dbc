"""Handoff of a string key under a case-insensitive collation: chunk membership must follow the server's order.

The full load cuts chunks in the collation's order ('a' < 'B' < 'c'); Python orders by code point ('B' < 'a').
A change filtered against the wrong chunk's snapshot position is lost (dropped although it is newer than the
snapshot that holds its key) or applied twice. Oracle: full load + captured changes by version == source, row
by row, and no source row change appears twice in the topic.
"""

from __future__ import annotations

import json
import random
import threading
import time

from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from tests.capture_support import replay, topic_records
from tests.mysql_support import connect, unique_name


def _key(i: int) -> str:
    letter = "abcdefghij"[i % 10]
    return f"{letter.upper() if i % 2 else letter}{i:05d}"


class _Writer(threading.Thread):
    """Updates, inserts and deletes random keys in small transactions until stopped."""

    def __init__(self, stack, table: str, keys: list[str]) -> None:
        super().__init__(daemon=True)
        self.stack, self.table, self.keys = stack, table, list(keys)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.transactions = 0

    def run(self) -> None:
        rnd = random.Random(11)
        try:
            conn = connect(self.stack)
            cur = conn.cursor()
            n = 0
            while not self.stop.is_set():
                n += 1
                cur.execute("BEGIN")
                for key in rnd.sample(self.keys, 3):
                    cur.execute(f"UPDATE `{self.table}` SET v = v + 1 WHERE k = %s", (key,))
                if n % 7 == 0:
                    key = _key(100_000 + n)
                    cur.execute(f"INSERT INTO `{self.table}` VALUES (%s, %s)", (key, n))
                    self.keys.append(key)
                if n % 11 == 0:
                    gone = self.keys.pop(rnd.randrange(len(self.keys)))
                    cur.execute(f"DELETE FROM `{self.table}` WHERE k = %s", (gone,))
                cur.execute("COMMIT")
                self.transactions += 1
                time.sleep(0.002)
            conn.close()
        except BaseException as error:  # reported by the test
            self.error = error


def test_changes_during_the_load_are_filtered_by_the_chunk_the_server_puts_their_key_in(
    stack, spark, airflow_connections, tmp_path
):
    table, pipeline = unique_name("cap_ci"), unique_name("cap_ci")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE `{table}` (k VARCHAR(16) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci "
        "NOT NULL PRIMARY KEY, v INT NOT NULL)"
    )
    keys = [_key(i) for i in range(1500)]
    cur.executemany(f"INSERT INTO `{table}` VALUES (%s, 0)", [(k,) for k in keys])
    writer = _Writer(stack, table, keys)
    sink = str(tmp_path / "load")
    try:
        writer.start()
        time.sleep(0.5)
        MySqlFullLoadOperator(
            task_id="load", table=table, sink_path=sink, chunk_rows=60, chunks_per_job=8, spark_conf=stack.spark_conf()
        ).execute({})
        time.sleep(0.5)
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.error is None, writer.error
    handoff = read_handoff(sink)
    assert len(handoff.chunks) > 20 and handoff.min_position < handoff.max_position

    result = BinlogCaptureOperator(
        task_id="capture", tables=[table], pipeline=pipeline, full_load_paths={table: sink}, max_records=500
    ).execute({})
    assert result["dropped_by_handoff"] > 0, "the writer ran during the load: some changes were already loaded"

    records = topic_records(stack, result["topics"][f"{stack.DB_NAME}.{table}"])
    versions = [r["version"] for r in records]
    assert len(versions) == len(set(versions)), "a source row change appears twice in the topic"
    loaded = {
        json.dumps({"k": row["k"]}): {"k": row["k"], "v": row["v"]}
        for row in spark.read.format("delta").load(sink).collect()
    }
    replayed = {k: (v["k"], v["v"]) for k, v in replay(loaded, records).items()}
    cur.execute(f"SELECT k, v FROM `{table}`")
    source = {json.dumps({"k": k}): (k, v) for k, v in cur.fetchall()}
    lost_or_stale = sorted(k for k in source if replayed.get(k) != source[k])
    assert replayed == source, f"{len(lost_or_stale)} keys differ from the source, e.g. {lost_or_stale[:5]}"
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()
