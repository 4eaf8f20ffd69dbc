"""Incremental reconciliation of a current table (``scope="changed"``) on the real pipeline.

A table is loaded, changed, captured and merged into its current table; a first ``changed`` reconciliation has no
clean one to start from and compares in full. Then more changes flow, and two differences are planted in the
Delta table behind the pipeline's back: one on a key the new changes touched, one on a key nothing touched. The
``changed`` reconciliation names the first and never reads the second (its queries cover only the touched
ranges); the ``full`` one names both.
"""

from __future__ import annotations

import pytest

from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from exactly_once_provider.operators.reconcile import ReconcileOperator
from exactly_once_provider.sinks.current_table import DELETED_COLUMN
from tests import spark_job_support as jobs
from tests.mysql_support import connect, unique_name

ROWS = 3000


def _flow(stack, table: str, pipeline: str, path: str, checkpoint) -> str:
    """Capture what changed and merge it into the current table; return the topic."""
    result = BinlogCaptureOperator(
        task_id="capture", tables=[table], pipeline=pipeline, full_load_paths={table: path}
    ).execute({})
    topic = result["topics"][f"{stack.DB_NAME}.{table}"]
    applied = jobs.run_job(
        stack, jobs.job_args(stack, f"{pipeline}-apply", topic, checkpoint, "delta", path, mode="current")
    )
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    return topic


def _reconcile(stack, table: str, pipeline: str, path: str, topic: str, scope: str) -> dict:
    """Reconcile the current table as the template does (the key: the table's primary key, whatever its shape)."""
    return ReconcileOperator(
        task_id="reconcile",
        name=pipeline,
        table=table,
        sink="delta",
        sink_path=path,
        sink_deleted_column=DELETED_COLUMN,
        capture_pipeline=pipeline,
        topics=[topic],
        sink_pipeline=f"{pipeline}-apply",
        full_load_path=path,
        scope=scope,
        fail_on_mismatch=False,
        spark_conf=jobs.task_spark_conf(stack),
    ).execute({})


def test_changed_scope_checks_only_touched_keys_and_full_checks_all(stack, spark, airflow_connections, tmp_path):
    table, pipeline = unique_name("recch"), unique_name("recch")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v INT NOT NULL, note VARCHAR(10))")
    cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s, 'n')", [(i, i) for i in range(1, ROWS + 1)])
    path, checkpoint = str(tmp_path / "current"), tmp_path / "checkpoint"
    run_full_load(spark, MySqlSourceHook(), FullLoadRequest(schema=stack.DB_NAME, table=table, sink_path=path))
    cur.execute(f"UPDATE `{table}` SET v = v + 1 WHERE id BETWEEN 10 AND 20")
    topic = _flow(stack, table, pipeline, path, checkpoint)

    def reconcile(scope: str) -> dict:
        return _reconcile(stack, table, pipeline, path, topic, scope)

    first = reconcile("changed")  # nothing clean to start from: the whole table
    assert first["clean"] and first["source_rows"] == ROWS and first["position"]["scope"] == {"kind": "full"}

    cur.execute(f"UPDATE `{table}` SET v = v + 1 WHERE id BETWEEN 100 AND 110")
    cur.execute(f"DELETE FROM `{table}` WHERE id = 120")
    cur.execute(f"INSERT INTO `{table}` VALUES ({ROWS + 1}, 0, 'new')")
    _flow(stack, table, pipeline, path, checkpoint)
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, path).update("id IN (105, 2500)", {"note": "'planted'"})  # behind the pipeline

    changed = reconcile("changed")
    assert [(d["key"], d["kind"]) for d in changed["differences"]] == [(105, "changed")], changed
    assert changed["position"]["scope"] == {"kind": "changed", "ranges": 3, "keys_covered": 13}, changed["position"]
    assert changed["full_scans"] == 0, changed  # every query read the touched ranges only
    assert changed["source_rows"] == 12  # 100..110 and the insert; 120 is deleted on both sides

    full = reconcile("full")
    assert [(d["key"], d["kind"]) for d in full["differences"]] == [(105, "changed"), (2500, "changed")], full
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()


