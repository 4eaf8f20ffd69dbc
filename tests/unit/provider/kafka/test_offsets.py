"""The offsets-topic schema: stable keys, versioned values, clear errors on bad names and versions."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.kafka.offsets import (
    LEDGER_PARTITIONS,
    OFFSETS_SCHEMA_VERSION,
    CommittedOffset,
    check_ledger_partitions,
    compaction_problems,
    ledger_key,
    ledger_partition,
    marker_value,
    new_committed_offset,
)


def _record(**overrides) -> CommittedOffset:
    fields = dict(
        pipeline="orders",
        source_partition="db1.orders",
        offset={"file": "b.000001", "pos": 4},
        sequence=7,
        batch_id="7",
        batch_version=1,
        records=750,
        transactional_id="eo-txn/orders/db1.orders",
        delivery_mode="exactly_once",
    )
    fields.update(overrides)
    return new_committed_offset(**fields)


def test_key_is_pipeline_slash_partition():
    assert ledger_key("orders", "db1.orders") == b"orders/db1.orders"


@pytest.mark.parametrize("bad", ["", "a/b", "has space", "-lead", "x" * 101, None, 3])
def test_invalid_names_are_refused_with_what_to_fix(bad):
    with pytest.raises(ValueError, match="letters, digits"):
        ledger_key("orders", bad)


def test_value_round_trips_and_carries_the_schema_version():
    record = _record()
    raw = json.loads(record.to_value())
    assert raw["schema_version"] == OFFSETS_SCHEMA_VERSION == 1
    assert raw["offset"] == {"file": "b.000001", "pos": 4} and raw["sequence"] == 7
    assert CommittedOffset.from_value(record.to_value()) == record
    assert record.key == b"orders/db1.orders"


def test_newer_schema_version_is_refused():
    raw = json.loads(_record().to_value())
    raw["schema_version"] = 2
    with pytest.raises(ValueError, match="schema_version 2.*Upgrade the provider"):
        CommittedOffset.from_value(json.dumps(raw).encode())


def test_missing_field_and_garbage_are_refused():
    raw = json.loads(_record().to_value())
    del raw["sequence"]
    with pytest.raises(ValueError, match="lacks.*sequence"):
        CommittedOffset.from_value(json.dumps(raw).encode())
    with pytest.raises(ValueError, match="not JSON"):
        CommittedOffset.from_value(b"\x00garbage")


def test_offset_that_cannot_be_stored_is_refused_before_producing():
    with pytest.raises(TypeError):
        _record(offset=object())


def test_end_marker_names_the_batch_and_counts_its_partition():
    end = json.loads(marker_value("end", _record(batch_id="2026-11-20", batch_version=2), 12))
    assert end == {
        "schema_version": 1,
        "marker": "end",
        "pipeline": "orders",
        "source_partition": "db1.orders",
        "sequence": 7,
        "batch_id": "2026-11-20",
        "batch_version": 2,
        "offset": {"file": "b.000001", "pos": 4},
        "records": 12,
        "batch_records": 750,
    }
    begin = json.loads(marker_value("begin", _record()))
    assert begin["marker"] == "begin" and "records" not in begin


def test_ledger_partition_is_crc32_of_the_pipeline_so_other_clients_can_compute_it():
    import zlib

    assert ledger_partition("orders", 16) == zlib.crc32(b"orders") % 16 == 14
    assert ledger_partition("orders", 1) == 0  # a legacy single-partition ledger: everything in partition 0
    spread = {ledger_partition(f"pipeline{i}", LEDGER_PARTITIONS) for i in range(200)}
    assert spread == set(range(LEDGER_PARTITIONS))
    with pytest.raises(ValueError, match="letters, digits"):
        ledger_partition("a/b", 16)
    with pytest.raises(ValueError, match="at least one partition"):
        ledger_partition("orders", 0)


@pytest.mark.parametrize("count", [2, 3, 15, 17, 32])
def test_partition_counts_other_than_legacy_or_current_are_refused(count):
    assert check_ledger_partitions("t", 1) == 1 and check_ledger_partitions("t", 16) == 16
    with pytest.raises(ValueError, match="must never change"):
        check_ledger_partitions("t", count)


def test_compaction_problems_name_the_settings_that_keep_history():
    assert (
        compaction_problems({"segment.ms": "3600000", "min.cleanable.dirty.ratio": "0.1", "min.compaction.lag.ms": "0"})
        == []
    )
    kafka_defaults = {"segment.ms": "604800000", "min.cleanable.dirty.ratio": "0.5", "min.compaction.lag.ms": "0"}
    assert compaction_problems(kafka_defaults) == ["segment.ms=604800000 > 3600000"]
    assert compaction_problems({"min.compaction.lag.ms": "86400000", "min.cleanable.dirty.ratio": "0.9"}) == [
        "min.cleanable.dirty.ratio=0.9 > 0.5",
        "min.compaction.lag.ms=86400000 > 3600000",
    ]


def test_a_moved_record_names_the_new_ledger_and_is_never_read_as_an_offset():
    from exactly_once_provider.kafka.offsets import LedgerMovedError, moved_to

    moved = b'{"moved_to":"eo-offsets-v2","schema_version":1}'
    assert moved_to(moved) == "eo-offsets-v2"
    assert moved_to(_record().to_value()) is None and moved_to(b"not json") is None
    with pytest.raises(LedgerMovedError, match="offsets_topic='eo-offsets-v2'"):
        CommittedOffset.from_value(moved)


@pytest.mark.parametrize(
    ("replicas", "min_isr", "problems"),
    [
        (3, 2, []),
        (5, 3, []),
        (1, 1, ["replication factor 1 (< 3)", "min.insync.replicas=1 (< 2)"]),
        (3, 1, ["min.insync.replicas=1 (< 2)"]),
        (2, 2, ["replication factor 2 (< 3)"]),
    ],
)
def test_durability_problems_name_the_settings_a_broker_restart_can_break(replicas, min_isr, problems):
    from exactly_once_provider.kafka.offsets import durability_problems

    assert durability_problems(replicas, min_isr) == problems
