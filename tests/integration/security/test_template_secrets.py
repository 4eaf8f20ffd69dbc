"""Both templates end to end over the secured endpoints, every secret a unique marker string: no marker anywhere.

One history -> stream run (full load, capture, apply, reconciliation) and one settlement run (watermark extract,
Spark load, reconciliation, report) go through ``airflow dags test`` with connections whose passwords are markers
(a MariaDB user created REQUIRE SSL, a SCRAM user on the SASL_SSL listener, a TLS-only PostgreSQL role). Then
everything the runs produced or showed is searched: the runs' output (task logs, spark-submit and driver output),
the task log files, Spark's event logs, every process's arguments sampled during the runs, and the status page
(HTML and JSON) read through the same connections.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal
from pathlib import Path

import pendulum
import pytest

from tests.mysql_support import connect
from tests.security_support import ProcessArguments, marker_users
from tests.template_support import TemplateDag

pytestmark = pytest.mark.timeout(2400)  # in the default suite: the proof that no secret leaks runs in CI
CONNECTIONS = {"mysql_conn_id": "mysql_leak", "kafka_config_id": "kafka_leak", "postgres_conn_id": "postgres_leak"}


def _tables(stack, tag: str) -> tuple[str, str]:
    cur = connect(stack).cursor()
    orders, payments = f"leak_orders_{tag}", f"leak_payments_{tag}"
    cur.execute(
        f"CREATE TABLE {orders} (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, note VARCHAR(20))"
    )
    cur.executemany(
        f"INSERT INTO {orders} (amount, note) VALUES (%s, %s)", [(Decimal(i) / 4, f"n{i}") for i in range(500)]
    )
    cur.execute(
        f"CREATE TABLE {payments} (id BIGINT AUTO_INCREMENT PRIMARY KEY, currency CHAR(3) NOT NULL, "
        "amount DECIMAL(12,2) NOT NULL, updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) "
        "ON UPDATE CURRENT_TIMESTAMP(6), KEY (updated_at))"
    )
    cur.executemany(
        f"INSERT INTO {payments} (currency, amount, updated_at) VALUES (%s, %s, %s)",
        [
            (("EUR", "USD")[i % 2], Decimal(i) / 8, dt.datetime(2026, 11, 24, 12) + dt.timedelta(seconds=i))
            for i in range(300)
        ],
    )
    return orders, payments


def test_both_templates_over_secured_endpoints_leak_no_secret(stack, airflow_home, monkeypatch, tmp_path):
    tag = uuid.uuid4().hex[:6]
    users = marker_users(stack, "leak_templates")
    secrets = users.pop("secrets")
    for key, value in users.items():
        monkeypatch.setenv(key, value)  # this process (the status page below) reads the same connections
    orders, payments = _tables(stack, tag)
    events = tmp_path / "spark-events"
    events.mkdir()
    # Spark 4 compresses event logs with zstd by default: plain text, or the search below would prove nothing.
    # Two shuffle partitions: the reconcile and the report otherwise run 200 tasks each over a few hundred rows
    # (most of this test's time); the settings and arguments searched below are the same either way.
    spark_conf = {
        **stack.spark_conf(),
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": str(events),
        "spark.eventLog.compress": "false",
        "spark.sql.shuffle.partitions": "2",
    }
    env = {**airflow_home, **users}
    history_kwargs = {
        "dag_id": f"leak_hs_{tag}",
        "schema": stack.DB_NAME,
        "table": orders,
        "pipeline": f"leak-hs-{tag}",
        "table_path": str(tmp_path / "orders"),
        "checkpoint_location": str(tmp_path / "hs-checkpoint"),
        "start_date": "2026-01-01T00:00:00+00:00",
        "chunk_rows": 200,
        "spark_conf": spark_conf,
        "retries": 0,
        **CONNECTIONS,
    }
    settlement_kwargs = {
        "dag_id": f"leak_settle_{tag}",
        "table": payments,
        "cursor_column": "updated_at",
        "group_by": ["currency"],
        "sum_columns": ["amount"],
        "pipeline": f"leak-settle-{tag}",
        "topic": f"leak-settle-{tag}-windows",
        "sink_path": str(tmp_path / "windows"),
        "checkpoint_location": str(tmp_path / "settle-checkpoint"),
        "report_table": f"leak_report_{tag}",
        "start_date": "2026-11-01T00:00:00+00:00",
        "safety_lag": 1,
        "spark_conf": spark_conf,
        "retries": 0,
        **CONNECTIONS,
    }
    history = TemplateDag(
        env,
        tmp_path / "dags-hs",
        history_kwargs["dag_id"],
        "exactly_once_provider.templates.history_stream.history_stream_dag",
        history_kwargs,
    )
    settlement = TemplateDag(
        env,
        tmp_path / "dags-settle",
        settlement_kwargs["dag_id"],
        "exactly_once_provider.templates.settlement.settlement_dag",
        settlement_kwargs,
    )
    sampler = ProcessArguments()
    sampler.start()
    try:
        history_out = history.test()
        settlement_out = settlement.test("2026-11-25T02:00:00+00:00")
    finally:
        sampler.stop.set()
        sampler.join(10)
    assert "rows as Delta version" in history_out and "CLEAN" in history_out, history_out[-4000:]
    assert "CLEAN" in settlement_out, settlement_out[-4000:]

    from exactly_once_provider.plugins.app import _to_json
    from exactly_once_provider.plugins.page import render_page
    from exactly_once_provider.plugins.status import read_overview
    from exactly_once_provider.templates.history_stream import history_stream_dag
    from exactly_once_provider.templates.settlement import settlement_dag

    dags = [
        history_stream_dag(**{**history_kwargs, "start_date": pendulum.parse(history_kwargs["start_date"])}),
        settlement_dag(**{**settlement_kwargs, "start_date": pendulum.parse(settlement_kwargs["start_date"])}),
    ]
    overview = read_overview(dags)
    page, page_json = render_page(overview), json.dumps(_to_json(overview), default=str)
    shown = {p["name"] for p in json.loads(page_json)["pipelines"]}
    assert {f"leak-hs-{tag}", f"leak-hs-{tag}-apply", f"leak-settle-{tag}"} <= shown, shown
    assert json.loads(page_json)["errors"] == [], page_json[:2000]

    event_logs = "".join(p.read_text(errors="replace") for p in events.rglob("*") if p.is_file())
    assert event_logs.count("SparkListenerApplicationStart") >= 4, "too few Spark event logs: the check proves little"
    task_logs = "".join(p.read_text(errors="replace") for p in Path(airflow_home["AIRFLOW_HOME"]).rglob("*.log"))
    places = {
        "history run output": history_out,
        "settlement run output": settlement_out,
        "task log files": task_logs,
        "Spark event logs": event_logs,
        "process arguments": "\n".join(sampler.seen),
        "status page": page,
        "status page JSON": page_json,
    }
    assert sampler.samples > 50 and any("spark-submit" in a or "SparkSubmit" in a for a in sampler.seen)
    leaks = [(kind, place) for kind, secret in secrets.items() for place, text in places.items() if secret in text]
    assert not leaks, f"secrets found: {leaks}"
