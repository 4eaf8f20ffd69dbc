"""SIGKILL the current table's apply at each step of a schema change, per sink: the restart ends in the source.

The source takes the ALTER TABLE statements of the schema-change test (added columns with defaults, a widening,
a drop, a rename) while a writer changes other rows; the capture delivers them; the apply is killed

* ``current_schema_changed``: the batch that follows a statement has changed the table's schema (Delta: the
  MERGE's new ``metaData`` about to be committed; PostgreSQL: ``ALTER TABLE`` and the fills run in the batch's
  open transaction), its rows and offsets not committed;
* ``postgres_current_built``: the PostgreSQL current table was built from the full load, not committed.

The run after the kill finishes; the current table must then equal the source row by row (defaults of the
pre-existing rows included): 0 lost, 0 duplicated.
"""

from __future__ import annotations

import pytest

from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from tests import spark_job_support as jobs
from tests.fault_support import check
from tests.integration.spark_jobs.test_kafka_to_sink_schema_change import (
    COLUMNS,
    _delta_rs_rows,
    _postgres_rows,
    _setup,
    alter_under_writer,
)
from tests.mysql_support import connect, source_rows, unique_name

pytestmark = pytest.mark.slow


def _postgres_columns(stack, table: str) -> set[str] | None:
    """The columns of a PostgreSQL table (None: no such table)."""
    found = jobs.postgres_rows(stack, "information_schema.columns", ("column_name", "table_name"))
    held = {c for c, t in found if t == table}
    return held or None


@pytest.mark.parametrize(
    "sink,step",
    [
        ("postgres", "current_schema_changed"),
        pytest.param("postgres", "postgres_current_built", marks=pytest.mark.matrix),
        pytest.param("delta", "current_schema_changed", marks=pytest.mark.matrix),
    ],
)
def test_apply_killed_at_a_schema_change_step_recovers_exactly(
    stack, spark, airflow_connections, tmp_path, caplog, sink, step, fault_outcome
):
    table, pipeline = unique_name("sck"), unique_name("sck")
    path = _setup(stack, spark, tmp_path, table)
    conn = connect(stack)
    cur = conn.cursor()
    assert alter_under_writer(stack, cur, table, 0.1) > 0, "the writer ran alongside the statements"
    topic = BinlogCaptureOperator(
        task_id="capture", tables=[table], pipeline=pipeline, full_load_paths={table: path}
    ).execute({})["topics"][f"{stack.DB_NAME}.{table}"]
    pg_table = table.lower()
    args = jobs.job_args(
        stack,
        f"{pipeline}-apply",
        topic,
        tmp_path / "checkpoint",
        sink,
        pg_table if sink == "postgres" else path,
        max_offsets=40,
        mode="current",
    )
    args += ["--path", path] if sink == "postgres" else []

    killed = jobs.run_job(stack, args, {"EO_FAULT_AT": step, "EO_FAULT_ACTION": "kill-group"})
    assert killed.returncode in (-9, 137), killed.stdout[-3000:] + killed.stderr[-3000:]
    if sink == "postgres":
        held = _postgres_columns(stack, pg_table)
        assert held is None if step == "postgres_current_built" else (held and "c" not in held), held
    state, _ = jobs.run_in_session(args, caplog)  # the restart, in this process's Spark session
    assert state["offsets"] == {
        topic: {str(p): o for p, o in jobs.end_offsets(f"{stack.HOST}:{stack.KAFKA_PORT}", topic, 1).items()}
    }

    source = source_rows(stack, table, COLUMNS)
    got = _postgres_rows(stack, pg_table) if sink == "postgres" else _delta_rs_rows(path)
    check(fault_outcome, list(source.elements()), list(got.elements()), "current rows")
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()
