"""The status page reads a Delta sink on S3 (the stack's MinIO) through the ``aws`` connection its task names."""

from __future__ import annotations

import json
import os
import time
import uuid

import pendulum
from airflow.sdk import DAG

from exactly_once_provider.full_load import handoff
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.plugins.status import read_overview
from exactly_once_provider.storage import open_storage
from exactly_once_provider.storage.s3 import S3Settings, register_settings, registered_settings

COMMITS = 5


def test_a_delta_sink_on_s3_is_read_with_its_tasks_aws_connection(stack, airflow_connections, monkeypatch):
    tag = uuid.uuid4().hex[:8]
    conn_id, pipeline, topic = f"aws_status_{tag}", f"status-s3-{tag}", f"status-s3-{tag}"
    table = f"s3://{stack.MINIO_BUCKETS[0]}/status-{tag}/orders"
    good = json.loads(os.environ["AIRFLOW_CONN_AWS_DEFAULT"])
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(good))
    storage = open_storage(table, S3Settings.from_connection(conn_id))
    start = int(time.time() * 1000) - COMMITS * 1000
    chunks = [{"index": 0, "lower": None, "upper": None, "file": "binlog.000003", "pos": 4711, "rows": 10}]
    loaded = handoff.marker(f"load-{tag}", "eo", "orders", ("id",), chunks)
    commits = [loaded] + [  # a full load, then the commits DeltaSink writes: its marker in userMetadata
        {
            f"eo_stream:{pipeline}": {
                "pipeline": pipeline,
                "checkpoint_id": "c",
                "batch_id": batch,
                "offsets": {topic: {"0": 10 * (batch + 1)}},
                "rows_before": 10 * batch,
            }
        }
        for batch in range(COMMITS)
    ]
    for version, marker in enumerate(commits):
        info = {
            "timestamp": start + version * 1000,
            "operation": "WRITE",
            "userMetadata": json.dumps(marker),
            "operationMetrics": {"numOutputRows": "10"},
        }
        assert storage.put_if_absent(f"_delta_log/{version:020d}.json", json.dumps({"commitInfo": info}).encode())
    # The default connection now points nowhere: only the task's own connection can read the bucket.
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({**good, "password": "not-the-secret"}))
    # The API server's process registers no S3 settings of its own; operators that ran earlier in this test
    # worker did register theirs, so clear them for this test and put them back after.
    before = registered_settings()
    register_settings(None)
    try:
        with DAG(f"status_s3_{tag}", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
            SparkKafkaToSinkOperator(
                task_id="apply",
                pipeline=pipeline,
                topics=topic,
                sink="delta",
                sink_path=table,
                checkpoint_location=f"s3://{stack.MINIO_BUCKETS[0]}/status-{tag}/cp",
                aws_conn_id=conn_id,
            )
            MySqlFullLoadOperator(task_id="load", table="orders", sink_path=table, aws_conn_id=conn_id)
        # Another DAG's Kafka connection is broken (a wrong password on the SASL_SSL listener): its card says so,
        # quickly, and the others are read as before.
        broken = {**stack.kafka_secure_client_config(), "sasl.password": "not-the-password"}
        monkeypatch.setenv(
            f"AIRFLOW_CONN_KAFKA_BROKEN_{tag.upper()}", json.dumps({"conn_type": "kafka", "extra": broken})
        )
        with DAG(f"status_broken_{tag}", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as other:
            SparkKafkaToSinkOperator(
                task_id="apply",
                pipeline=f"status-broken-{tag}",
                topics=f"status-broken-{tag}",
                sink="delta",
                sink_path=f"/nonexistent/status-broken-{tag}",
                checkpoint_location=f"/nonexistent/status-broken-{tag}-cp",
                kafka_conn_id=f"kafka_broken_{tag}",
            )
        started = time.monotonic()
        overview = read_overview([dag, other])
        assert time.monotonic() - started < 10, "one broken connection held the whole page"
        refused = next(p for p in overview.pipelines if p.spec.name == f"status-broken-{tag}")
        assert refused.state == "error"
        assert f"Kafka connection 'kafka_broken_{tag}'" in next(s.error for s in refused.sections if s.slug == "ledger")
        assert not [e for e in overview.errors if "broken" in e], overview.errors  # on its card, not the page's
        status = next(p for p in overview.pipelines if p.spec.name == pipeline)
        sink = next(s for s in status.sections if s.slug == "sink")
        assert sink.error is None, sink.error
        assert [(r["location"], r["batch id"], r["rows in sink"]) for r in sink.rows] == [(table, COMMITS - 1, 50)]
        flow = next(f for f in overview.flows if f.name == pipeline)
        assert [p.rows for p in flow.history] == [10, 20, 30, 40, 50], flow.notes
        assert flow.throughput is not None and flow.throughput > 0
        loads = next(s for s in status.sections if s.slug == "full_loads")
        assert loads.error is None, loads.error  # read with the task's connection, as the sink
        assert [(r["Delta version"], r["load id"], r["rows"]) for r in loads.rows] == [(0, f"load-{tag}", 10)]
        assert status.state != "error", [s.error for s in status.sections]
    finally:
        register_settings(before)
        storage.delete_prefix("")
