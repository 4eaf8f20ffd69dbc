"""The Kafka client hooks read a connection once and give each client its share (kafka_config.DROPPED)."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.hooks import kafka_client
from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook

EXTRA = {
    "bootstrap.servers": "b1:9093",
    "client.id": "eo-client",
    "security.protocol": "SSL",
    "enable.ssl.certificate.verification": "false",
    "linger.ms": 5,
    "group.id": "theirs",
    "isolation.level": "read_uncommitted",
}


@pytest.fixture
def connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_HOOK_TEST", json.dumps({"conn_type": "kafka", "extra": EXTRA}))
    reads = []
    original = kafka_client.kafka_client_config
    monkeypatch.setattr(kafka_client, "kafka_client_config", lambda conn_id: reads.append(conn_id) or original(conn_id))
    return reads


def test_the_producer_keeps_the_connection_but_its_consumer_group_settings(connection):
    hook = TransactionalProducerHook(
        "kafka_hook_test", pipeline="p", delivery_mode="exactly_once", producer_config={"linger.ms": 20}
    )
    config = hook.build_producer_config()
    assert "group.id" not in config and "isolation.level" not in config
    assert (config["client.id"], config["enable.ssl.certificate.verification"]) == ("eo-client", "false")
    assert (config["linger.ms"], config["transactional.id"], config["acks"]) == (20, "eo-txn/p/0", "all")
    hook.client_config()
    assert connection == ["kafka_hook_test"]  # read once however many clients the hook builds


def test_the_client_hook_reads_the_whole_connection_once(connection):
    hook = kafka_client.KafkaClientHook("kafka_hook_test")
    assert hook.client_config() == EXTRA
    hook.client_config()["group.id"] = "changed by a caller"
    assert hook.client_config() == EXTRA and connection == ["kafka_hook_test"]