def test_changed_scope_of_a_composite_key_table_names_the_touched_key_by_its_text(
    stack, spark, airflow_connections, tmp_path
):
    table, pipeline = unique_name("recck"), unique_name("recck")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE `{table}` (region CHAR(2) NOT NULL, id INT NOT NULL, v INT NOT NULL, PRIMARY KEY (region, id))"
    )
    cur.executemany(
        f"INSERT INTO `{table}` VALUES (%s, %s, %s)",
        [(region, i, i) for region in ("EU", "US") for i in range(1, ROWS // 2 + 1)],
    )
    path, checkpoint = str(tmp_path / "current"), tmp_path / "checkpoint"
    run_full_load(spark, MySqlSourceHook(), FullLoadRequest(schema=stack.DB_NAME, table=table, sink_path=path))
    cur.execute(f"UPDATE `{table}` SET v = v + 1 WHERE id BETWEEN 10 AND 20")
    topic = _flow(stack, table, pipeline, path, checkpoint)

    def reconcile(scope: str) -> dict:
        return _reconcile(stack, table, pipeline, path, topic, scope)

    assert reconcile("changed")["clean"]  # nothing clean to start from: the whole table
    cur.execute(f"UPDATE `{table}` SET v = v + 1 WHERE region = 'US' AND id BETWEEN 100 AND 110")
    cur.execute(f"DELETE FROM `{table}` WHERE region = 'EU' AND id = 120")
    cur.execute(f"INSERT INTO `{table}` VALUES ('CN', 1, 0)")
    _flow(stack, table, pipeline, path, checkpoint)
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, path).update(
        "(region = 'US' AND id = 105) OR (region = 'EU' AND id = 1200)", {"v": "-1"}
    )  # behind the pipeline's back: one touched key, one not
    changed = reconcile("changed")
    assert [(d["label"], d["kind"]) for d in changed["differences"]] == [("US, 105", "changed")], changed
    assert changed["source_rows"] == 12 and changed["position"]["scope"]["kind"] == "changed"  # 11 + the insert
    full = reconcile("full")
    assert sorted((d["label"], d["kind"]) for d in full["differences"]) == [
        ("EU, 1200", "changed"),
        ("US, 105", "changed"),
    ], full
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()


@pytest.mark.timeout(1800)  # four captures and applies, seven reconciliations on a shared machine
def test_an_added_column_is_pending_until_applied_then_compared_over_the_whole_table(
    stack, spark, airflow_connections, tmp_path
):
    table, pipeline = unique_name("recadd"), unique_name("recadd")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v INT NOT NULL, note VARCHAR(10))")
    cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s, 'n')", [(i, i) for i in range(1, ROWS + 1)])
    path, checkpoint = str(tmp_path / "current"), tmp_path / "checkpoint"
    run_full_load(spark, MySqlSourceHook(), FullLoadRequest(schema=stack.DB_NAME, table=table, sink_path=path))
    topic = _flow(stack, table, pipeline, path, checkpoint)

    def reconcile(scope: str, reader: str = "delta-rs") -> dict:
        # delta-rs reads the whole table in the task too: one Spark application less per reconciliation
        return ReconcileOperator(
            task_id="reconcile",
            name=pipeline,
            table=table,
            sink="delta",
            sink_path=path,
            sink_deleted_column=DELETED_COLUMN,
            capture_pipeline=pipeline,
            topics=[topic],
            sink_pipeline=f"{pipeline}-apply",
            full_load_path=path,
            scope=scope,
            fail_on_mismatch=False,
            delta_reader=reader,
            spark_conf=jobs.task_spark_conf(stack),
        ).execute({})

    assert reconcile("changed")["clean"]
    # The source has the column; the capture has not read the statement yet, so the sink does not have it.
    cur.execute(f"ALTER TABLE `{table}` ADD COLUMN c INT NOT NULL DEFAULT 7")
    cur.execute(f"UPDATE `{table}` SET v = v + 1, c = 8 WHERE id = 30")
    for scope, reader in (("full", "spark"), ("changed", "delta-rs")):  # both readers of the sink
        pending = reconcile(scope, reader)
        assert pending["pending_columns"] == ["c"] and pending["source_rows"] >= 1, pending
        assert [d["kind"] for d in pending["differences"] if d["kind"] != "in_flight"] == [], pending
        assert "sink_offsets" not in pending["position"] and pending["position"]["pending_columns"] == ["c"]
    _flow(stack, table, pipeline, path, checkpoint)  # the statement and the update reach the current table
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, path).update("id = 2500", {"c": "9"})  # a wrong fill, behind the pipeline's back
    after = reconcile("changed")  # the pending one is no base for a changed scope: the whole table
    assert after["pending_columns"] == [] and after["position"]["scope"] == {"kind": "full"}, after
    assert [(d["key"], d["kind"]) for d in after["differences"]] == [(2500, "changed")], after
    DeltaTable.forPath(spark, path).update("id = 2500", {"c": "7"})
    assert reconcile("full")["clean"]  # a clean base with sink offsets again

    # An ADD COLUMN applied between two changed reconciliations: its fill rewrote rows no change record names.
    cur.execute(f"ALTER TABLE `{table}` ADD COLUMN d INT NOT NULL DEFAULT 3")
    cur.execute(f"UPDATE `{table}` SET v = v + 1 WHERE id = 40")
    _flow(stack, table, pipeline, path, checkpoint)
    DeltaTable.forPath(spark, path).update("id = 2600", {"d": "4"})
    changed = reconcile("changed")
    assert changed["position"]["scope"] == {"kind": "full"}, changed["position"]
    assert [(d["key"], d["kind"]) for d in changed["differences"]] == [(2600, "changed")], changed
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()
