"""The bounded ledger read against the real broker: exact resume points however much other traffic follows."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from exactly_once_provider.kafka.offsets import (
    COMPACTION_CONFIG,
    FIRST_WINDOW,
    LEDGER_PARTITIONS,
    ensure_offsets_topic,
    ledger_partition,
    new_committed_offset,
    read_committed_offset,
    read_ledger,
)
from tests.kafka_support import QUIET, transactional_producer


@pytest.fixture
def bootstrap(stack):
    return f"{stack.HOST}:{stack.KAFKA_PORT}"


def _ledger(bootstrap: str, partitions: int | None = None) -> str:
    topic = f"ledger-{uuid.uuid4().hex[:10]}"
    if partitions is None:
        assert ensure_offsets_topic({"bootstrap.servers": bootstrap}, topic) == LEDGER_PARTITIONS
    else:
        admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
        admin.create_topics([NewTopic(topic, partitions, 1, config={"cleanup.policy": "compact"})])[topic].result(30)
        ensure_offsets_topic({"bootstrap.servers": bootstrap}, topic)
    return topic


def _value(pipeline: str, source_partition: str, offset: int, sequence: int) -> bytes:
    return new_committed_offset(
        pipeline, source_partition, offset, sequence, str(sequence), 1, 1, None, "exactly_once"
    ).to_value()


def _write(producer, topic: str, records: list[tuple[str, str, int]], partitions: int, commit: bool = True) -> None:
    """One transaction of ledger records (pipeline, source_partition, offset), each in its pipeline's partition."""
    producer.begin_transaction()
    for sequence, (pipeline, source_partition, offset) in enumerate(records, 1):
        while True:
            try:
                producer.produce(
                    topic,
                    _value(pipeline, source_partition, offset, sequence),
                    f"{pipeline}/{source_partition}".encode(),
                    partition=ledger_partition(pipeline, partitions),
                )
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    if commit:
        producer.commit_transaction(60)
    else:
        producer.abort_transaction(60)


def _same_partition_pipelines(pipeline: str, count: int, partitions: int = LEDGER_PARTITIONS) -> list[str]:
    target = ledger_partition(pipeline, partitions)
    names = (f"other{i}" for i in range(100_000))
    return [n for n in names if ledger_partition(n, partitions) == target][:count]


def test_new_ledger_is_partitioned_and_compaction_settings_are_set(bootstrap):
    topic = _ledger(bootstrap)
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    assert len(admin.list_topics(topic, timeout=30).topics[topic].partitions) == LEDGER_PARTITIONS == 16
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(30)
    assert {k: config[k].value for k in COMPACTION_CONFIG} == COMPACTION_CONFIG


def test_a_ledger_whose_partition_count_changed_is_refused(bootstrap):
    topic = f"ledger-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    admin.create_topics([NewTopic(topic, 3, 1, config={"cleanup.policy": "compact"})])[topic].result(30)
    time.sleep(0.5)
    with pytest.raises(ValueError, match="3 partitions"):
        ensure_offsets_topic({"bootstrap.servers": bootstrap}, topic)
    with pytest.raises(ValueError, match="must never change"):
        read_committed_offset({"bootstrap.servers": bootstrap}, "p", "0", topic, timeout=30)


@pytest.mark.parametrize("partitions", [None, 1], ids=["partitioned", "legacy-single-partition"])
def test_key_far_behind_other_pipelines_traffic_reads_its_exact_record(bootstrap, partitions):
    topic = _ledger(bootstrap, partitions)
    count = partitions or LEDGER_PARTITIONS
    producer = transactional_producer(bootstrap)
    _write(producer, topic, [("mine", "db1.t", n) for n in range(1, 4)], count)  # sequences 1..3, offset 3 last
    neighbours = _same_partition_pipelines("mine", 5, count)
    # 20 windows' worth of other pipelines' traffic in the SAME partition after mine's last record
    traffic = [(neighbours[i % 5], "0", i) for i in range(20 * FIRST_WINDOW)]
    for start in range(0, len(traffic), 5000):
        _write(producer, topic, traffic[start : start + 5000], count)
    config = {"bootstrap.servers": bootstrap}
    record = read_committed_offset(config, "mine", "db1.t", topic, timeout=60)
    assert (record.offset, record.sequence) == (3, 3)
    assert read_committed_offset(config, "mine", "never", topic, timeout=60) is None
    last = traffic[-1]
    assert read_committed_offset(config, last[0], "0", topic, timeout=60).offset == last[2]
    ledger = read_ledger(config, topic, timeout=60)
    assert ledger["mine/db1.t"].offset == 3 and len(ledger) == 6
    assert set(read_ledger(config, topic, timeout=60, pipelines=["mine"])) == {"mine/db1.t"}
    # the status page's read: named keys backwards, a far one, a recent one, one never written, one elsewhere
    other = (
        next(p for p in (f"x{n}" for n in range(100)) if ledger_partition(p, count) != ledger_partition("mine", count))
        if count > 1
        else None
    )
    wanted = [("mine", "db1.t"), (last[0], "0"), ("mine", "never")] + ([(other, "0")] if other else [])
    keyed = read_ledger(config, topic, timeout=60, keys=wanted)
    assert {k: v.offset for k, v in keyed.items()} == {"mine/db1.t": 3, f"{last[0]}/0": last[2]}
    assert keyed["mine/db1.t"].sequence == ledger["mine/db1.t"].sequence


