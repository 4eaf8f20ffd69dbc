"""The watermark part of the ledger value: round trip, history trimming, refusing other pipelines' offsets."""

from __future__ import annotations

import pytest

from exactly_once_provider.kafka.offsets import CommittedOffset, new_committed_offset
from exactly_once_provider.kafka.windows import WatermarkState, WindowRecord, batch_header


def window(batch_id, lower, upper, version=1):
    return WindowRecord(
        batch_id=batch_id,
        batch_version=version,
        lower=lower,
        upper=upper,
        upper_reason="safety_lag",
        rows=3,
        checksum="sha256:x",
        interval_end=None,
        published_at="2026-11-21T00:00:00+00:00",
    )


def ledger(offset) -> CommittedOffset:
    record = new_committed_offset("p", "t", offset, 1, "b", 1, 3, "eo-txn/p/t", "exactly_once")
    return CommittedOffset.from_value(record.to_value())  # through the real JSON value


def test_state_round_trips_through_the_ledger_value_and_advances_the_lower_bound():
    first = window("w1", None, "2026-11-21 00:00:00.000000")
    state = WatermarkState("timestamp").with_window(first, advance=True, max_windows=10)
    back = WatermarkState.from_ledger(ledger(state.to_offset(first)), "timestamp")
    assert back.next_lower == "2026-11-21 00:00:00.000000" and back.history == {"w1": first}


def test_a_reextract_keeps_the_next_lower_bound_and_replaces_the_recorded_version():
    state = (
        WatermarkState("id").with_window(window("w1", None, 10), True, 10).with_window(window("w2", 10, 20), True, 10)
    )
    again = state.with_window(window("w1", None, 10, version=2), advance=False, max_windows=10)
    assert again.next_lower == 20 and again.history["w1"].batch_version == 2 and len(again.history) == 2


def test_history_keeps_only_the_newest_windows():
    state = WatermarkState("id")
    for n in range(5):
        state = state.with_window(window(f"w{n}", n, n + 1), True, max_windows=3)
    assert list(state.history) == ["w2", "w3", "w4"] and state.next_lower == 5


def test_offsets_of_another_kind_of_pipeline_or_cursor_are_refused():
    assert WatermarkState.from_ledger(None, "id").next_lower is None
    with pytest.raises(ValueError, match="not a watermark window: another kind of pipeline"):
        WatermarkState.from_ledger(ledger(42), "id")
    state = WatermarkState("id").with_window(window("w1", None, 10), True, 10)
    with pytest.raises(ValueError, match="cursor_kind='id', this task uses 'timestamp'"):
        WatermarkState.from_ledger(ledger(state.to_offset(window("w1", None, 10))), "timestamp")


def test_batch_header_names_pipeline_partition_batch_and_version():
    assert batch_header("p", "db.t", "2026-11-20", 2) == b"p/db.t/2026-11-20/v2"
