"""The transactional producer hook on the real broker: atomic data + ledger, fencing, undeliverable records."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook
from exactly_once_provider.kafka.offsets import (
    LEDGER_PARTITIONS,
    MARKER_HEADER,
    ledger_partition,
    read_committed_offset,
)
from exactly_once_provider.kafka.writer import DeliveryError, Message, PipelineWriter, ProducerFencedError
from tests.kafka_support import new_topic, read_all


@pytest.fixture
def bootstrap(stack, airflow_connections):
    return f"{stack.HOST}:{stack.KAFKA_PORT}"


def _hook(pipeline: str, offsets_topic: str, mode: str = "exactly_once", **kwargs) -> TransactionalProducerHook:
    return TransactionalProducerHook(pipeline=pipeline, delivery_mode=mode, offsets_topic=offsets_topic, **kwargs)


def _messages(*values: str) -> list[Message]:
    return [Message(value.encode(), key=value.encode()) for value in values]


def _leave_open(writer, topic: str, value: bytes, key: bytes | None = None, partition: int = -1) -> None:
    """Begin a transaction on the writer's producer, send one record, and leave it open."""
    writer.producer.begin_transaction()
    writer.producer.produce(topic, value, key=key, partition=partition)
    writer.producer.flush(10)


def test_committed_batch_and_its_offset_are_visible_together(bootstrap):
    topic, ledger = new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
    writer = _hook(ledger, ledger).open_writer()
    assert writer.last_committed is None
    committed = writer.write_batch(topic, _messages("a", "b", "c"), offset=3)
    assert (committed.sequence, committed.batch_id, committed.records) == (1, "1", 3)
    writer.write_batch(topic, _messages("d"), offset={"file": "bin.000002", "pos": 4})
    writer.close()

    assert read_all(bootstrap, topic) == [b"a", b"b", b"c", b"d"]
    last = read_committed_offset({"bootstrap.servers": bootstrap}, ledger, "0", ledger)
    assert (last.offset, last.sequence, last.records) == ({"file": "bin.000002", "pos": 4}, 2, 1)
    assert last.transactional_id == f"eo-txn/{ledger}/0" and last.delivery_mode == "exactly_once"
    # A new writer of the same pipeline resumes from exactly that record.
    assert _hook(ledger, ledger).open_writer().last_committed == last


def test_aborted_batch_is_invisible_with_its_offset(bootstrap):
    topic, ledger = new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
    writer = _hook(ledger, ledger).open_writer()
    writer.write_batch(topic, _messages("kept"), offset=1)
    _leave_open(writer, topic, b"dropped")
    writer.producer.abort_transaction(30)
    writer.write_batch(topic, _messages("kept-2"), offset=2)

    assert read_all(bootstrap, topic) == [b"kept", b"kept-2"]
    assert read_all(bootstrap, topic, "read_uncommitted") == [b"kept", b"dropped", b"kept-2"]
    assert read_committed_offset({"bootstrap.servers": bootstrap}, ledger, "0", ledger).offset == 2


def test_older_writer_is_fenced_and_its_open_transaction_never_visible(bootstrap):
    topic, ledger = new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
    old = _hook(ledger, ledger).open_writer()
    old.write_batch(topic, _messages("first"), offset=1)
    _leave_open(old, topic, b"zombie")

    new = _hook(ledger, ledger).open_writer()  # same pipeline + partition -> same id -> fences `old`
    assert new.last_committed.offset == 1
    with pytest.raises(ProducerFencedError, match="fenced"):  # the zombie's commit is refused
        old._retry("commit_transaction", old.producer.commit_transaction, 30)
    with pytest.raises(ProducerFencedError, match="fenced"):  # and so is any later batch
        old.write_batch(topic, _messages("zombie-2"), offset=2)
    new.write_batch(topic, _messages("second"), offset=2)

    assert read_all(bootstrap, topic) == [b"first", b"second"]
    assert b"zombie" in read_all(bootstrap, topic, "read_uncommitted")  # it reached the log, aborted
    assert read_committed_offset({"bootstrap.servers": bootstrap}, ledger, "0", ledger).offset == 2


def test_ledger_read_waits_for_another_pipelines_open_transaction(bootstrap):
    """A committed offset written after another pipeline's open transaction must not be missed."""
    topic, ledger = new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
    other = _hook("other", ledger).open_writer()
    mine = _hook("mine", ledger).open_writer()
    mine.write_batch(topic, _messages("m1"), offset=1)
    # an open transaction on mine's ledger partition
    _leave_open(other, ledger, b"{}", key=b"other/0", partition=ledger_partition("mine", LEDGER_PARTITIONS))
    mine.write_batch(topic, _messages("m2"), offset=2)  # committed behind the open transaction
    ender = threading.Timer(3.0, other.producer.abort_transaction, args=(30,))
    ender.start()
    started = time.monotonic()
    # A read_committed reader alone stops at the open transaction and would return offset 1.
    assert read_committed_offset({"bootstrap.servers": bootstrap}, "mine", "0", ledger).offset == 2
    assert time.monotonic() - started >= 2.5, "the read did not wait for the open transaction to end"
    ender.join()


def _small_topic_writer(bootstrap: str, track_partition_offsets: bool = True) -> tuple[str, str, PipelineWriter]:
    """Return a topic refusing records over 2 KB, its writer's ledger, and the writer after one committed batch."""
    ledger = f"ledger-{uuid.uuid4().hex[:8]}"
    topic = f"small-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "2048"})])[topic].result(30)
    writer = _hook(ledger, ledger).open_writer(track_partition_offsets=track_partition_offsets)
    writer.write_batch(topic, _messages("ok"), offset=1)
    return topic, ledger, writer


