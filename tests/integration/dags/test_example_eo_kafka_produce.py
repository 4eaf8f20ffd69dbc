"""``airflow dags test`` runs the example producer DAG; a second run is a no-op; the topic holds 1..N once."""

from __future__ import annotations

import json
import uuid

from exactly_once_provider.kafka.offsets import read_committed_offset
from tests.kafka_support import new_topic, read_all


def test_example_dag_produces_exactly_once_and_rerun_is_a_no_op(airflow_cli, stack):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic, pipeline = new_topic(bootstrap), f"example-{uuid.uuid4().hex[:6]}"
    conf = json.dumps({"topic": topic, "records": 3000, "pipeline": pipeline})

    first = airflow_cli("dags", "test", "eo_kafka_produce", "--conf", conf)
    output = first.stdout + first.stderr
    assert first.returncode == 0, output[-5000:]
    assert "Committed 3000 records in 3 transactions" in output, output[-5000:]

    second = airflow_cli("dags", "test", "eo_kafka_produce", "--conf", conf)
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-5000:]
    assert "Nothing new after offset 3000; nothing produced." in output, output[-5000:]

    assert read_all(bootstrap, topic) == [str(n).encode() for n in range(1, 3001)]
    assert read_committed_offset({"bootstrap.servers": bootstrap}, pipeline, "0", "eo-offsets").offset == 3000
