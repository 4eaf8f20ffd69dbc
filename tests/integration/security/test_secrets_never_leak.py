"""One pipeline end to end over the secured endpoints with secrets that are unique marker strings.

MariaDB (a user created REQUIRE SSL; the binlog is read over TLS) -> binlog capture -> Kafka (SASL_SSL, a SCRAM
user with its own ACLs) -> the Spark job -> PostgreSQL (a role that may only use TLS). Every secret of the three
connections is a marker; afterwards every log the run produced (the operators' task log, everything written to
stdout/stderr including spark-submit's and the driver's output, Spark's event log) and the process arguments
sampled while it ran, and the status page (HTML and JSON) reading the same pipelines through the same connections
are searched for the markers: none may appear. The sink is checked row by row against the
source, read by the test's own clients.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from typing import Any

import psycopg2

from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from tests.mysql_support import connect, unique_name
from tests.security_support import ProcessArguments, marker_users


def _status_page(table: str, pipeline: str, topic: str, sink_table: str, tmp_path) -> tuple[str, str, Any]:
    """Render the status page (HTML and its JSON) of a DAG declaring the run's capture and apply."""
    import pendulum
    from airflow.sdk import DAG

    from exactly_once_provider.plugins.app import _to_json
    from exactly_once_provider.plugins.page import render_page
    from exactly_once_provider.plugins.status import read_overview

    with DAG(f"leak_{pipeline}".replace("-", "_"), schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        BinlogCaptureOperator(
            task_id="capture",
            tables=[table],
            pipeline=pipeline,
            mysql_conn_id="mysql_leak",
            kafka_config_id="kafka_leak",
        )
        SparkKafkaToSinkOperator(
            task_id="apply",
            pipeline=f"{pipeline}-apply",
            topics=[topic],
            sink="postgres",
            sink_table=sink_table,
            mode="cdc",
            checkpoint_location=str(tmp_path / "checkpoint"),
            kafka_conn_id="kafka_leak",
            postgres_conn_id="postgres_leak",
        )
    overview = read_overview([dag])
    flow = next((f for f in overview.flows if f.has(f"{pipeline}-apply")), None)
    return render_page(overview), json.dumps(_to_json(overview), default=str), flow


def test_secured_pipeline_delivers_exactly_and_no_secret_reaches_a_log_or_a_command_line(
    stack, airflow_connections, monkeypatch, tmp_path, caplog, capfd
):
    tag = uuid.uuid4().hex[:8]
    users = marker_users(stack, "leak_op")
    secrets = users.pop("secrets")
    for key, value in users.items():
        monkeypatch.setenv(key, value)
    table, pipeline = unique_name("sec_orders"), f"sec-{tag}"
    cur = connect(stack).cursor()
    cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, note VARCHAR(40))")
    cur.execute("SHOW MASTER STATUS")
    start = "{}:{}".format(*cur.fetchone()[:2])
    for batch in range(5):  # five source transactions
        cur.execute("BEGIN")
        cur.executemany(
            f"INSERT INTO `{table}` VALUES (%s, %s, %s)",
            [(batch * 100 + i, f"{batch}.{i:02d}", f"n{batch}-{i}") for i in range(100)],
        )
        cur.execute("COMMIT")
    cur.execute(f"UPDATE `{table}` SET note = 'changed' WHERE id < 50")
    cur.execute(f"DELETE FROM `{table}` WHERE id >= 450")
    sink_table = f"sec_sink_{tag}"
    events = tmp_path / "spark-events"
    events.mkdir()

    sampler = ProcessArguments()
    sampler.start()
    try:
        with caplog.at_level(logging.DEBUG):
            captured = BinlogCaptureOperator(
                task_id="capture",
                tables=[table],
                pipeline=pipeline,
                start_position=start,
                mysql_conn_id="mysql_leak",
                kafka_config_id="kafka_leak",
            ).execute({})
            topic = captured["topics"][f"{stack.DB_NAME}.{table}"]
            state = SparkKafkaToSinkOperator(
                task_id="apply",
                pipeline=f"{pipeline}-apply",
                topics=[topic],
                sink="postgres",
                sink_table=sink_table,
                mode="cdc",
                checkpoint_location=str(tmp_path / "checkpoint"),
                kafka_conn_id="kafka_leak",
                postgres_conn_id="postgres_leak",
                env_vars={"PYSPARK_PYTHON": sys.executable},
                conf={
                    "spark.jars": stack.spark_conf()["spark.jars"],
                    "spark.ui.enabled": "false",
                    "spark.eventLog.enabled": "true",
                    "spark.eventLog.dir": str(events),
                    # Spark 4 compresses event logs with zstd by default: searching those bytes proves nothing
                    "spark.eventLog.compress": "false",
                },
            ).execute({})
    finally:
        sampler.stop.set()
        sampler.join(10)
    # The status page reads the same pipelines through the same connections (ledger, lag, sink commits).
    with caplog.at_level(logging.DEBUG):
        page, page_json, flow = _status_page(table, pipeline, topic, sink_table, tmp_path)
    output = capfd.readouterr()
    assert flow is not None and flow.lag == 0, "the status page did not read the pipeline: the check proves nothing"
    assert f"{pipeline}-apply" in page and json.loads(page_json)["errors"] == [], page_json[:2000]

    # Exactly once, read by the test's own clients: the sink's current rows equal the source table.
    assert captured["rows"] == 500 + 50 + 50 and captured["transactions"] == 7
    cur.execute(f"SELECT id, amount, note FROM `{table}` ORDER BY id")
    source = [(i, str(amount), note) for i, amount, note in cur.fetchall()]
    pg = psycopg2.connect(
        host=str(stack.HOME / "postgres"), port=stack.POSTGRES_PORT, user="postgres", dbname=stack.DB_NAME
    )
    with pg.cursor() as pcur:
        pcur.execute(f"SELECT record_value FROM eo_leak_op.{sink_table}")
        values = [json.loads(value) for (value,) in pcur.fetchall()]
    pg.close()
    live = sorted((v["after"]["id"], v["after"]["amount"], v["after"]["note"]) for v in values if v["op"] != "d")
    assert live == source and len(source) == 450
    assert state["rows_total"] == len(values)

    # No secret anywhere the run wrote or showed.
    event_logs = "".join(path.read_text(errors="replace") for path in events.rglob("*") if path.is_file())
    assert "SparkListenerEnvironmentUpdate" in event_logs, "no readable Spark event log: the check would prove nothing"
    places = {
        "task log": caplog.text,
        "stdout": output.out,
        "stderr": output.err,
        "Spark event log": event_logs,
        "process arguments": "\n".join(sampler.seen),
        "status page": page,
        "status page JSON": page_json,
    }
    assert sampler.samples > 20 and any("spark" in args.lower() for args in sampler.seen), "sampling missed the run"
    leaks = [(kind, place) for kind, secret in secrets.items() for place, text in places.items() if secret in text]
    assert not leaks, f"secrets found: {leaks}"
