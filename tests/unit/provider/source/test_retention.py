"""Binlog retention headroom: purged, next to be purged, and bytes behind."""

from __future__ import annotations

from exactly_once_provider.positions import BinlogPosition, parse_position
from exactly_once_provider.source.retention import headroom

LOGS = [("binlog.000009", 1000), ("binlog.000010", 500), ("binlog.000011", 300)]


def test_purged_position():
    found = headroom(BinlogPosition("binlog.000008", 4), LOGS)
    assert found.purged and found.oldest_file == "binlog.000009"


def test_oldest_retained_file_warns_and_counts_bytes_behind():
    found = headroom(BinlogPosition("binlog.000009", 400), LOGS)
    assert not found.purged and found.files_before_purge == 0 and found.bytes_behind == 600 + 500 + 300
    assert "purged next" in found.warnings(warn_files=1, warn_bytes=10_000)[0]
    assert "bytes behind" in found.warnings(warn_files=0, warn_bytes=100)[0]


def test_headroom_with_room_has_no_warning():
    found = headroom(BinlogPosition("binlog.000011", 300), LOGS)
    assert found.files_before_purge == 2 and found.bytes_behind == 0
    assert found.warnings(warn_files=1, warn_bytes=1) == []


def test_position_from_ledger_offsets():
    assert parse_position({"format": 1, "file": "binlog.000003", "pos": 4711}) == BinlogPosition("binlog.000003", 4711)
    assert parse_position("binlog.000003:4") == BinlogPosition("binlog.000003", 4)
