"""Migrating a single-partition ledger into a partitioned one: every resume point exact, the old one fenced."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from exactly_once_provider.errors import PipelineError
from exactly_once_provider.kafka.ledger_migration import migrate_ledger
from exactly_once_provider.kafka.offsets import (
    LEDGER_PARTITIONS,
    LedgerMovedError,
    ledger_partition,
    read_committed_offset,
    read_ledger,
    topic_end_offsets,
)
from tests.integration.provider.kafka.test_offsets import _write
from tests.kafka_support import QUIET, transactional_producer

PIPELINES = [("orders", "db1.orders"), ("orders", "db1.items"), ("users", "0"), ("billing", "w")]


@pytest.fixture
def bootstrap(stack):
    return f"{stack.HOST}:{stack.KAFKA_PORT}"


def legacy_ledger(bootstrap: str) -> tuple[str, dict[str, int]]:
    """A 1-partition ledger: 50 commits per key (interleaved), then an aborted transaction; return the expected
    last committed offset per key."""
    topic = f"legacy-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(30)
    producer = transactional_producer(bootstrap)
    for round_ in range(50):
        _write(producer, topic, [(p, s, 100 * i + round_) for i, (p, s) in enumerate(PIPELINES)], 1)
    _write(producer, topic, [(p, s, -1) for p, s in PIPELINES], 1, commit=False)
    return topic, {f"{p}/{s}": 100 * i + 49 for i, (p, s) in enumerate(PIPELINES)}


def resume_points(bootstrap: str, topic: str) -> dict[str, int]:
    return {
        f"{p}/{s}": read_committed_offset({"bootstrap.servers": bootstrap}, p, s, topic, timeout=60).offset
        for p, s in PIPELINES
    }


def test_migration_copies_every_resume_point_and_fences_the_old_ledger(bootstrap):
    source, expected = legacy_ledger(bootstrap)
    target = f"ledger-{uuid.uuid4().hex[:10]}"
    config = {"bootstrap.servers": bootstrap}
    assert migrate_ledger(config, source, target, quiet_s=0, timeout=60) == len(PIPELINES)
    assert resume_points(bootstrap, target) == expected
    assert len(topic_end_offsets(config, target)) == LEDGER_PARTITIONS
    filled = {p for p, end in topic_end_offsets(config, target).items() if end > 0}
    assert filled == {ledger_partition(p, LEDGER_PARTITIONS) for p, _ in PIPELINES}
    with pytest.raises(LedgerMovedError, match=target):
        read_committed_offset(config, "orders", "db1.orders", source, timeout=60)
    assert all(isinstance(v, LedgerMovedError) for v in read_ledger(config, source, timeout=60).values())
    # Running it again verifies the finished migration and writes nothing.
    ends = topic_end_offsets(config, target)
    assert migrate_ledger(config, source, target, quiet_s=0, timeout=60) == len(PIPELINES)
    assert topic_end_offsets(config, target) == ends and resume_points(bootstrap, target) == expected


def test_migration_refuses_a_ledger_written_recently_or_a_target_in_use(bootstrap):
    source, expected = legacy_ledger(bootstrap)
    config = {"bootstrap.servers": bootstrap}
    with pytest.raises(PipelineError, match="a writer is running"):
        migrate_ledger(config, source, f"ledger-{uuid.uuid4().hex[:10]}", quiet_s=3600, timeout=60)
    used = f"ledger-{uuid.uuid4().hex[:10]}"
    migrate_ledger(config, legacy_ledger(bootstrap)[0], used, quiet_s=0, timeout=60)
    with pytest.raises(ValueError, match="already holds"):
        migrate_ledger(config, source, used, quiet_s=0, timeout=60)
    with pytest.raises(ValueError, match="onto itself"):
        migrate_ledger(config, source, source)
    assert resume_points(bootstrap, source) == expected  # nothing happened to it
