"""The single-node KRaft broker supports transactions: commits are visible, aborts are not."""

from __future__ import annotations

from tests.kafka_support import new_topic, produce_transaction, read_all, transactional_producer


def test_committed_transaction_visible_and_aborted_invisible_to_read_committed(stack):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap)
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [b"c1", b"c2"], commit=True)
    produce_transaction(producer, topic, [b"a1", b"a2", b"a3"], commit=False)
    produce_transaction(producer, topic, [b"c3"], commit=True)

    assert read_all(bootstrap, topic, "read_committed") == [b"c1", b"c2", b"c3"]
    # The aborted records really reached the log: a read_uncommitted reader sees all of them, in order.
    assert read_all(bootstrap, topic, "read_uncommitted") == [b"c1", b"c2", b"a1", b"a2", b"a3", b"c3"]


def test_open_transaction_is_invisible_until_committed(stack):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap)
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    producer.produce(topic, b"pending")
    producer.flush(30)
    assert read_all(bootstrap, topic, "read_committed", idle_seconds=2) == []
    producer.commit_transaction(60)
    assert read_all(bootstrap, topic, "read_committed") == [b"pending"]
