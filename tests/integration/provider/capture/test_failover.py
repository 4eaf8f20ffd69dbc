"""Failover of the source: the capture moves to a promoted replica by GTID, or refuses a replica that lacks
transactions it already delivered. A primary + GTID replica pair of the test's own (stack.mariadb_pair): the
primary is SIGKILLed, the shared MariaDB is never touched, so these tests need no ``exclusive``.

Oracles: the change topics (read by an independent read_committed consumer) replayed by version equal the new
primary's tables row by row; every writer transaction the new primary holds is in the topics exactly once;
after a refusal the topics and the ledger keep their exact end offsets.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.capture.resume import DivergedSourceError
from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook
from exactly_once_provider.kafka.offsets import read_committed_offset, topic_end_offsets
from exactly_once_provider.operators.backpressure import BinlogRetentionGuardOperator
from exactly_once_provider.positions import BinlogPosition
from tests import spark_job_support as jobs
from tests.capture_support import (
    Writer,
    check_transactions,
    create_tables,
    main_row,
    replay,
    seed,
    source_table,
    topic_records,
)
from tests.mysql_support import connect, unique_name

pytestmark = pytest.mark.slow

RUNNER = """
import json, sys
from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
result = BinlogCaptureOperator(task_id="capture", **json.loads(sys.argv[1])).execute({})
print("RESULT " + json.dumps(result), flush=True)
"""
CONN_ID = "mysql_failover"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def pair(stack):
    """A primary and its GTID replica of this test only; removed afterwards."""
    primary, replica = stack.mariadb_pair(unique_name("failover"), ports=(_free_port(), _free_port()))
    yield primary, replica
    for server in (primary, replica):
        server.remove()


def _server(stack, server) -> SimpleNamespace:
    """What tests.mysql_support.connect needs to reach one server of the pair."""
    return SimpleNamespace(
        HOST=stack.HOST,
        MARIADB_PORT=server.port,
        DB_USER=stack.DB_USER,
        DB_PASSWORD=stack.DB_PASSWORD,
        DB_NAME=stack.DB_NAME,
    )


def _connection(stack, server) -> dict[str, str]:
    """The Airflow connection naming ``server``: a failover switches its host/port to the new primary."""
    return {
        f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(
            {
                "conn_type": "mysql",
                "host": stack.HOST,
                "port": server.port,
                "login": stack.DB_USER,
                "password": stack.DB_PASSWORD,
                "schema": stack.DB_NAME,
            }
        )
    }


def _capture(stack, server, args: dict, kill_when=None, timeout: float = 240):
    """Run one capture process against ``server``; return (how it ended, result or None, output).

    :param kill_when: SIGKILL the process once this returns true (polled; the machine's load decides how fast the
        capture gets anywhere, so a fixed delay would not say what it did before the kill).
    """
    env = {**os.environ, **_connection(stack, server)}
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, json.dumps(args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        if kill_when is not None:
            deadline = time.monotonic() + 180
            while proc.poll() is None and not kill_when() and time.monotonic() < deadline:
                time.sleep(0.5)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode == -signal.SIGKILL:
        return "killed", None, out
    if proc.returncode != 0:
        return "failed", None, out
    (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
    return "ok", json.loads(line.removeprefix("RESULT ")), out


def _setup(stack, primary, replica):
    main, side = unique_name("fo_main"), unique_name("fo_side")
    for _ in range(3):  # the servers' binlog numbering differs, as it does in production (restarts, rotations):
        primary.query("FLUSH BINARY LOGS")  # the primary writes binlog.000004 when the replica writes .000001
    conn = connect(_server(stack, primary))
    cur = conn.cursor()
    create_tables(cur, main, side)
    cur.execute("SHOW MASTER STATUS")
    file, pos = cur.fetchone()[:2]
    seed(cur, main, 400)
    conn.close()
    replica.caught_up(primary)
    args = {
        "tables": [main, side],
        "pipeline": unique_name("fo"),
        "start_position": f"{file}:{pos}",
        "max_records": 100,
        "commit_interval_ms": 100,
        "mysql_conn_id": CONN_ID,
        "offsets_topic": unique_name("eo_fo_offsets"),
    }
    return main, side, args


def _writers(target, main, side, seeds, prefixes, id_bases, live_sets, side_ids=None):
    """Two concurrent writers on disjoint rows (no lock waits between them)."""
    writers = []
    for seed_value, prefix, base, live in zip(seeds, prefixes, id_bases, live_sets):
        writer = Writer(target, main, side, seeded=0, reserved=0, seed_value=seed_value, pause=0.01, tag_prefix=prefix)
        writer.live, writer.next_id, writer.side_ids = set(live), base, list((side_ids or {}).get(prefix, []))
        writers.append(writer)
        writer.start()
    return writers


def _stop(writers) -> None:
    for writer in writers:
        writer.stop.set()
    for writer in writers:
        writer.join(30)


def _held(replica, committed, server_id):
    """The writer transactions of ``server_id`` the (new) primary's binlog holds (async replication may have
    lost the old primary's last commits)."""
    state = {
        g.split("-")[1]: int(g.split("-")[2]) for g in replica.query("SELECT @@gtid_binlog_state")[0][0].split(",")
    }
    last = state.get(str(server_id), 0)
    return [c for c in committed if c[0].split("-")[1] != str(server_id) or int(c[0].split("-")[2]) <= last]


