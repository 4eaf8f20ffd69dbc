"""What a reconciliation compares and records: the columns a sink lags behind, a Delta row count, the position."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from exactly_once_provider.errors import PipelineError
from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.reconcile.catalog import delta_rows, split_pending
from exactly_once_provider.reconcile.keys import Key
from exactly_once_provider.reconcile.position import captured_position, position_record
from exactly_once_provider.reconcile.sides import SinkSpec
from exactly_once_provider.sinks.base import offsets_to_json

ID = Column("id", "int", "int(11)", 10, 0)
A = Column("a", "varchar", "varchar(10)", None, None)
B = Column("b", "int", "int(11)", 10, 0)
KEY = Key.of(ID)
PLAIN = SinkSpec("postgres", "s.t")


def _never():
    raise AssertionError("the sink's columns are read only when they matter")


def test_columns_the_sink_has_not_received_yet_are_pending_the_key_never():
    assert split_pending(PLAIN, KEY, [ID, A, B], lambda: {"a"}, named=False) == ([ID, A], ["b"])
    assert split_pending(PLAIN, KEY, [ID, A, B], lambda: {"id", "a", "b"}, named=False) == ([ID, A, B], [])
    assert split_pending(PLAIN, KEY, [ID, A], lambda: None, named=False) == ([ID, A], [])  # no table yet


def test_named_columns_must_be_on_a_postgres_sink_and_record_sinks_are_not_asked():
    with pytest.raises(ValueError, match=r"has no column\(s\) \['b'\]"):
        split_pending(PLAIN, KEY, [ID, B], lambda: {"id"}, named=True)
    records = SinkSpec("delta", "/lake/t", json_column="record_value", json_path=("after",))
    assert split_pending(records, KEY, [ID, A], _never, named=False) == ([ID, A], [])
    assert split_pending(SinkSpec("delta", "/lake/t"), KEY, [ID, A], _never, named=True) == ([ID, A], [])


def test_a_delta_table_s_rows_come_from_its_log_statistics(tmp_path):
    path = str(tmp_path / "t")
    assert delta_rows(path) == float("inf")  # no table: a Spark application reads it and says so
    write_deltalake(path, pa.table({"id": [1, 2, 3]}))
    write_deltalake(path, pa.table({"id": [4]}), mode="append")
    assert delta_rows(path) == 4


def test_a_stored_position_is_a_base_for_the_next_changed_scope_only_when_no_column_was_left_out():
    common = {"captured": "binlog.000001:4", "in_flight": [3]}
    offsets = {"t": {0: 12}}
    based = position_record(common, offsets, [], [(1, 5), (9, 10)])
    assert based["sink_offsets"] == offsets_to_json(offsets) and based["in_flight"] == [3]
    assert based["scope"] == {"kind": "changed", "ranges": 2, "keys_covered": 5}
    pending = position_record(common, offsets, ["c"], None)
    assert (
        "sink_offsets" not in pending and pending["pending_columns"] == ["c"] and pending["scope"] == {"kind": "full"}
    )
    assert position_record(None, offsets, [], None) is None and "scope" not in common  # the caller's dict untouched


def _ledger(monkeypatch, committed, end, applied):
    from types import SimpleNamespace

    from exactly_once_provider.kafka import lag, offsets

    monkeypatch.setattr(
        offsets, "read_committed_offset", lambda kafka, *capture: committed and SimpleNamespace(offset=committed)
    )
    monkeypatch.setattr(lag, "stable_end_offsets", lambda kafka, topics: end)
    monkeypatch.setattr(lag, "sink_offsets", lambda kind, location, pipeline, connect: applied)


CAPTURE = ("cat_capture", "0", "eo_offsets")
SINK = ("delta", "/lake/t", "cat_apply", None)


def test_the_capture_position_counts_only_once_the_sink_applied_all_of_it(monkeypatch):
    _ledger(monkeypatch, {"file": "binlog.000002", "pos": 400}, {"t": {0: 10}}, {"t": {0: 10}})
    captured, applied = captured_position({}, CAPTURE, ["t"], SINK, None)
    assert (str(captured), applied) == ("binlog.000002:400", {"t": {0: 10}})
    _ledger(monkeypatch, {"file": "binlog.000002", "pos": 400}, {"t": {0: 12}}, {"t": {0: 10}})
    with pytest.raises(PipelineError, match="has not applied everything the capture committed"):
        captured_position({}, CAPTURE, ["t"], SINK, None)
    _ledger(monkeypatch, None, {}, {})
    with pytest.raises(PipelineError, match="'cat_capture' never committed; pass full_load_path"):
        captured_position({}, CAPTURE, ["t"], SINK, None)
