"""Where the source is in a sink, read from real change records in a real Kafka topic: the newest change applied
(its binlog position and commit time, across partitions, transaction markers and an aborted batch in between)
and the freshness (since the source commit of the oldest change not applied; 0 when caught up)."""

from __future__ import annotations

import time

from exactly_once_provider.capture.change_record import records_of
from exactly_once_provider.kafka.change_times import source_state
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source.binlog import RowChange, SourceTransaction, TableShape
from tests.kafka_support import new_topic, transactional_producer

SHAPE = TableShape("eo", "orders", ("id", "v"), "abc123", (), frozenset(), ("id",), (None,))


def _transaction(end_pos: int, committed: int, ids: range) -> SourceTransaction:
    rows = [
        RowChange(SHAPE, "c", None, {"id": i, "v": end_pos}, None, (i,), "binlog.000004", end_pos - 50 + n, n)
        for n, i in enumerate(ids)
    ]
    return SourceTransaction(
        f"0-1-{end_pos}",
        1,
        BinlogPosition("binlog.000004", end_pos - 100),
        BinlogPosition("binlog.000004", end_pos),
        committed,
        rows,
    )


def _produce(producer, topic: str, txn: SourceTransaction, commit: bool = True) -> None:
    producer.begin_transaction()
    for record in records_of(txn, {("eo", "orders"): topic}):
        producer.produce(topic, record.value, record.key, partition=record.key[-2] % 2)  # by the key's last digit
    producer.flush(30)
    producer.commit_transaction(60) if commit else producer.abort_transaction(60)


def _ends(bootstrap: str, topic: str) -> dict:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        return {str(p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in (0, 1)}
    finally:
        consumer.close()


def test_the_newest_applied_change_and_the_freshness_at_a_sinks_offsets(stack):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    config = {"bootstrap.servers": bootstrap}
    topic = new_topic(bootstrap, partitions=2, prefix="change-times")
    producer = transactional_producer(bootstrap)
    now = int(time.time())
    _produce(producer, topic, _transaction(1000, now - 300, range(1, 7)))
    _produce(producer, topic, _transaction(2000, now - 120, range(7, 10)))
    _produce(producer, topic, _transaction(9999, now - 60, range(20, 24)), commit=False)  # never a change
    applied = _ends(bootstrap, topic)  # a sink that applied everything so far
    _produce(producer, topic, _transaction(3000, now - 30, range(30, 33)))

    behind = source_state(config, {topic: applied})
    assert behind["source"] == {
        "file": "binlog.000004",
        "pos": 2000,
        "gtid": "0-1-2000",
        "committed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 120)),
    }
    assert 29 <= behind["freshness_s"] <= 29 + 60, behind  # the first unapplied change: committed 30 s ago
    everything = source_state(config, {topic: _ends(bootstrap, topic)})
    assert everything["freshness_s"] == 0.0 and everything["source"]["pos"] == 3000
    first = source_state(config, {topic: {"0": 0, "1": 0}})
    assert first["source"] is None and 299 <= first["freshness_s"] <= 299 + 60  # nothing applied yet
