"""ALTER TABLE mid-stream into the current table (issue 25): followed statements (ADD COLUMN nullable / with a
DEFAULT / in any position, a widening MODIFY, DROP COLUMN, RENAME COLUMN) land typed, with the values the server
gave the existing rows; refused ones stop the table with their statement, position and fix. Widenings to a wider
loaded type (issue 44: the key INT -> BIGINT, DECIMAL(8,2) -> DECIMAL(12,2), FLOAT -> DOUBLE, INT UNSIGNED ->
BIGINT UNSIGNED) are followed without a reload, values past the old ranges written right after them.

A writer thread keeps changing other rows while the statements run. The Spark driver is killed once right
before the commit that changes the table's schema (the key's widening with an added column: the Delta table
rewritten in the wider types, not yet committed); the rerun commits it once. After it all, the current table
read by Spark and by delta-rs equals the source row by row (defaults of the pre-existing rows included). The
same changes into the PostgreSQL current table (built from the same full load; typed columns added and filled in
the batch's transaction) equal the source too, and the reconciliation of it is clean.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from exactly_once_provider.operators.reconcile import ReconcileOperator
from exactly_once_provider.sinks import delta_commit
from exactly_once_provider.sinks.current_table import CURRENT_ROWS, DELETED_COLUMN
from tests import spark_job_support as jobs
from tests.mysql_support import assert_same_rows, connect, normalise, source_rows, unique_name

ROWS = 300
# the source's columns after the statements (v dropped, d renamed)
COLUMNS = ["id", "n", "c", "s", "amount", "e", "f", "u"]
BIG_ID = 5_000_000_000  # past INT: the key widened to BIGINT
STATEMENTS = [
    "UPDATE {t} SET v = v + 100 WHERE id <= 20",
    "ALTER TABLE {t} MODIFY id BIGINT NOT NULL, ADD COLUMN c INT NOT NULL DEFAULT 7 AFTER id",
    "UPDATE {t} SET c = 8 WHERE id BETWEEN 10 AND 30",
    f"INSERT INTO {{t}} (id, s) VALUES ({BIG_ID}, 'big')",
    "ALTER TABLE {t} ADD COLUMN n VARCHAR(20) NULL FIRST, ADD COLUMN e VARCHAR(5) NOT NULL DEFAULT 'é''x', "
    "ADD INDEX by_s (s)",
    "INSERT INTO {t} (id, s, n) VALUES (2000, 'new', 'named')",
    "ALTER TABLE {t} MODIFY s VARCHAR(40)",
    "UPDATE {t} SET s = 'a string longer than ten' WHERE id IN (40, 41)",
    "ALTER TABLE {t} MODIFY d DECIMAL(12,2), MODIFY f DOUBLE, MODIFY u BIGINT UNSIGNED",
    "UPDATE {t} SET d = 1234567890.12, f = 1e300, u = 18446744073709551615 WHERE id = 80",
    f"UPDATE {{t}} SET s = 'still big', u = 5000000000 WHERE id = {BIG_ID}",
    "ALTER TABLE {t} DROP COLUMN v",
    "ALTER TABLE {t} RENAME COLUMN d TO amount",
    "UPDATE {t} SET amount = 9.99 WHERE id = 70",
    "DELETE FROM {t} WHERE id = 50",
    "UPDATE {t} SET e = 'zz' WHERE id = 60",
]


def _writer(stack, table: str, stop: threading.Event, done: list[int]) -> None:
    """Small transactions on other rows (only columns every statement keeps), until stopped."""
    conn = connect(stack)
    cur = conn.cursor()
    rng = random.Random(25)
    key = 5000
    while not stop.is_set():
        if rng.random() < 0.5:
            cur.execute(f"UPDATE `{table}` SET s = %s WHERE id = %s", (f"w{key}", rng.randint(100, ROWS)))
        else:
            cur.execute(f"INSERT INTO `{table}` (id, s) VALUES (%s, 'ins')", (key,))
        key += 1
        done.append(key)
        time.sleep(0.005)
    conn.close()


def _spark_rows(spark, path: str) -> Counter:
    frame = spark.read.format("delta").load(path)
    assert frame.groupBy("id").count().filter("count > 1").count() == 0, "a key is in the table twice"
    return Counter(tuple(normalise(v) for v in row) for row in frame.filter(CURRENT_ROWS).select(*COLUMNS).collect())


def _delta_rs_rows(path: str) -> Counter:
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table()
    rows = zip(*(table.column(c).to_pylist() for c in [*COLUMNS, DELETED_COLUMN]))
    return Counter(tuple(normalise(v) for v in row[:-1]) for row in rows if not row[-1])


def _postgres_rows(stack, table: str) -> Counter:
    gone = jobs.postgres_rows(stack, f"{table} WHERE v IS NOT NULL OR d IS NOT NULL", ("id",))
    assert not gone, "a dropped column, and a renamed column's old name, read NULL in every row"
    rows = jobs.postgres_rows(stack, f"{table} WHERE NOT {DELETED_COLUMN}", COLUMNS)
    return Counter(tuple(normalise(v) for v in row) for row in rows)


def _setup(stack, spark, tmp_path, table: str) -> str:
    cur = connect(stack).cursor()
    cur.execute(
        f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v INT, s VARCHAR(10), d DECIMAL(8,2), f FLOAT, u INT UNSIGNED)"
    )
    cur.executemany(  # f: FLOATs no double holds as written (i + 0.1): the widened rows keep the stored 32 bits
        f"INSERT INTO `{table}` VALUES (%s, %s, %s, %s, %s, %s)",
        [(i, i * 3, f"s{i}", f"{i}.25", i + 0.1, i * 1000) for i in range(1, ROWS + 1)],
    )
    path = str(tmp_path / "current")
    run_full_load(spark, MySqlSourceHook(), FullLoadRequest(schema=stack.DB_NAME, table=table, sink_path=path))
    return path


def alter_under_writer(stack, cur, table: str, pause: float) -> int:
    """Run :data:`STATEMENTS` on ``table`` while :func:`_writer` changes other rows; return the writer's changes."""
    stop, written = threading.Event(), []
    writer = threading.Thread(target=_writer, args=(stack, table, stop, written))
    writer.start()
    try:
        for statement in STATEMENTS:
            cur.execute(statement.format(t=f"`{table}`"))
            time.sleep(pause)
    finally:
        stop.set()
        writer.join()
    return len(written)


