"""Window-mode planning on hand-made marker lists: complete, incomplete (carry), stale, superseded, broken."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.spark_jobs.settlement import (
    Marker,
    WindowIntegrityError,
    batch_header,
    parse_batch_header,
    plan_windows,
)

W1, W2 = "wm/t/2026-11-20", "wm/t/2026-11-21"


def framed(window, version, parts: dict[int, tuple[int, int, int]], topic="t"):
    """Markers of one batch version: partition -> (begin offset, records, end offset); None skips a side."""
    total = sum(records for _, records, _ in parts.values())
    markers, counts = [], {}
    for partition, (begin, records, end) in parts.items():
        if begin is not None:
            markers.append(Marker(topic, partition, begin, "begin", window, version))
        if end is not None:
            markers.append(Marker(topic, partition, end, "end", window, version, records, total))
            counts[(batch_header(window, version), topic, partition)] = records
    return markers, counts


def merge(*batches):
    markers, counts = [], {}
    for m, c in batches:
        markers += m
        counts.update(c)
    return markers, counts


def test_complete_windows_are_published_and_offsets_move_to_the_end():
    markers, counts = merge(framed(W1, 1, {0: (0, 3, 4), 1: (0, 2, 3)}), framed(W2, 1, {0: (5, 1, 7), 1: (4, 0, 5)}))
    plan = plan_windows(markers, counts, {}, {"t": {0: 8, 1: 6}}, {})
    assert plan.publish == {W1: 1, W2: 1}
    assert plan.rows == {W1: 5, W2: 1}
    assert plan.carry == {"t": {0: 8, 1: 6}}
    assert plan.incomplete == plan.stale == []


def test_a_batch_cut_by_the_read_is_not_published_and_holds_the_offsets_at_its_begin():
    # W1 complete; W2 v1 has its end marker in partition 0 only, partition 1 was cut before its end.
    markers, counts = merge(framed(W1, 1, {0: (0, 3, 4), 1: (0, 2, 3)}), framed(W2, 1, {0: (5, 2, 8), 1: (4, 4, None)}))
    plan = plan_windows(markers, counts, {}, {"t": {0: 9, 1: 7}}, {})
    assert plan.publish == {W1: 1}
    assert plan.incomplete == [f"{W2} v1"]
    assert plan.carry == {"t": {0: 5, 1: 4}}


def test_begin_read_in_one_partition_only_carries_that_partition():
    markers, counts = framed(W2, 1, {0: (5, 2, None)})
    plan = plan_windows(markers, counts, {"t": {0: 5, 1: 4}}, {"t": {0: 7, 1: 4}}, {W1: 1})
    assert plan.publish == {} and plan.carry == {"t": {0: 5, 1: 4}}


def test_newer_version_supersedes_and_older_or_equal_versions_never_win():
    markers, counts = merge(framed(W1, 1, {0: (0, 3, 4)}), framed(W1, 2, {0: (5, 2, 8)}))
    plan = plan_windows(markers, counts, {}, {"t": {0: 9}}, {})
    assert plan.publish == {W1: 2} and plan.rows == {W1: 2}
    assert plan.stale == [f"{W1} v1"]
    # v2 already in the sink: a replayed v1 and v2 change nothing
    again = plan_windows(markers, counts, {}, {"t": {0: 9}}, {W1: 2})
    assert again.publish == {} and sorted(again.stale) == [f"{W1} v1", f"{W1} v2"]
    assert again.carry == {"t": {0: 9}}
    # v3 published, then v2 arrives (re-read): skipped, not carried
    late = plan_windows(*framed(W1, 2, {0: (5, 2, 8)}), {"t": {0: 5}}, {"t": {0: 9}}, {W1: 3})
    assert late.publish == {} and late.carry == {"t": {0: 9}}


def test_empty_window_version_is_published_as_zero_rows():
    plan = plan_windows(*framed(W1, 2, {0: (3, 0, 4), 1: (0, 0, 1)}), {}, {"t": {0: 5, 1: 2}}, {W1: 1})
    assert plan.publish == {W1: 2} and plan.rows == {W1: 0}


def test_read_starting_inside_a_batch_is_refused():
    markers, counts = framed(W1, 1, {0: (None, 3, 4)})
    with pytest.raises(WindowIntegrityError, match="read started inside the batch"):
        plan_windows(markers, counts, {"t": {0: 2}}, {"t": {0: 5}}, {})


def test_data_records_not_matching_the_end_marker_are_refused():
    markers, counts = framed(W1, 1, {0: (0, 3, 4)})
    counts[(batch_header(W1, 1), "t", 0)] = 2
    with pytest.raises(WindowIntegrityError, match="holds 2 data records"):
        plan_windows(markers, counts, {}, {"t": {0: 5}}, {})


def test_marker_and_header_parsing():
    body = {
        "pipeline": "wm",
        "source_partition": "t",
        "batch_id": "2026-11-20T00:00:00+00:00",
        "batch_version": 2,
        "records": 3,
        "batch_records": 5,
        "marker": "end",
    }
    marker = Marker.parse("t", 0, 9, "end", json.dumps(body))
    assert (marker.window_id, marker.version, marker.records, marker.batch_records) == (
        "wm/t/2026-11-20T00:00:00+00:00",
        2,
        3,
        5,
    )
    assert parse_batch_header(batch_header(marker.window_id, 2)) == (marker.window_id, 2)
    with pytest.raises(WindowIntegrityError, match="not a batch marker"):
        Marker.parse("t", 0, 9, "begin", b"\xff not json")
    with pytest.raises(WindowIntegrityError, match="is not '<window>/v<version>'"):
        parse_batch_header("wm/t/x")
