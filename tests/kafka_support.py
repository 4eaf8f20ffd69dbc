"""Small helpers for tests that talk to the real broker: fresh topics, transactional writes, full reads."""

from __future__ import annotations

import logging
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

# librdkafka's own log lines (connection retries while a broker is down) go to logging, which pytest captures.
QUIET = {"logger": logging.getLogger("tests.rdkafka")}


def new_topic(bootstrap: str, partitions: int = 1, replication_factor: int = 1, prefix: str = "t") -> str:
    """Create a uniquely named topic and return its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    admin.create_topics([NewTopic(name, partitions, replication_factor)])[name].result(timeout=30)
    # create_topics returns once the controller has the topic; a broker answering describe_configs may not
    # know it yet (UNKNOWN_TOPIC_OR_PART, seen on the 3-broker cluster). Wait until it does.
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.describe_configs([resource])[resource].result(timeout=30)
            return name
        except KafkaException as err:
            if err.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def transactional_producer(bootstrap: str, transactional_id: str | None = None) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id or f"test-{uuid.uuid4().hex[:10]}",
            **QUIET,
        }
    )
    producer.init_transactions(60)
    return producer


def produce_transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    """Write ``values`` in one transaction, then commit it or abort it."""
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value)
    producer.flush(30)
    if commit:
        producer.commit_transaction(60)
    else:
        producer.abort_transaction(60)


def committed_now(bootstrap: str, ledger: str, pipeline: str, source_partition: str):
    """The ledger's last committed offset of ``pipeline``/``source_partition`` as of now, or None.

    A test's own read up to the last stable offset: it does not wait for a transaction left open by a killed
    producer (the product's ``read_committed_offset`` waits for every open transaction to end, which for a
    killed one takes its ``transaction.timeout.ms``, 60 s: its test is ``test_offsets.py``). Exact for a ledger
    only the test writes to; a record of this key that is committed can only sit below the stable offset there.
    """
    from exactly_once_provider.kafka.offsets import CommittedOffset, ledger_key

    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    partitions = len(admin.list_topics(ledger, timeout=30).topics[ledger].partitions)
    wanted = ledger_key(pipeline, source_partition)
    values = [v for k, v in read_all(bootstrap, ledger, partitions=partitions, keys=True) if k == wanted]
    return CommittedOffset.from_value(values[-1]) if values else None


def read_all(
    bootstrap: str,
    topic: str,
    isolation_level: str = "read_committed",
    partitions: int = 1,
    idle_seconds: float = 3.0,
    keys: bool = False,
) -> list:
    """Read every record the given isolation level exposes, until the end offsets are reached (``keys``: as
    ``(key, value)`` pairs)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation_level,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **QUIET,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        values: list[bytes] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        last_progress = time.monotonic()
        while len(at_end) < partitions and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                if time.monotonic() - last_progress > idle_seconds and at_end:
                    break
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                raise RuntimeError(message.error())
            values.append((message.key(), message.value()) if keys else message.value())
            last_progress = time.monotonic()
        assert len(at_end) == partitions, f"did not reach the end of {topic} in time"
        return values
    finally:
        consumer.close()