def test_followed_alter_table_kinds_reach_the_current_table_exactly_once(
    stack, spark, airflow_connections, tmp_path, caplog
):
    table, pipeline = unique_name("sch"), unique_name("sch")
    path = _setup(stack, spark, tmp_path, table)
    conn = connect(stack)
    cur = conn.cursor()
    assert alter_under_writer(stack, cur, table, 0.2) > 50, "the writer ran alongside the statements"
    result = BinlogCaptureOperator(
        task_id="capture", tables=[table], pipeline=pipeline, full_load_paths={table: path}
    ).execute({})
    topic = result["topics"][f"{stack.DB_NAME}.{table}"]
    args = jobs.job_args(
        stack, f"{pipeline}-apply", topic, tmp_path / "checkpoint", "delta", path, max_offsets=40, mode="current"
    )
    killed = jobs.run_job(stack, args, {"EO_FAULT_AT": "current_schema_changed", "EO_FAULT_ACTION": "kill-group"})
    assert killed.returncode in (-9, 137), killed.stdout[-3000:] + killed.stderr[-3000:]
    before = spark.read.format("delta").load(path)
    assert "c" not in before.columns, "the schema changed without its batch"
    assert dict(before.dtypes)["id"] == "int", "the key widened without its batch"
    state, _ = jobs.run_in_session(args, caplog)  # the restart, in this process's Spark session
    # A batch is planned without reading its schema records; the one holding a statement is planned again.
    assert "holds a schema change: planned again with it" in killed.stdout + killed.stderr
    assert state["offsets"] == {
        topic: {str(p): o for p, o in jobs.end_offsets(f"{stack.HOST}:{stack.KAFKA_PORT}", topic, 1).items()}
    }

    source = source_rows(stack, table, COLUMNS)
    # the pre-existing rows' defaults, as the source shows; a FLOAT widened to DOUBLE keeps its stored 32 bits
    assert source[(10, None, 8, "s10", "10.25", "é'x", 10.100000381469727, 10000)] == 1
    # values past the old ranges, written right after the widenings
    assert source[(80, None, 7, "s80", "1234567890.12", "é'x", 1e300, 18446744073709551615)] == 1
    assert source[(BIG_ID, None, 7, "still big", None, "é'x", None, 5000000000)] == 1
    widened = dict(spark.read.format("delta").load(path).dtypes)
    assert (widened["id"], widened["amount"], widened["f"], widened["u"]) == (
        "bigint",
        "decimal(12,2)",
        "double",
        "decimal(20,0)",
    )
    assert_same_rows(_spark_rows(spark, path), source, COLUMNS)
    assert_same_rows(_delta_rs_rows(path), source, COLUMNS)  # rewritten, not the typeWidening reader feature
    gone = spark.read.format("delta").load(path).filter("v IS NOT NULL OR d IS NOT NULL").count()
    assert gone == 0, "a dropped column, and a renamed column's old name, read NULL in every row"

    # The PostgreSQL current table of the same changes, built from the same full load.
    pg_table = table.lower()
    pg_args = jobs.job_args(
        stack, f"{pipeline}-pg", topic, tmp_path / "pg-checkpoint", "postgres", pg_table, max_offsets=40, mode="current"
    ) + ["--path", path]
    pg_state, _ = jobs.run_in_session(pg_args, caplog)  # its SIGKILLs: tests/faults/test_schema_change_kill.py
    assert pg_state["offsets"] == state["offsets"]
    assert_same_rows(_postgres_rows(stack, pg_table), source, COLUMNS)
    # The reconciliation reads it as a plain table with tombstones (the source's columns; v and d are not).
    result = ReconcileOperator(
        task_id="reconcile",
        name=f"test-{pg_table}",
        table=table,
        sink="postgres",
        sink_table=pg_table,
        sink_deleted_column=DELETED_COLUMN,
        columns=[c for c in COLUMNS if c != "f"],  # a DOUBLE's text differs between the engines (compared above)
        fail_on_mismatch=False,
    ).execute({})
    assert result["clean"] and result["sink_rows"] == sum(source.values()), result
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()


