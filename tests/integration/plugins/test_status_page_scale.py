"""The status page with many pipelines: FLOWS flows (a producer and a Delta stream each, on its own topic, with
HISTORY sink commits) read from the live Kafka and the Delta logs, and rendered; the time is printed and held
under a budget. The Kafka connection is the stack's default one (SASL_SSL): the page's per-page clients are
what keeps the time flat."""

from __future__ import annotations

import json
import time
import uuid

import pendulum
import pytest
from airflow.sdk import DAG
from confluent_kafka.admin import AdminClient, NewTopic

from exactly_once_provider.operators.kafka_produce import TransactionalProduceOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.plugins.page import render_page
from exactly_once_provider.plugins.status import read_overview

FLOWS, HISTORY = 100, 30
BUDGET_SECONDS = (
    15  # measured: 4.5 s for 250 pipelines (this test's 200 and 50 of other tests) on the loaded 2-core box
)


def _history(path, pipeline: str, topic: str) -> None:
    """Write HISTORY Delta commits carrying the stream's marker (what DeltaSink writes), one a second apart."""
    log = path / "_delta_log"
    log.mkdir(parents=True)
    start = int(time.time() * 1000) - HISTORY * 1000
    for version in range(HISTORY):
        marker = {
            f"eo_stream:{pipeline}": {
                "pipeline": pipeline,
                "checkpoint_id": "c",
                "batch_id": version,
                "offsets": {topic: {"0": 0}},
                "rows_before": version * 10,
            }
        }
        info = {
            "timestamp": start + version * 1000,
            "operation": "WRITE",
            "userMetadata": json.dumps(marker),
            "operationMetrics": {"numOutputRows": "10"},
        }
        (log / f"{version:020d}.json").write_text(json.dumps({"commitInfo": info}) + "\n")


def test_page_with_many_flows_stays_fast(stack, airflow_connections, tmp_path):
    tag = uuid.uuid4().hex[:6]
    topics = [f"scale-{tag}-{i}" for i in range(FLOWS)]
    admin = AdminClient({"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        future.result(timeout=60)
    try:
        dags = []
        for i, topic in enumerate(topics):
            with DAG(f"scale_{tag}_{i}", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
                TransactionalProduceOperator(
                    task_id="produce",
                    topic=topic,
                    pipeline=f"s{tag}-{i}",
                    delivery_mode="exactly_once",
                    producer_function="builtins.iter",
                )
                SparkKafkaToSinkOperator(
                    task_id="apply",
                    pipeline=f"s{tag}-{i}-apply",
                    topics=topic,
                    sink="delta",
                    sink_path=str(tmp_path / f"t{i}"),
                    checkpoint_location="/tmp/unused",
                )
            _history(tmp_path / f"t{i}", f"s{tag}-{i}-apply", topic)
            dags.append(dag)
        started = time.monotonic()
        overview = read_overview(dags)
        html = render_page(overview)
        seconds = time.monotonic() - started
        print(
            f"status page: {len(overview.pipelines)} pipelines in {len(overview.flows)} flows, "
            f"{HISTORY} sink commits each: read {overview.seconds:.2f} s, read + render {seconds:.2f} s, "
            f"{len(html) / 1e6:.1f} MB"
        )
        ours = [f for f in overview.flows if f.name.startswith(f"s{tag}-")]
        assert len(ours) == FLOWS and all(len(f.members) == 2 for f in ours)
        assert all(len(f.history) == HISTORY and f.lag == 0 and f.freshness == 0 for f in ours)
        assert all(f.throughput == pytest.approx(10.0) for f in ours), [f.throughput for f in ours][:3]
        assert html.count("<svg") >= 2 * FLOWS
        assert seconds < BUDGET_SECONDS
    finally:
        admin.delete_topics(topics)
