"""Validation of the watermark operator's templated arguments (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator, _as_bool, _as_utc
from exactly_once_provider.source.identifiers import quote_identifier
from exactly_once_provider.source.watermark import format_cursor, parse_cursor, truncate


def test_templated_flags_and_instants_are_parsed_strictly():
    assert _as_bool("reextract", "True") is True and _as_bool("reextract", "false") is False
    with pytest.raises(ValueError, match="reextract='maybe': use true or false"):
        _as_bool("reextract", "maybe")
    assert _as_utc("interval_end", "2026-11-21T08:00:00+08:00") == datetime(2026, 11, 21, tzinfo=UTC)
    with pytest.raises(ValueError, match="time-zone-aware"):
        _as_utc("interval_end", "2026-11-21T00:00:00")
    assert _as_utc("interval_end", None) is None


def test_no_io_in_init_and_bad_lag_or_missing_batch_name_fail_in_execute():
    op = WatermarkExtractOperator(
        task_id="x", table="t", cursor_column="u", cursor_kind="timestamp", topic="t", pipeline="p", safety_lag="-1"
    )
    with pytest.raises(ValueError, match="safety_lag='-1'"):
        op.execute({})
    op.safety_lag = 1
    with pytest.raises(ValueError, match="Name the window"):
        op.execute({})


def test_cursor_values_truncate_to_the_column_precision_and_round_trip():
    value = datetime(2026, 11, 21, 1, 2, 3, 456789)
    assert truncate(value, 0) == value.replace(microsecond=0)
    assert truncate(value, 3) == value.replace(microsecond=456000)
    assert parse_cursor(format_cursor(value), "timestamp") == value
    assert parse_cursor(format_cursor(12), "id") == 12
    assert quote_identifier("we`ird") == "`we``ird`"
    with pytest.raises(ValueError):
        quote_identifier("")
