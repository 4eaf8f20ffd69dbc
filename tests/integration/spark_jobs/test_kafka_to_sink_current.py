"""The current table: the full load's Delta table with the binlog capture's changes merged in (``mode="current"``).

Every column type the full load maps travels through a change record and lands typed exactly as the full load
loaded it; updates, deletes (tombstones), inserts, a key change and a delete-then-reinsert of one key apply; a
driver killed between the sink commit and the checkpoint commit changes nothing; after it all,
``WHERE NOT _eo_deleted`` equals the source row by row and every key is in the table once. The same changes
into the PostgreSQL current table (built from the same full load, typed) equal the source too. The current table and
the job's checkpoint are on the stack's MinIO (the full load stages locally): the local-disk current table is
proven by the several-tables, schema-change and fault tests, so a local variant of this one only cost CI 100 s.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest

from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from exactly_once_provider.sinks import delta_commit
from exactly_once_provider.sinks.current_table import CURRENT_ROWS, DELETED_COLUMN, VERSION_COLUMN, snapshot_version
from tests import spark_job_support as jobs
from tests.mysql_support import (
    ALL_TYPES,
    ALL_TYPES_COLUMNS,
    all_types_rows,
    assert_same_rows,
    connect,
    normalise,
    source_rows,
    unique_name,
)

ROWS = 400


def _current_rows(spark, path: str):
    frame = spark.read.format("delta").load(path)
    keys = frame.groupBy("id").count().filter("count > 1").count()
    assert keys == 0, f"{keys} keys are in the current table more than once"
    from collections import Counter

    return Counter(
        tuple(normalise(v) for v in row) for row in frame.filter(CURRENT_ROWS).select(*ALL_TYPES_COLUMNS).collect()
    )


def _change_the_source(cur, table: str) -> None:
    t = f"`{table}`"
    cur.execute(
        f"UPDATE {t} SET d = d + 1, dt = '2025-01-01 10:00:00.000001', ts = '2025-06-30 23:59:59.999999', "
        f"s = CONCAT('changed ', id, ' 😀'), j = '{{\"changed\": true}}', b = x'00ff00', f = 1.25, "
        f"db = -2.5e-300, bt = b'10101010', u = 18446744073709551615, t = '-838:59:59' WHERE id <= 50"
    )
    cur.execute(f"DELETE FROM {t} WHERE id BETWEEN 51 AND 80")
    cur.executemany(
        f"INSERT INTO {t} VALUES (" + ", ".join(["%s"] * 20) + ")",
        [(5000 + row[0],) + row[1:] for row in all_types_rows(40)[:40]],
    )
    cur.execute(f"UPDATE {t} SET id = 9000 WHERE id = 100")  # a key change: a delete and a create
    cur.execute(f"UPDATE {t} SET d = NULL, big_d = NULL, dt = NULL, j = NULL, tx = NULL WHERE id = 101")
    cur.execute(f"DELETE FROM {t} WHERE id = 102")
    cur.execute(f"INSERT INTO {t} (id, s) VALUES (102, 'back again')")
    cur.execute(f"DELETE FROM {t} WHERE id = {ROWS + 1}")  # the all-NULL row
    for i in range(103, 160):  # many small transactions: several micro-batches
        cur.execute(f"UPDATE {t} SET ti = ti DIV 2, vb = x'{i:04x}' WHERE id = {i}")


@pytest.fixture
def location(stack):
    """``(table path, checkpoint, S3 settings)`` on MinIO (the settings registered for this process, as a Spark
    driver registers those of its secrets file, so the test's own reads reach the bucket)."""
    from exactly_once_provider.storage import open_storage
    from exactly_once_provider.storage.s3 import register_settings, registered_settings

    s3, before = stack.minio_settings(), registered_settings()
    register_settings(s3)
    prefix = f"s3a://{stack.MINIO_BUCKETS[0]}/it-current/{uuid.uuid4().hex}"
    yield f"{prefix}/current", f"{prefix}/checkpoint", s3
    open_storage(prefix, s3).delete_prefix("")
    register_settings(before)


def test_changes_merge_into_the_full_load_table_typed_once_per_key(
    stack, spark, airflow_connections, tmp_path, caplog, location
):
    table, pipeline = unique_name("cur"), unique_name("cur")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` {ALL_TYPES}")
    cur.executemany(f"INSERT INTO `{table}` VALUES (" + ", ".join(["%s"] * 20) + ")", all_types_rows(ROWS))
    path, checkpoint, s3 = location
    handoff = run_full_load(
        spark,
        MySqlSourceHook(),
        FullLoadRequest(
            schema=stack.DB_NAME,
            table=table,
            sink_path=path,
            chunk_rows=150,
            staging_path=str(tmp_path / "staging"),
        ),
    ).handoff
    loaded = spark.read.format("delta").load(path)
    assert loaded.filter(f"{DELETED_COLUMN} OR {VERSION_COLUMN} IS NULL").count() == 0
    versions = {r[0] for r in loaded.select(VERSION_COLUMN).distinct().collect()}
    assert versions == {snapshot_version(c.position) for c in handoff.chunks}, "rows carry their chunk's snapshot"

    _change_the_source(cur, table)
    result = BinlogCaptureOperator(
        task_id="capture", tables=[table], pipeline=pipeline, full_load_paths={table: path}
    ).execute({})
    topic = result["topics"][f"{stack.DB_NAME}.{table}"]
    args = jobs.job_args(
        stack,
        f"{pipeline}-apply",
        topic,
        checkpoint,
        "delta",
        path,
        max_offsets=60,
        mode="current",
        s3=s3.to_json(),
    )
    killed = jobs.run_job(stack, args, jobs.kill_driver_at("after_sink_commit", 1))
    assert killed.returncode in (-9, 137), killed.stdout[-3000:]
    state, logged = jobs.run_in_session(args, caplog)  # the restart, in this process's Spark session
    assert "batch 1 already committed" in logged, logged[-3000:]
    assert state["offsets"] == {
        topic: {str(p): o for p, o in jobs.end_offsets(f"{stack.HOST}:{stack.KAFKA_PORT}", topic, 1).items()}
    }

    assert_same_rows(_current_rows(spark, path), source_rows(stack, table, ALL_TYPES_COLUMNS), ALL_TYPES_COLUMNS)
    newest = delta_commit.read_commit(path, delta_commit.newest_version(path))
    marker = json.loads(newest["commitInfo"]["userMetadata"])[f"eo_stream:{pipeline}-apply"]
    assert marker["full_load"]["load_id"] == handoff.load_id  # the pointer readers follow instead of the log
    assert read_handoff(path) == handoff
    tombstones = {r["id"] for r in spark.read.format("delta").load(path).filter(DELETED_COLUMN).collect()}
    assert tombstones == set(range(51, 81)) | {100, ROWS + 1}

    # The PostgreSQL current table: every type, built from the same full load, the driver killed once.
    pg_table = table.lower()
    pg_checkpoint = f"{checkpoint}-pg"
    pg_args = jobs.job_args(
        stack,
        f"{pipeline}-pg",
        topic,
        pg_checkpoint,
        "postgres",
        pg_table,
        max_offsets=60,
        mode="current",
        s3=s3.to_json(),
    ) + ["--path", path]
    killed = jobs.run_job(stack, pg_args, jobs.kill_driver_at("after_sink_commit", 1))
    assert killed.returncode in (-9, 137), killed.stdout[-3000:]
    pg_state, logged = jobs.run_in_session(pg_args, caplog)
    assert "batch 1 already committed" in logged, logged[-3000:]
    assert pg_state["offsets"] == state["offsets"]
    rows = jobs.postgres_rows(stack, f"{pg_table} WHERE NOT {DELETED_COLUMN}", ALL_TYPES_COLUMNS)
    assert_same_rows(
        Counter(tuple(normalise(v) for v in row) for row in rows),
        source_rows(stack, table, ALL_TYPES_COLUMNS),
        ALL_TYPES_COLUMNS,
    )
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()


def test_a_change_of_another_table_is_refused_before_anything_is_committed(stack, spark, airflow_connections, tmp_path):
    tables, pipeline = [unique_name("cur_a"), unique_name("cur_b")], unique_name("cur")
    conn = connect(stack)
    cur = conn.cursor()
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    for name, path in zip(tables, paths):
        cur.execute(f"CREATE TABLE `{name}` (id INT PRIMARY KEY, v INT)")
        cur.execute(f"INSERT INTO `{name}` VALUES (1, 1), (2, 2)")
        run_full_load(spark, MySqlSourceHook(), FullLoadRequest(schema=stack.DB_NAME, table=name, sink_path=path))
    cur.execute(f"UPDATE `{tables[1]}` SET v = 5")
    result = BinlogCaptureOperator(
        task_id="capture", tables=[tables[1]], pipeline=pipeline, full_load_paths={tables[1]: paths[1]}
    ).execute({})
    topic = result["topics"][f"{stack.DB_NAME}.{tables[1]}"]
    before = delta_commit.newest_version(paths[0])
    args = jobs.job_args(stack, f"{pipeline}-apply", topic, tmp_path / "checkpoint", "delta", paths[0], mode="current")
    refused = jobs.run_job(stack, args)
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert f"A change of {stack.DB_NAME}.{tables[1]} (topic {topic}, partition 0, offset" in output, output[-3000:]
    assert f"reached the current table of {stack.DB_NAME}.{tables[0]}" in output
    assert delta_commit.newest_version(paths[0]) == before, "something was committed"
    for name in tables:
        cur.execute(f"DROP TABLE `{name}`")
    conn.close()