def _guard(stack, server, args, monkeypatch):
    """Run the retention guard of the capture against ``server`` (the connection switched to it)."""
    for key, value in _connection(stack, server).items():
        monkeypatch.setenv(key, value)
    return BinlogRetentionGuardOperator(
        task_id="guard",
        capture_pipeline=args["pipeline"],
        capture_source_partition="binlog",
        mysql_conn_id=CONN_ID,
        offsets_topic=args["offsets_topic"],
    ).execute({})


def test_capture_moves_to_the_promoted_replica_by_gtid_with_writers_running(
    stack, airflow_connections, pair, fault_outcome, monkeypatch
):
    primary, replica = pair
    main, side, args = _setup(stack, primary, replica)
    old = _server(stack, primary)
    writers = _writers(
        old,
        main,
        side,
        (31, 32),
        ("a", "b"),
        (1_000_000, 5_000_000),
        ({i for i in range(400) if i % 2 == 0}, {i for i in range(400) if i % 2}),
    )
    how, _, out = _capture(
        stack,
        primary,
        {**args, "mode": "continuous", "max_runtime": 120},
        kill_when=lambda: _commits(stack, args) >= 20,
    )
    assert how == "killed", out[-3000:]  # the capture dies with the primary's host, 20 commits in
    replica.caught_up(primary)  # everything the capture can have read is on the replica
    primary.kill()  # SIGKILL with the writers still committing: their last commits may never reach the replica
    _stop(writers)
    replica.promote()
    # The retention guard measures the server the connection names, before the capture has moved there too.
    headroom = _guard(stack, replica, args, monkeypatch)
    assert headroom["position"].startswith("binlog.000001:") and not headroom["purged"], headroom

    new = _server(stack, replica)
    # Only rows the new primary holds: an UPDATE of a lost row would take a gap lock, and two writers' gap locks
    # deadlock their inserts.
    live = {r["id"] for r in source_table(new, main)}
    sides = {r["id"] for r in source_table(new, side)}
    after = _writers(
        new,
        main,
        side,
        (41, 42),
        ("c", "d"),
        (9_000_000, 13_000_000),
        ({i for i in live if i % 2 == 0}, {i for i in live if i % 2}),
        {"c": [i for i in writers[0].side_ids if i in sides], "d": [i for i in writers[1].side_ids if i in sides]},
    )
    how, result, out = _capture(stack, replica, {**args, "mode": "continuous", "max_runtime": 8})
    _stop(after)
    assert how == "ok", out[-4000:]
    assert "GTID position 0-101-" in out and "on server_id 102 (version base" in out, out[-4000:]
    assert int(result["committed_position"].split(".")[-1].split(":")[0]) >= 1  # a position of the replica
    how, final, out = _capture(stack, replica, {**args, "mode": "bounded"})  # catch up, same server now
    assert how == "ok", out[-4000:]
    assert "server_id 102, by file/position" in out, out[-3000:]

    main_records = topic_records(stack, final["topics"][f"{stack.DB_NAME}.{main}"])
    side_records = topic_records(stack, final["topics"][f"{stack.DB_NAME}.{side}"])
    assert {k: main_row(v) for k, v in replay({}, main_records).items()} == {
        json.dumps({"id": r["id"]}): main_row(r) for r in source_table(new, main)
    }
    assert {k: (v["id"], v["main_id"], v["qty"]) for k, v in replay({}, side_records).items()} == {
        json.dumps({"id": r["id"]}): (r["id"], r["main_id"], r["qty"]) for r in source_table(new, side)
    }
    # Versions keep growing across the servers: everything read on the replica is newer than anything before.
    old_versions = [r["version"] for r in main_records + side_records if r["source"]["server_id"] == 101]
    new_versions = [r["version"] for r in main_records + side_records if r["source"]["server_id"] == 102]
    assert old_versions and new_versions and max(old_versions) < min(new_versions)
    committed = _held(replica, [c for w in writers for c in w.committed], 101) + [c for w in after for c in w.committed]
    counts = check_transactions(
        main_records + side_records, committed, [t for w in writers + after for t in w.rolled_back], 0, {main, side}
    )
    fault_outcome(
        rows=counts["records"],
        lost=counts["lost"],
        duplicated=counts["duplicated"],
        scenario="failover_to_replica_by_gtid",
    )
    assert counts["lost"] == 0 and counts["duplicated"] == 0, counts
    assert min(len(w.committed) for w in writers + after) > 5, [len(w.committed) for w in writers + after]
    assert all(w.error is None for w in after), [w.error for w in after]


