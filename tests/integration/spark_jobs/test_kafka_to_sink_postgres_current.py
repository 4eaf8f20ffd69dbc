"""The PostgreSQL current table refuses what PostgreSQL cannot store, naming it, and commits nothing of it.

Its other behaviour (every type, schema changes, reconciliation, SIGKILLs) is tested with the Delta current table
it mirrors: test_kafka_to_sink_current.py, test_kafka_to_sink_schema_change.py, tests/faults/test_schema_change_kill.py.
"""

from __future__ import annotations

from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from tests import spark_job_support as jobs
from tests.mysql_support import connect, unique_name


def test_text_with_a_nul_character_stops_the_batch_naming_its_key(stack, spark, airflow_connections, tmp_path):
    table, pipeline = unique_name("pgnul"), unique_name("pgnul")
    cur = connect(stack).cursor()
    cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, s VARCHAR(10))")
    cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s)", [(i, f"s{i}") for i in range(1, 11)])
    path = str(tmp_path / "current")
    run_full_load(spark, MySqlSourceHook(), FullLoadRequest(schema=stack.DB_NAME, table=table, sink_path=path))
    cur.execute(f"UPDATE `{table}` SET s = 'ok' WHERE id = 1")
    topic = BinlogCaptureOperator(
        task_id="capture", tables=[table], pipeline=pipeline, full_load_paths={table: path}
    ).execute({})["topics"][f"{stack.DB_NAME}.{table}"]
    pg_table = table.lower()
    args = jobs.job_args(
        stack, f"{pipeline}-pg", topic, tmp_path / "checkpoint", "postgres", pg_table, mode="current"
    ) + ["--path", path]
    first = jobs.run_job(stack, args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-4000:]
    offsets = f"eo_stream_offsets WHERE pipeline = '{pipeline}-pg'"
    before = jobs.postgres_rows(stack, offsets, ("next_offset", "batch_id"))
    assert before and jobs.postgres_rows(stack, f"{pg_table} WHERE id = 1", ("s",)) == [("ok",)]

    cur.execute(f"UPDATE `{table}` SET s = 'a\\0b' WHERE id = 7")
    cur.execute(f"UPDATE `{table}` SET s = 'later' WHERE id = 2")
    BinlogCaptureOperator(task_id="capture", tables=[table], pipeline=pipeline, full_load_paths={table: path}).execute(
        {}
    )
    refused = jobs.run_job(stack, args)
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert "Column 's' of 1 row(s) of a batch of changes holds the NUL character" in output, output[-4000:]
    assert "keys [(7,)]" in output
    assert jobs.postgres_rows(stack, offsets, ("next_offset", "batch_id")) == before  # nothing committed
    assert jobs.postgres_rows(stack, f"{pg_table} WHERE id IN (2, 7) ORDER BY id", ("s",)) == [("s2",), ("s7",)]
    cur.execute(f"DROP TABLE `{table}`")
