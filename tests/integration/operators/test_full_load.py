"""MySqlFullLoadOperator on the real stack: XCom mirrors the positions the Delta commit records."""

from __future__ import annotations

import logging

from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from tests.mysql_support import connect, unique_name


def test_operator_loads_logs_progress_and_returns_the_positions(stack, spark, airflow_connections, tmp_path, caplog, capfd):
    table = unique_name("op_fl")
    conn = connect(stack)
    conn.cursor().execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v INT)")
    conn.cursor().executemany(f"INSERT INTO `{table}` VALUES (%s, %s)", [(i, i) for i in range(1000)])
    sink = str(tmp_path / "sink")
    op = MySqlFullLoadOperator(task_id="load", table=table, sink_path=sink, chunk_rows=300, chunks_per_job=2,
                               spark_conf=stack.spark_conf())
    try:
        with caplog.at_level(logging.INFO):
            result = op.execute({})
    finally:
        conn.cursor().execute(f"DROP TABLE `{table}`")
        conn.close()
    handoff = read_handoff(sink)
    assert result["rows"] == 1000 == spark.read.format("delta").load(sink).count()
    assert result["min_position"] == str(handoff.min_position) and result["load_id"] == handoff.load_id
    assert [c["rows"] for c in result["chunks"]] == [300, 300, 300, 100]
    out, err = capfd.readouterr()
    logged = caplog.text + out + err  # the task logger writes through structlog
    assert "4/4 chunks done, 1000 rows" in logged and "rows/s" in logged
    assert f"published {stack.DB_NAME}.{table}: 1000 rows as Delta version 0" in logged
    assert stack.DB_PASSWORD not in logged