def test_capture_refuses_a_replica_that_lacks_delivered_transactions(stack, airflow_connections, pair, monkeypatch):
    primary, replica = pair
    main, side, args = _setup(stack, primary, replica)
    replica.query("STOP SLAVE")  # replication stops shortly before the primary dies
    lagging = replica.gtid_binlog_pos()
    old = _server(stack, primary)
    writers = _writers(
        old,
        main,
        side,
        (51, 52),
        ("a", "b"),
        (1_000_000, 5_000_000),
        ({i for i in range(400) if i % 2 == 0}, {i for i in range(400) if i % 2}),
    )
    time.sleep(2)
    _stop(writers)
    how, result, out = _capture(stack, primary, {**args, "mode": "bounded"})  # delivers what the replica lacks
    assert how == "ok", out[-4000:]
    delivered = result["gtid"]
    topics = sorted(result["topics"].values())
    plain = {"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"}
    before = {t: topic_end_offsets(plain, t) for t in [*topics, args["offsets_topic"]]}
    primary.kill()
    replica.promote()
    # The new primary takes writes before the capture comes back: its sequence numbers pass the delivered ones
    # (0-102-n, n > delivered), which must not hide that it lacks 0-101-...
    first_missing, last_delivered = int(lagging.split("-")[2]) + 1, int(delivered.split("-")[2])
    conn = connect(_server(stack, replica))
    for i in range(last_delivered - first_missing + 5):
        conn.cursor().execute(
            f"INSERT INTO `{main}` VALUES (%s, 1, 1.00, 'new primary', NULL, NULL)", (20_000_000 + i,)
        )
    conn.close()
    assert int(replica.gtid_binlog_pos().split("-")[2]) > last_delivered

    how, _, out = _capture(stack, replica, {**args, "mode": "bounded"})
    assert how == "failed", out[-3000:]
    assert "DivergedSourceError" in out and "lacks transactions the capture already delivered" in out, out[-3000:]
    assert f"0-101-{first_missing} .. {delivered}" in out, (lagging, delivered, out[-3000:])
    touched = sorted(
        {
            f"{r['source']['schema']}.{r['source']['table']}"
            for t in topics
            for r in topic_records(stack, t)
            if int(r["source"]["gtid"].split("-")[2]) >= first_missing
        }
    )
    assert f"tables touched: {', '.join(touched)}" in out, out[-3000:]
    assert "NEW pipeline name" in out and "full_reload under this pipeline keeps refusing" in out
    with pytest.raises(AirflowException, match=f"0-101-{first_missing} .. {delivered}") as guarded:
        _guard(stack, replica, args, monkeypatch)  # the retention guard fails the same way
    assert isinstance(guarded.value.__cause__, DivergedSourceError)
    after = {t: topic_end_offsets(plain, t) for t in [*topics, args["offsets_topic"]]}
    assert after == before  # nothing written to the topics or the ledger after the stop
    how, _, out = _capture(stack, replica, {**args, "mode": "continuous", "max_runtime": 5})
    assert how == "failed" and "DivergedSourceError" in out  # and it keeps refusing
    assert {t: topic_end_offsets(plain, t) for t in [*topics, args["offsets_topic"]]} == before


