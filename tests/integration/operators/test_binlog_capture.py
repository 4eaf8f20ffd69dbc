"""BinlogCaptureOperator on the real stack: a full load in the middle of a live writer, then the capture.

Oracle: the full load's Delta table plus the topic's changes (per key, by version) equals the source table row
by row; every committed source transaction's changes are in the topic exactly once; no rolled-back change is.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from exactly_once_provider.positions import BinlogPosition
from tests.capture_support import (
    Writer,
    check_transactions,
    create_tables,
    full_load_rows,
    gtid_at,
    gtid_seq,
    main_row,
    replay,
    seed,
    source_table,
    topic_records,
)
from tests.mysql_support import connect, unique_name


def _position(result: dict) -> BinlogPosition:
    file, pos = result["committed_position"].rsplit(":", 1)
    return BinlogPosition(file, int(pos))


def _binlog_end(cur) -> str:
    cur.execute("SHOW MASTER STATUS")
    file, pos = cur.fetchone()[:2]
    return f"{file}:{pos}"


def test_full_load_mid_writer_then_capture_replays_to_the_source(
    stack, spark, airflow_connections, tmp_path, caplog, capfd
):
    main, side = unique_name("cap_main"), unique_name("cap_side")
    pipeline = unique_name("cap")
    spark.conf.set("spark.databricks.delta.snapshotPartitions", "2")  # Delta's default of 50 tasks dominates
    conn = connect(stack)
    cur = conn.cursor()
    create_tables(cur, main, side)
    side_start = _binlog_end(cur)  # the side table has no full load: captured from its creation (empty)
    seed(cur, main, 1200)
    writer = Writer(stack, main, side, seeded=1200, pause=0.03)
    long_conn = connect(stack)
    long_cur = long_conn.cursor()
    try:
        writer.start()
        time.sleep(1.0)
        # A transaction open across the snapshot: the load must not see it, the capture must deliver it.
        long_cur.execute("BEGIN")
        long_cur.execute(f"UPDATE `{main}` SET note = 'long', amount = amount + 100 WHERE id < 5")
        long_cur.execute(f"INSERT INTO `{main}` VALUES (5000000, 0, 0.01, 'long', NULL, NULL)")
        sink = str(tmp_path / "main")
        MySqlFullLoadOperator(
            task_id="load", table=main, sink_path=sink, chunk_rows=300, chunks_per_job=8, spark_conf=stack.spark_conf()
        ).execute({})
        long_cur.execute("COMMIT")
        long_cur.execute("SELECT @@last_gtid")
        writer.committed.append((long_cur.fetchone()[0], 6, "long"))
        time.sleep(1.0)
        capture = dict(
            task_id="capture",
            tables=[main, side],
            pipeline=pipeline,
            full_load_paths={main: sink},
            start_position=side_start,
            max_records=500,
            commit_interval_ms=200,
        )
        with caplog.at_level(logging.INFO):
            first = BinlogCaptureOperator(**capture).execute({})  # bounded, while the writer still writes
        time.sleep(1.0)
    finally:
        writer.stop.set()
        writer.join(30)
        long_conn.close()
    assert writer.error is None, writer.error
    second = BinlogCaptureOperator(**capture).execute({})
    # Nothing new in the captured tables. Other tests may write other tables meanwhile (the suite runs on two
    # workers against one server): the position may move past their transactions, never a row may appear.
    third = BinlogCaptureOperator(**capture).execute({})

    handoff = read_handoff(sink)
    assert len(handoff.chunks) >= 4 and handoff.min_position < handoff.max_position, handoff.chunks
    assert first["first_run"] and not second["first_run"] and second["resumed_from"] == first["committed_position"]
    assert third["rows"] == 0 and _position(third) >= _position(second)
    assert first["dropped_by_handoff"] > 0, "the writer ran during the load: some changes were already loaded"
    out, err = capfd.readouterr()
    logged = caplog.text + out + err  # the task logger writes through structlog
    assert "rows/s" in logged and "behind the binlog end" in logged and stack.DB_PASSWORD not in logged

    main_records = topic_records(stack, first["topics"][f"{stack.DB_NAME}.{main}"])
    side_records = topic_records(stack, first["topics"][f"{stack.DB_NAME}.{side}"])
    assert len(main_records) + len(side_records) == first["rows"] + second["rows"]

    # Replay: full load + changes by version == source, row by row.
    replayed = replay(full_load_rows(sink), main_records)
    expected = {json.dumps({"id": r["id"]}): main_row(r) for r in source_table(stack, main)}
    assert {k: main_row(v) for k, v in replayed.items()} == expected
    replayed_side = replay({}, side_records)
    assert {k: (v["id"], v["main_id"], v["qty"]) for k, v in replayed_side.items()} == {
        json.dumps({"id": r["id"]}): (r["id"], r["main_id"], r["qty"]) for r in source_table(stack, side)
    }
    assert any(r["qty"] > 2**31 for r in source_table(stack, side)), "unsigned values above INT range are covered"

    # Every committed source transaction exactly once; rolled-back ones never.
    filtered_up_to = gtid_at(stack, handoff.max_position)
    counts = check_transactions(
        main_records + side_records, writer.committed, writer.rolled_back, filtered_up_to, {main, side}
    )
    assert counts["duplicated"] == 0 and counts["lost"] == 0, counts
    assert writer.rolled_back, "the writer rolled back some transactions"
    multi = [
        g
        for g, _, _ in writer.committed
        if {r["source"]["table"] for r in main_records + side_records if r["source"]["gtid"] == g} == {main, side}
    ]
    assert multi, "multi-table transactions reached both topics"
    assert sum(1 for g, _, _ in writer.committed if gtid_seq(g) > filtered_up_to) > 20
    cur.execute(f"DROP TABLE `{main}`, `{side}`")
    conn.close()


def test_ddl_mid_stream_new_schema_version_then_truncate_stops_cleanly(stack, airflow_connections):
    table = unique_name("cap_ddl")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, a INT, b VARCHAR(8))")
    start = _binlog_end(cur)
    cur.execute(f"INSERT INTO `{table}` VALUES (1, 1, 'x'), (2, 2, 'y')")
    cur.execute(f"ALTER TABLE `{table}` ADD COLUMN c DECIMAL(6,2) DEFAULT 1.50")
    cur.execute(f"UPDATE `{table}` SET a = 10 WHERE id = 1")
    cur.execute(f"ALTER TABLE `{table}` DROP COLUMN b, MODIFY COLUMN a BIGINT UNSIGNED")
    cur.execute(f"INSERT INTO `{table}` VALUES (3, 18446744073709551615, 2.25)")
    cur.execute(f"TRUNCATE TABLE `{table}`")
    cur.execute(f"INSERT INTO `{table}` VALUES (4, 4, 4.00)")
    op = dict(task_id="capture", tables=[table], pipeline=unique_name("cap_ddl"), start_position=start)
    with pytest.raises(AirflowException, match=r"TRUNCATE.*full reload"):
        BinlogCaptureOperator(**op).execute({})
    everything = topic_records(stack, f"{op['pipeline']}.{stack.DB_NAME}.{table}")
    # Each ALTER TABLE rides in the topic as a schema record, in binlog order (typed sinks follow it).
    assert [r["op"] for r in everything] == ["c", "c", "ddl", "u", "ddl", "c"]
    ddl = [r for r in everything if r["op"] == "ddl"]
    assert [r["ddl"] for r in ddl] == [
        f"ALTER TABLE `{table}` ADD COLUMN c DECIMAL(6,2) DEFAULT 1.50",
        f"ALTER TABLE `{table}` DROP COLUMN b, MODIFY COLUMN a BIGINT UNSIGNED",
    ]
    assert everything[1]["version"] < ddl[0]["version"] <= everything[3]["version"] < ddl[1]["version"]
    records = [r for r in everything if r["op"] != "ddl"]
    assert [(r["op"], r["pk"]["id"]) for r in records] == [("c", 1), ("c", 2), ("u", 1), ("c", 3)]
    versions = [r["schema_version"] for r in records]
    assert versions[0] == versions[1] != versions[2] != versions[3] != versions[0]
    assert records[2]["after"] == {"id": 1, "a": 10, "b": "x", "c": "1.50"}
    assert records[3]["after"] == {"id": 3, "a": 18446744073709551615, "c": "2.25"}
    with pytest.raises(AirflowException, match="TRUNCATE"):  # a rerun stops at the same statement: nothing skipped
        BinlogCaptureOperator(**op).execute({})
    assert len(topic_records(stack, f"{op['pipeline']}.{stack.DB_NAME}.{table}")) == 6
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()


def test_a_dropped_table_stops_cleanly_with_on_drop_stop_and_the_others_go_on(stack, airflow_connections):
    from exactly_once_provider.kafka.offsets import DEFAULT_OFFSETS_TOPIC, read_committed_offset

    keep, gone = unique_name("cap_keep"), unique_name("cap_gone")
    conn = connect(stack)
    cur = conn.cursor()
    for name in (keep, gone):
        cur.execute(f"CREATE TABLE `{name}` (id INT PRIMARY KEY, v INT)")
    start = _binlog_end(cur)
    cur.execute(f"INSERT INTO `{keep}` VALUES (1, 1)")
    cur.execute(f"INSERT INTO `{gone}` VALUES (1, 1), (2, 2)")
    cur.execute(f"UPDATE `{gone}` SET v = 20 WHERE id = 2")
    cur.execute(f"DROP TABLE `{gone}`")
    cur.execute(f"INSERT INTO `{keep}` VALUES (2, 2)")
    cur.execute(f"CREATE TABLE `{gone}` (id INT PRIMARY KEY, v INT)")  # created again: not followed without a load
    cur.execute(f"INSERT INTO `{gone}` VALUES (7, 7)")
    cur.execute(f"INSERT INTO `{keep}` VALUES (3, 3)")
    pipeline = unique_name("cap_drop")
    op = dict(task_id="capture", tables=[keep, gone], pipeline=pipeline, start_position=start)
    with pytest.raises(AirflowException, match=r"DROP TABLE.*full reload"):  # the default: stop before it
        BinlogCaptureOperator(**{**op, "pipeline": f"{pipeline}_f"}).execute({})
    result = BinlogCaptureOperator(**op, on_drop="stop").execute({})
    kept = topic_records(stack, f"{pipeline}.{stack.DB_NAME}.{keep}")
    ended = topic_records(stack, f"{pipeline}.{stack.DB_NAME}.{gone}")
    assert [(r["op"], r["pk"]["id"]) for r in kept] == [("c", 1), ("c", 2), ("c", 3)]
    assert [(r["op"], r["pk"]["id"]) for r in ended] == [("c", 1), ("c", 2), ("u", 2)]  # up to the DROP, no more
    assert any("no longer followed" in c for c in result["schema_changes"]), result
    config = {"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"}
    ledger = read_committed_offset(config, pipeline, "binlog", DEFAULT_OFFSETS_TOPIC, timeout=30).offset
    assert ledger["tables"] == [f"{stack.DB_NAME}.{keep}"]  # the table is no longer listed as captured
    BinlogCaptureOperator(**{**op, "tables": [keep]}, on_drop="stop").execute({})  # a rerun: nothing captured twice
    assert len(topic_records(stack, f"{pipeline}.{stack.DB_NAME}.{keep}")) == 3
    assert len(topic_records(stack, f"{pipeline}.{stack.DB_NAME}.{gone}")) == 3
    for name in (keep, gone):
        cur.execute(f"DROP TABLE `{name}`")
    conn.close()


def test_continuous_mode_commits_at_the_interval_and_stops_on_kill(stack, airflow_connections):
    table = unique_name("cap_cont")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v INT)")
    start = _binlog_end(cur)
    op = BinlogCaptureOperator(
        task_id="capture",
        tables=[table],
        pipeline=unique_name("cap_cont"),
        start_position=start,
        mode="continuous",
        max_runtime=60,
        commit_interval_ms=200,
    )
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(op.execute({})))
    runner.start()
    topic = f"{op.pipeline}.{stack.DB_NAME}.{table}"
    for i in range(30):
        cur.execute(f"INSERT INTO `{table}` VALUES (%s, %s)", (i, i))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(_safe_records(stack, topic)) < 30:
        time.sleep(0.5)  # committed while the task still runs
    assert runner.is_alive()
    op.on_kill()
    runner.join(30)
    assert not runner.is_alive()
    assert result["rows"] == 30 and result["kafka_transactions"] >= 1
    assert sorted(r["pk"]["id"] for r in topic_records(stack, topic)) == list(range(30))
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()


def _safe_records(stack, topic):
    try:
        return topic_records(stack, topic)
    except Exception:  # noqa: BLE001 - the topic may not exist yet
        return []