def test_aborted_transactions_after_the_last_committed_record_are_skipped(bootstrap):
    topic = _ledger(bootstrap)
    producer = transactional_producer(bootstrap)
    _write(producer, topic, [("mine", "0", 7)], LEDGER_PARTITIONS)
    # Aborted records of the key, longer than several windows, then a committed record of a neighbour.
    _write(producer, topic, [("mine", "0", 1000 + n) for n in range(3 * FIRST_WINDOW)], LEDGER_PARTITIONS, commit=False)
    neighbour = _same_partition_pipelines("mine", 1)[0]
    _write(producer, topic, [(neighbour, "0", 1)], LEDGER_PARTITIONS)
    config = {"bootstrap.servers": bootstrap}
    assert read_committed_offset(config, "mine", "0", topic, timeout=60).offset == 7
    assert read_ledger(config, topic, timeout=60)["mine/0"].offset == 7


def test_read_waits_for_an_open_transaction_in_the_keys_partition(bootstrap):
    """A record committed behind an open transaction must not be missed: the read ends at the high watermark."""
    topic = _ledger(bootstrap)
    config = {"bootstrap.servers": bootstrap}
    mine, other = transactional_producer(bootstrap), transactional_producer(bootstrap)
    _write(mine, topic, [("mine", "0", 1)], LEDGER_PARTITIONS)
    neighbour = _same_partition_pipelines("mine", 1)[0]
    other.begin_transaction()
    other.produce(
        topic,
        _value(neighbour, "0", 1, 1),
        f"{neighbour}/0".encode(),
        partition=ledger_partition("mine", LEDGER_PARTITIONS),
    )
    other.flush(10)
    _write(mine, topic, [("mine", "0", 2)], LEDGER_PARTITIONS)  # committed behind the open transaction
    ender = threading.Timer(3.0, other.abort_transaction, args=(30,))
    ender.start()
    started = time.monotonic()
    assert read_committed_offset(config, "mine", "0", topic, timeout=60).offset == 2
    assert time.monotonic() - started >= 2.5, "the read did not wait for the open transaction to end"
    ender.join()


def test_writer_puts_the_ledger_record_in_the_pipelines_partition(bootstrap, airflow_connections):
    from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook
    from exactly_once_provider.kafka.writer import Message
    from tests.kafka_support import new_topic

    data, topic = new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:10]}"
    for mode in ("exactly_once", "at_least_once"):
        writer = TransactionalProducerHook(pipeline=f"p-{mode}", delivery_mode=mode, offsets_topic=topic).open_writer()
        try:
            for offset in (10, 20):
                writer.write_batch(data, [Message(b"v", key=b"k")], offset=offset)
        finally:
            writer.close()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            **QUIET,
        }
    )
    found = {}
    try:
        for partition in range(LEDGER_PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            if high > low:
                found[partition] = high
    finally:
        consumer.close()
    expected = {ledger_partition(f"p-{mode}", LEDGER_PARTITIONS) for mode in ("exactly_once", "at_least_once")}
    assert set(found) == expected
    for mode in ("exactly_once", "at_least_once"):
        record = read_committed_offset({"bootstrap.servers": bootstrap}, f"p-{mode}", "0", topic, timeout=60)
        assert (record.offset, record.sequence) == (20, 2)
    assert json.loads(json.dumps(sorted(read_ledger({"bootstrap.servers": bootstrap}, topic)))) == [
        "p-at_least_once/0",
        "p-exactly_once/0",
    ]


def test_a_ledger_a_broker_restart_can_break_is_warned_about_once(bootstrap, caplog):
    topic = f"ledger-{uuid.uuid4().hex[:10]}"
    with caplog.at_level("WARNING", logger="exactly_once_provider.kafka.offsets"):
        ensure_offsets_topic({"bootstrap.servers": bootstrap}, topic)  # the stack's single broker: RF 1
        ensure_offsets_topic({"bootstrap.servers": bootstrap}, topic)
    warnings = [r.getMessage() for r in caplog.records if topic in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "replication factor 1 (< 3) and min.insync.replicas=1 (< 2)" in warnings[0]
    assert "docs/pitfalls.md#kafka" in warnings[0]
