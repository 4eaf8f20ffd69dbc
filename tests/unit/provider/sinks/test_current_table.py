"""The current table's rules: the snapshot version sits between the changes in the snapshot and those after it;
the MERGE joins on every key column, quoted; the job's settings refuse what current mode cannot do."""

from __future__ import annotations

import pytest

from exactly_once_provider.capture.change_record import version_of
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.sinks.current_table import merge_condition, snapshot_version
from exactly_once_provider.sinks.delta import DeltaSink
from exactly_once_provider.spark_jobs.stream_spec import StreamSpec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("file, pos", [("binlog.000001", 4), ("binlog.000009", 4711), ("mysql-bin.123456", 2**31)])
def test_snapshot_version_is_below_every_later_change_and_not_below_an_earlier_one(file, pos):
    snapshot = snapshot_version(BinlogPosition(file, pos))
    assert version_of(file, pos, 0) > snapshot  # the first change written at the snapshot position applies
    assert version_of(file, pos - 1, 0) <= snapshot  # a change whose event starts before it is in the snapshot
    assert version_of(file, pos - 3, 2) <= snapshot  # (its rows end before the position)
    assert snapshot < version_of(f"{file[:-6]}{int(file[-6:]) + 1:06d}", 4, 0)  # the next binlog file is newer


def test_merge_joins_every_key_column_quoted_and_only_newer_versions_win():
    on, newer = merge_condition(("a", "we`ird; col"))
    assert on == "t.`a` = s.`a` AND t.`we``ird; col` = s.`we``ird; col`"
    assert newer == "s.`_eo_version` > t.`_eo_version`"


def test_current_mode_needs_a_delta_or_postgres_sink_exactly_once_and_the_key():
    spec = dict(pipeline="p", topics=("t",), checkpoint="/c", path="/x", mode="current")
    assert StreamSpec(sink="delta", **spec).validate().mode == "current"
    with pytest.raises(ValueError, match="needs sink='delta'"):
        StreamSpec(sink="files", **spec).validate()
    # PostgreSQL: its table, built from the Delta full load at path
    assert StreamSpec(sink="postgres", table="t", **spec).validate().path == "/x"
    with pytest.raises(ValueError, match="set sink_path to the Delta table the full load published"):
        StreamSpec(sink="postgres", table="t", **{**spec, "path": None}).validate()
    with pytest.raises(ValueError, match="needs delivery='exactly-once'"):
        StreamSpec(sink="delta", delivery="at-least-once", **spec).validate()
    with pytest.raises(ValueError, match="key columns"):
        DeltaSink("/x", "p", mode="current")


def test_max_runtime_is_for_a_processing_time_stream():
    spec = dict(pipeline="p", topics=("t",), checkpoint="/c", sink="delta", path="/x")
    assert StreamSpec(trigger="processing-time", max_runtime=60, **spec).validate().max_runtime == 60
    with pytest.raises(ValueError, match="max_runtime"):
        StreamSpec(max_runtime=60, **spec).validate()
    with pytest.raises(ValueError, match="max_runtime"):
        StreamSpec(trigger="processing-time", max_runtime=0, **spec).validate()