def test_a_refused_alter_table_stops_the_table_with_its_statement_and_fix(stack, spark, airflow_connections, tmp_path):
    table, pipeline = unique_name("schr"), unique_name("schr")
    path = _setup(stack, spark, tmp_path, table)
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"UPDATE `{table}` SET v = 1 WHERE id = 1")
    result = BinlogCaptureOperator(
        task_id="capture", tables=[table], pipeline=pipeline, full_load_paths={table: path}
    ).execute({})
    topic = result["topics"][f"{stack.DB_NAME}.{table}"]
    args = jobs.job_args(stack, f"{pipeline}-apply", topic, tmp_path / "checkpoint", "delta", path, mode="current")
    first = jobs.run_job(stack, args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-4000:]
    before = delta_commit.newest_version(path)
    pg_table = table.lower()
    pg_args = jobs.job_args(
        stack, f"{pipeline}-pg", topic, tmp_path / "pg-checkpoint", "postgres", pg_table, mode="current"
    ) + ["--path", path]
    first = jobs.run_job(stack, pg_args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-4000:]
    pg_offsets = f"eo_stream_offsets WHERE pipeline = '{pipeline}-pg'"
    pg_before = jobs.postgres_rows(stack, pg_offsets, ("next_offset", "batch_id"))
    assert pg_before, "the PostgreSQL current table committed the change before the statement"

    cur.execute(f"ALTER TABLE `{table}` MODIFY v SMALLINT")  # narrowing: followed by no sink
    cur.execute(f"UPDATE `{table}` SET v = 30000 WHERE id = 2")
    BinlogCaptureOperator(task_id="capture", tables=[table], pipeline=pipeline, full_load_paths={table: path}).execute(
        {}
    )
    refused = jobs.run_job(stack, args)
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert f"'ALTER TABLE `{table}` MODIFY v SMALLINT' at binlog." in output, output[-4000:]
    assert "it narrows column 'v' from int(11) to smallint: values in [-2147483648, 2147483647]" in output
    assert "full_reload=true" in output
    assert delta_commit.newest_version(path) == before, "something after the statement was committed"
    refused = jobs.run_job(stack, pg_args)  # the PostgreSQL current table refuses it the same way
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert f"'ALTER TABLE `{table}` MODIFY v SMALLINT' at binlog." in output and "full_reload=true" in output
    assert jobs.postgres_rows(stack, pg_offsets, ("next_offset", "batch_id")) == pg_before
    assert jobs.postgres_rows(stack, f"{pg_table} WHERE id = 2", ("v",)) == [(6,)]
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()