def test_a_ledger_record_from_before_gtid_positions_resumes_on_the_same_server(stack, airflow_connections, pair):
    primary, replica = pair
    main, side, args = _setup(stack, primary, replica)
    how, first, out = _capture(stack, primary, {**args, "mode": "bounded"})
    assert how == "ok", out[-3000:]
    # The ledger record as captures wrote it before server_id/gtid_pos/version_base/table_gtids existed.
    producer = TransactionalProducerHook(
        "kafka_default",
        pipeline=args["pipeline"],
        source_partition="binlog",
        delivery_mode="exactly_once",
        offsets_topic=args["offsets_topic"],
    )
    writer = producer.open_writer(track_partition_offsets=False)
    try:
        offset = writer.last_committed.offset
        assert offset["server_id"] == 101 and offset["gtid_pos"] == first["gtid"]
        old = {key: offset[key] for key in ("format", "file", "pos", "gtid", "tables")}
        writer.write_batch(first["topics"][f"{stack.DB_NAME}.{main}"], [], old)
    finally:
        writer.close()
    writers = _writers(
        _server(stack, primary),
        main,
        side,
        (61, 62),
        ("a", "b"),
        (1_000_000, 5_000_000),
        ({i for i in range(400) if i % 2 == 0}, {i for i in range(400) if i % 2}),
    )
    time.sleep(2)
    _stop(writers)
    how, final, out = _capture(stack, primary, {**args, "mode": "bounded"})
    assert how == "ok", out[-3000:]
    assert "by file/position; the record names no server" in out and final["resumed_from"] == str(
        first["committed_position"]
    ), out[-3000:]
    records = [
        *topic_records(stack, final["topics"][f"{stack.DB_NAME}.{main}"]),
        *topic_records(stack, final["topics"][f"{stack.DB_NAME}.{side}"]),
    ]
    main_records = [r for r in records if r["source"]["table"] == main]
    assert {k: main_row(v) for k, v in replay({}, main_records).items()} == {
        json.dumps({"id": r["id"]}): main_row(r) for r in source_table(_server(stack, primary), main)
    }
    counts = check_transactions(
        records, [c for w in writers for c in w.committed], [t for w in writers for t in w.rolled_back], 0, {main, side}
    )
    assert counts["lost"] == 0 and counts["duplicated"] == 0, counts
    # From this run on the ledger holds the full GTID position again (a later failover can find it).
    assert _ledger(stack, args)["gtid_pos"] == final["gtid"]


