"""MySqlFullLoadOperator on the real stack: XCom mirrors the positions the Delta commit records."""

from __future__ import annotations

import json
import logging
import os
import re
import urllib.request
import uuid
from decimal import Decimal

import pytest

from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from tests import spark_job_support as jobs
from tests.mysql_support import connect, unique_name


def test_operator_loads_logs_progress_and_returns_the_positions(
    stack, spark, airflow_connections, tmp_path, caplog, capfd
):
    table = unique_name("op_fl")
    conn = connect(stack)
    conn.cursor().execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v INT)")
    conn.cursor().executemany(f"INSERT INTO `{table}` VALUES (%s, %s)", [(i, i) for i in range(1000)])
    sink = str(tmp_path / "sink")
    op = MySqlFullLoadOperator(
        task_id="load", table=table, sink_path=sink, chunk_rows=300, chunks_per_job=2, spark_conf=stack.spark_conf()
    )
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


@pytest.mark.slow
def test_cluster_deploy_mode_runs_the_driver_on_the_standalone_worker(stack, spark, airflow_connections, tmp_path):
    stack.start_spark_cluster()
    table = unique_name("op_fl_cluster")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v INT, s VARCHAR(20), d DECIMAL(12, 2))")
    rows = [(i, i * 7 % 101, f"s{i}" if i % 5 else None, Decimal(i) / 4) for i in range(1, 1001)]
    cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s, %s, %s)", rows)
    sink = str(tmp_path / "sink")
    # spark_standalone's Extra says deploy-mode cluster: the driver is submitted to the master, runs on the worker.
    op = MySqlFullLoadOperator(
        task_id="load",
        table=table,
        sink_path=sink,
        chunk_rows=300,
        chunks_per_job=2,
        spark_conn_id="spark_standalone",
        spark_conf={
            "spark.jars": stack.spark_conf()["spark.jars"],
            "spark.ui.enabled": "false",
            "spark.executor.memory": "512m",
            "spark.cores.max": "1",
        },
    )
    try:
        result = op.execute({})
    finally:
        cur.execute(f"DROP TABLE `{table}`")
        conn.close()
    loaded = sorted(tuple(r) for r in spark.read.format("delta").load(sink).select("id", "v", "s", "d").collect())
    assert loaded == rows
    assert result["rows"] == 1000 and [c["rows"] for c in result["chunks"]] == [300, 300, 300, 100]
    assert result["load_id"] == read_handoff(sink).load_id
    # The driver ran on the worker, in its work directory for this driver id, not in this (the task's) process.
    driver = op.driver_id
    assert re.fullmatch(r"driver-\d+-\d+", driver or ""), driver
    assert _driver_state(stack, driver) == "FINISHED"
    work = stack.HOME / "spark" / "work" / driver
    assert op.driver_started["cwd"] == str(work) and op.driver_started["pid"] != os.getpid()
    logs = (work / "stderr").read_text() + (work / "stdout").read_text()
    assert "org.apache.spark.deploy.PythonRunner" in logs and "4/4 chunks done, 1000 rows" in logs
    assert stack.DB_PASSWORD not in logs


def _driver_state(stack, driver: str) -> str:
    url = f"http://{stack.HOST}:{stack.SPARK_MASTER_REST_PORT}/v1/submissions/status/{driver}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)["driverState"]


def test_operator_with_its_sink_on_minio_stages_next_to_it_and_no_credential_reaches_a_log(
    stack, airflow_connections, caplog, capfd, monkeypatch
):
    """The default staging next to a sink on S3: the driver gets the ``aws_default`` settings from its secrets
    file, the executors inside the pickled task; delta-rs reads the table back equal to the source, once."""
    from deltalake import DeltaTable

    from exactly_once_provider.storage import open_storage
    from exactly_once_provider.storage import s3 as s3_module

    monkeypatch.setattr(s3_module, "_registered", None)  # the operator registers its own for the task's process
    table = unique_name("op_fl_s3")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v INT, s VARCHAR(20))")
    rows = [(i, i * 7 % 101, f"s{i}" if i % 5 else None) for i in range(1, 1001)]
    cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s, %s)", rows)
    prefix = f"s3://{stack.MINIO_BUCKETS[0]}/it-op-full-load/{uuid.uuid4().hex[:12]}"
    sink = f"{prefix}/orders"
    op = MySqlFullLoadOperator(
        task_id="load",
        table=table,
        sink_path=sink,
        chunk_rows=300,
        chunks_per_job=2,
        spark_conf={**stack.spark_conf(s3=True), **jobs.s3_driver_conf(stack)},
    )
    try:
        with caplog.at_level(logging.INFO):
            result = op.execute({})
        s3 = stack.minio_settings()
        staged = open_storage(f"{sink}._eo_full_load", s3).list("data/")
        loaded = (
            DeltaTable(sink, storage_options=s3.delta_rs_options())
            .to_pyarrow_table(columns=["id", "v", "s"])
            .to_pylist()
        )
    finally:
        cur.execute(f"DROP TABLE `{table}`")
        conn.close()
        open_storage(prefix, stack.minio_settings()).delete_prefix("")
    assert len(staged) == 4 and all(key.endswith(".parquet") for key in staged)  # the executors wrote them there
    assert sorted((r["id"], r["v"], r["s"]) for r in loaded) == rows  # every row once
    assert result["rows"] == 1000 and [c["rows"] for c in result["chunks"]] == [300, 300, 300, 100]
    out, err = capfd.readouterr()
    logged = caplog.text + out + err
    assert "4/4 chunks done, 1000 rows" in logged
    assert stack.MINIO_SECRET_KEY not in logged and stack.DB_PASSWORD not in logged