def test_record_larger_than_topic_allows_fails_and_nothing_is_visible(bootstrap):
    topic, ledger, writer = _small_topic_writer(bootstrap)

    batch = _messages("before") + [Message(b"x" * 10_000, key=b"big")] + _messages("after")
    with pytest.raises(DeliveryError, match="not delivered.*nothing of this batch is visible"):
        writer.write_batch(topic, batch, offset=4)

    assert read_all(bootstrap, topic) == [b"ok"]
    assert read_committed_offset({"bootstrap.servers": bootstrap}, ledger, "0", ledger).offset == 1


def test_batch_markers_frame_each_transaction_in_every_partition(bootstrap):
    topic, ledger = new_topic(bootstrap, partitions=2), f"ledger-{uuid.uuid4().hex[:8]}"
    writer = _hook(ledger, ledger, batch_markers=True).open_writer()
    writer.write_batch(topic, _messages(*[f"v{i}" for i in range(20)]), offset=20, batch_id="2026-11-20")

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in (0, 1)])
    per_partition: dict[int, list] = {0: [], 1: []}
    eof: set[int] = set()
    while len(eof) < 2:
        message = consumer.poll(5)
        assert message is not None, "no end of partition in time"
        if message.error():
            eof.add(message.partition())
            continue
        headers = dict(message.headers() or [])
        per_partition[message.partition()].append(
            json.loads(message.value()) if MARKER_HEADER in headers else message.value()
        )
    consumer.close()

    data_total = 0
    for records in per_partition.values():
        begin, *data, end = records
        assert begin["marker"] == "begin" and end["marker"] == "end"
        assert begin["batch_id"] == end["batch_id"] == "2026-11-20" and end["batch_version"] == 1
        assert end["records"] == len(data) and end["batch_records"] == 20 and end["offset"] == 20
        data_total += len(data)
    assert data_total == 20


def test_consume_transform_produce_commits_input_offsets_in_the_transaction(bootstrap):
    source, target, ledger = new_topic(bootstrap), new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
    writer = _hook("copy", ledger).open_writer()
    writer.write_batch(source, _messages("a", "b", "c"), offset=3)
    group = f"copy-{uuid.uuid4().hex[:6]}"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(source, 0, OFFSET_BEGINNING)])
    consumed = [consumer.poll(10) for _ in range(3)]
    assert [m.value() for m in consumed] == [b"a", b"b", b"c"]
    copier = _hook("copy-out", ledger).open_writer()
    copier.write_batch(
        target,
        [Message(m.value().upper()) for m in consumed],
        offset=consumed[-1].offset(),
        consumer=consumer,
        consumer_offsets=[TopicPartition(source, 0, consumed[-1].offset() + 1)],
    )

    assert read_all(bootstrap, target) == [b"A", b"B", b"C"]
    committed = consumer.committed([TopicPartition(source, 0)], timeout=30)
    assert committed[0].offset == consumed[-1].offset() + 1
    consumer.close()


def test_at_least_once_mode_uses_no_transaction_and_still_records_the_offset(bootstrap):
    topic, ledger = new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
    hook = _hook("alo", ledger, mode="at_least_once")
    config = hook.build_producer_config()
    assert "transactional.id" not in config and config["enable.idempotence"] is True
    writer = hook.open_writer()
    committed = writer.write_batch(topic, _messages("x", "y"), offset=2)
    assert committed.transactional_id is None and committed.delivery_mode == "at_least_once"
    assert read_all(bootstrap, topic) == [b"x", b"y"]
    assert read_committed_offset({"bootstrap.servers": bootstrap}, "alo", "0", ledger).offset == 2


@pytest.mark.parametrize("track_partition_offsets", [True, False], ids=["key-reports", "no-reports"])
def test_oversized_record_without_a_delivery_report_still_fails_the_batch(bootstrap, track_partition_offsets):
    """exactly_once reports only each key's last record (or none, like the capture's writer); a failed unreported
    record surfaces through the commit."""
    topic, ledger, writer = _small_topic_writer(bootstrap, track_partition_offsets)

    batch = [Message(b"before", key=b"k"), Message(b"x" * 10_000, key=b"k"), Message(b"after", key=b"k")]
    with pytest.raises(DeliveryError, match="not delivered.*TOO_LARGE.*nothing of this batch is visible"):
        writer.write_batch(topic, batch, offset=4)

    assert read_all(bootstrap, topic) == [b"ok"]
    assert read_committed_offset({"bootstrap.servers": bootstrap}, ledger, "0", ledger).offset == 1


def test_partition_offsets_are_the_last_data_offsets_of_every_partition(bootstrap):
    """Exact per-partition offsets although exactly_once asks for a delivery report per key only."""
    topic, ledger = new_topic(bootstrap, partitions=3), f"ledger-{uuid.uuid4().hex[:8]}"
    writer = _hook(ledger, ledger).open_writer()
    for start in (0, 300):
        writer.submit_batch(
            topic,
            [Message(str(n).encode(), key=f"k{n % 7}".encode()) for n in range(start, start + 300)]
            + [Message(b"keyless")],
            offset=start + 300,
        )
    writer.wait()
    writer.close()

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
    last: dict[tuple[str, int], int] = {}
    eof: set[int] = set()
    while len(eof) < 3:
        message = consumer.poll(5)
        assert message is not None, "no end of partition in time"
        if message.error():
            eof.add(message.partition())
            continue
        last[(topic, message.partition())] = message.offset()
    consumer.close()
    assert len(last) == 3 and writer.partition_offsets == last