def _commits(stack, args) -> int:
    """Return how many Kafka transactions the capture has committed (its ledger record's sequence; read only)."""
    try:
        committed = read_committed_offset(
            {"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"},
            args["pipeline"],
            "binlog",
            args["offsets_topic"],
            timeout=30,
        )
    except ValueError:  # the capture has not created its offsets topic yet
        return 0
    return committed.sequence if committed is not None else 0


def _ledger(stack, args) -> dict:
    producer = TransactionalProducerHook(
        "kafka_default",
        pipeline=args["pipeline"],
        source_partition="binlog",
        delivery_mode="exactly_once",
        offsets_topic=args["offsets_topic"],
    )
    writer = producer.open_writer(track_partition_offsets=False)
    try:
        return writer.last_committed.offset
    finally:
        writer.close()


def test_a_full_reload_on_the_new_primary_hands_off_with_the_capture_s_version_base(
    stack, airflow_connections, pair, fault_outcome, monkeypatch, tmp_path
):
    """Writers on the primary, capture running, failover; a full load of the main table on the new primary
    (before the capture moved there) while writers go on; the capture resumes by GTID and hands off to it."""
    from exactly_once_provider.full_load.handoff import read_handoff
    from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
    from tests.capture_support import full_load_rows

    primary, replica = pair
    main, side, args = _setup(stack, primary, replica)
    writers = _writers(
        _server(stack, primary),
        main,
        side,
        (71, 72),
        ("a", "b"),
        (1_000_000, 5_000_000),
        ({i for i in range(400) if i % 2 == 0}, {i for i in range(400) if i % 2}),
    )
    how, _, out = _capture(
        stack,
        primary,
        {**args, "mode": "continuous", "max_runtime": 120},
        kill_when=lambda: _commits(stack, args) >= 20,
    )
    assert how == "killed", out[-3000:]
    replica.caught_up(primary)
    primary.kill()
    _stop(writers)
    replica.promote()

    new = _server(stack, replica)
    for key, value in _connection(stack, replica).items():  # the connection switched to the new primary
        monkeypatch.setenv(key, value)
    live = {r["id"] for r in source_table(new, main)}
    sides = {r["id"] for r in source_table(new, side)}
    after = _writers(
        new,
        main,
        side,
        (81, 82),
        ("c", "d"),
        (9_000_000, 13_000_000),
        ({i for i in live if i % 2 == 0}, {i for i in live if i % 2}),
        {"c": [i for i in writers[0].side_ids if i in sides], "d": [i for i in writers[1].side_ids if i in sides]},
    )
    sink = str(tmp_path / "main")
    try:
        # The full reload the docs recommend after a failover, before the capture has resumed on the new primary.
        MySqlFullLoadOperator(
            task_id="load",
            table=main,
            sink_path=sink,
            chunk_rows=150,
            chunks_per_job=8,
            full_reload=True,
            mysql_conn_id=CONN_ID,
            spark_conf=stack.spark_conf(),
            capture_pipeline=args["pipeline"],
            capture_source_partition="binlog",
            offsets_topic=args["offsets_topic"],
        ).execute({})
        time.sleep(1.0)  # writers commit after the snapshots too
        loaded = read_handoff(sink)
        assert loaded.server_id == 102 and loaded.version_base > 0, loaded
        paths = {**args, "full_load_paths": {main: sink}}
        how, result, out = _capture(stack, replica, {**paths, "mode": "continuous", "max_runtime": 8})
    finally:
        _stop(after)
    assert how == "ok", out[-4000:]
    assert f"on server_id 102 (version base {loaded.version_base})" in out, out[-4000:]
    how, final, out = _capture(stack, replica, {**paths, "mode": "bounded"})
    assert how == "ok", out[-4000:]
    assert _ledger(stack, args)["handed_off"].get(f"{stack.DB_NAME}.{main}") == loaded.load_id

    records = [
        *topic_records(stack, final["topics"][f"{stack.DB_NAME}.{main}"]),
        *topic_records(stack, final["topics"][f"{stack.DB_NAME}.{side}"]),
    ]
    main_records = [r for r in records if r["source"]["table"] == main]
    # The current table's rule: the full load's rows, then every change from its oldest snapshot on
    # (current_changes.typed_changes) whose version is newer than the row's. The changes read on the old primary
    # were not merged before the reload (the worst case): their versions must sort below the snapshot's.
    loaded_rows = full_load_rows(sink)  # before the apply below adds its commit
    current = {key: (row["_eo_version"], row) for key, row in loaded_rows.items()}
    for record in sorted((r for r in main_records if r["version"] >= loaded.min_version), key=lambda r: r["version"]):
        key = json.dumps(record["pk"], sort_keys=True)
        if key not in current or record["version"] > current[key][0]:
            current[key] = (record["version"], None if record["op"] == "d" else record["after"])
    assert {k: main_row(row) for k, (_, row) in current.items() if row is not None} == {
        json.dumps({"id": r["id"]}): main_row(r) for r in source_table(new, main)
    }
    # The real apply (a fresh checkpoint: every change read on the old primary is merged after the reload) gives
    # the same table, read back with delta-rs.
    topic = final["topics"][f"{stack.DB_NAME}.{main}"]
    applied = jobs.run_job(
        stack,
        jobs.job_args(
            stack, f"{args['pipeline']}-apply", topic, tmp_path / "checkpoint", "delta", sink, mode="current"
        ),
    )
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    assert _current_table(sink) == {json.dumps({"id": r["id"]}): main_row(r) for r in source_table(new, main)}
    # Versions ordered: old primary < full load < changes read on the new primary after its snapshots.
    old_versions = [r["version"] for r in main_records if r["source"]["server_id"] == 101]
    loaded_versions = {row["_eo_version"] for row in loaded_rows.values()}
    assert old_versions and max(old_versions) < min(loaded_versions)
    late = [
        r["version"]
        for r in main_records
        if r["source"]["server_id"] == 102
        and BinlogPosition(r["source"]["file"], r["source"]["pos"]) >= loaded.max_position
    ]
    assert late and max(loaded_versions) < min(late)
    snapshot_gtids = replica.query(f"SELECT BINLOG_GTID_POS('{loaded.max_position.file}', {loaded.max_position.pos})")[
        0
    ][0]
    filtered_up_to = max(int(g.split("-")[2]) for g in snapshot_gtids.split(","))
    committed = _held(replica, [c for w in writers for c in w.committed], 101) + [c for w in after for c in w.committed]
    counts = check_transactions(
        records, committed, [t for w in writers + after for t in w.rolled_back], filtered_up_to, {main, side}
    )
    fault_outcome(
        rows=counts["records"],
        lost=counts["lost"],
        duplicated=counts["duplicated"],
        scenario="full_reload_after_failover",
    )
    assert counts["lost"] == 0 and counts["duplicated"] == 0, counts
    assert min(len(w.committed) for w in after) > 5, [len(w.committed) for w in after]
    assert all(w.error is None for w in after), [w.error for w in after]


def _current_table(path: str) -> dict:
    """Return the current table's live rows (read with delta-rs, no Spark) as ``{pk json: main_row}``."""
    import datetime as dt

    from deltalake import DeltaTable

    rows = {}
    for row in DeltaTable(path).to_pyarrow_table().to_pylist():
        if row["_eo_deleted"]:
            continue
        for column in ("ts", "dt"):
            if row[column] is not None and row[column].tzinfo is not None:
                row[column] = row[column].astimezone(dt.UTC).replace(tzinfo=None)
        rows[json.dumps({"id": row["id"]})] = main_row(row)
    return rows
