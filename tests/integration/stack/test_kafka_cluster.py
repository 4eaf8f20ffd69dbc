"""The 3-broker fault-test cluster (RF 3, min ISR 2) keeps committing when one broker is SIGKILLed."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from tests.kafka_support import QUIET, new_topic, produce_transaction, read_all, transactional_producer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(stack):
    nodes = stack.kafka_cluster()
    stack.start_kafka(nodes)
    yield nodes
    stack.stop_all([node.process for node in nodes])  # only these tests use it: give its memory back


def test_cluster_survives_one_broker_sigkill(stack, cluster):
    bootstrap = ",".join(node.bootstrap for node in cluster)
    topic = new_topic(bootstrap, replication_factor=3)

    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    config = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    (future,) = config.values()
    assert future.result()["min.insync.replicas"].value == "2"
    partition = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
    assert len(partition.replicas) == 3

    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [b"before-1", b"before-2"], commit=True)

    victim = next(node for node in cluster if node.node_id == partition.leader)  # the leader, the hard case
    victim.process.kill()
    try:
        produce_transaction(producer, topic, [b"after-1", b"after-2"], commit=True)
        assert read_all(bootstrap, topic) == [b"before-1", b"before-2", b"after-1", b"after-2"]
    finally:
        stack.start_by_name(victim.name)
    assert read_all(victim.bootstrap, topic) == [b"before-1", b"before-2", b"after-1", b"after-2"]
