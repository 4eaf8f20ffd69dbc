"""Start position and handoff filter of the capture loop (no services)."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from exactly_once_provider.capture.loop import (
    CAPTURE_GC_THRESHOLD,
    CaptureRequest,
    HandoffFilter,
    _fewer_gc_passes,
    start_position,
)
from exactly_once_provider.full_load.handoff import ChunkPosition, Handoff
from exactly_once_provider.kafka.writer import TransactionPolicy
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source.snapshot import Chunk


def pos(n, file="binlog.000002"):
    return BinlogPosition(file, n)


HANDOFF = Handoff(
    "load",
    "eo",
    "t",
    ("id",),
    30,
    (
        ChunkPosition(Chunk(0, None, (10,)), pos(500), 10),
        ChunkPosition(Chunk(1, (10,), (20,)), pos(300), 10),
        ChunkPosition(Chunk(2, (20,), None), pos(900), 10),
    ),
    0,
)


def request(handoffs=None, start=None, tables=(("eo", "t"),)):
    return CaptureRequest(
        dict.fromkeys(tables, ("id",)),
        dict.fromkeys(tables, "topic"),
        {("eo", "t"): HANDOFF} if handoffs is None else handoffs,
        start,
        "bounded",
        None,
        TransactionPolicy(),
        1,
    )


@pytest.mark.parametrize(
    "key,end,loaded",
    [
        ((5,), pos(500), True),
        ((5,), pos(501), False),
        ((10,), pos(500), True),  # upper bound is inclusive
        ((11,), pos(300), True),
        ((11,), pos(400), False),
        ((20,), pos(301), False),
        ((21,), pos(900), True),
        ((10**9,), pos(899), True),
        ((21,), pos(4, "binlog.000003"), False),
    ],
)
def test_handoff_drops_changes_at_or_before_the_chunk_snapshot(key, end, loaded):
    assert HandoffFilter({("eo", "t"): HANDOFF}).already_loaded(("eo", "t"), key, end) is loaded


def test_handoff_ends_after_the_largest_chunk_position_and_ignores_other_tables():
    f = HandoffFilter({("eo", "t"): HANDOFF})
    assert f.active(pos(900)) and not f.active(pos(901))
    assert not f.already_loaded(("eo", "other"), (1,), pos(1))


def test_first_run_starts_at_the_smallest_chunk_position_or_start_position():
    assert start_position(request(), None) == (pos(300), True)
    both = request(start=pos(100), tables=(("eo", "t"), ("eo", "u")))
    assert start_position(both, None) == (pos(100), True)
    with pytest.raises(ValueError, match="no full load"):
        start_position(request(tables=(("eo", "t"), ("eo", "u"))), None)


def test_later_runs_resume_from_the_ledger_only():
    ledger = SimpleNamespace(offset={"format": 1, "file": "binlog.000002", "pos": 4000, "tables": ["eo.t"]})
    assert start_position(request(), ledger) == (pos(4000), False)
    with pytest.raises(ValueError, match="not a binlog capture offset"):
        start_position(request(), SimpleNamespace(offset=42))


def test_a_table_added_behind_the_capture_is_refused():
    ledger = SimpleNamespace(offset={"format": 1, "file": "binlog.000002", "pos": 4000, "tables": ["eo.other"]})
    with pytest.raises(ValueError, match="would be lost"):
        start_position(request(), ledger)


def test_handoff_asks_the_locator_of_a_table_whose_key_the_server_orders():
    # Under a case-insensitive collation 'b' sorts with 'B', in chunk 1; by code point it sorts after 'B': chunk 2.
    handoff = Handoff(
        "load",
        "eo",
        "s",
        ("k",),
        3,
        (
            ChunkPosition(Chunk(0, None, ("a",)), pos(500), 1),
            ChunkPosition(Chunk(1, ("a",), ("B",)), pos(300), 1),
            ChunkPosition(Chunk(2, ("B",), None), pos(200), 1),
        ),
        0,
    )
    asked = []

    def server_order(key):
        asked.append(key)
        return 1

    by_server = HandoffFilter({("eo", "s"): handoff}, {("eo", "s"): server_order})
    assert by_server.already_loaded(("eo", "s"), ("b",), pos(300)) and asked == [("b",)]
    assert not HandoffFilter({("eo", "s"): handoff}).already_loaded(("eo", "s"), ("b",), pos(300))


def test_the_collector_runs_less_often_only_while_captures_run():
    before = gc.get_threshold()
    with pytest.raises(RuntimeError):
        with _fewer_gc_passes():
            with _fewer_gc_passes():  # a second capture in another thread of the process
                assert gc.get_threshold()[0] == max(before[0], CAPTURE_GC_THRESHOLD)
            assert gc.get_threshold()[0] == max(before[0], CAPTURE_GC_THRESHOLD)
            raise RuntimeError("the capture failed")
    assert gc.get_threshold() == before
