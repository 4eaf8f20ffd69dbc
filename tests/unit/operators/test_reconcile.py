"""ReconcileOperator's choice of the Delta reader: no Spark application for what delta-rs reads in the task."""

from __future__ import annotations

import pyarrow as pa
from deltalake import write_deltalake

from exactly_once_provider.operators import reconcile
from exactly_once_provider.operators.reconcile import ReconcileOperator


def _operator(path, **kwargs) -> ReconcileOperator:
    return ReconcileOperator(task_id="reconcile", name="n", table="s.t", sink="delta", sink_path=str(path), **kwargs)


def test_auto_reads_a_whole_small_table_with_delta_rs_and_a_larger_or_unknown_one_with_spark(tmp_path, monkeypatch):
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2, 3]}))
    write_deltalake(str(path), pa.table({"id": [4, 5]}), mode="append")  # rows counted over every file
    op = _operator(path)
    spec = op._sink_spec()
    assert op._delta_rows(str(path)) == 5
    assert op._reads_with_delta_rs(spec, None)  # the whole table, 5 rows
    monkeypatch.setattr(reconcile, "DELTA_RS_MAX_ROWS", 4)
    assert not op._reads_with_delta_rs(spec, None)
    assert op._reads_with_delta_rs(spec, [(None, None)])  # a changed scope: delta-rs whatever the size
    assert not _operator(path, delta_reader="spark")._reads_with_delta_rs(spec, [(None, None)])
    missing = _operator(tmp_path / "none")
    assert not missing._reads_with_delta_rs(missing._sink_spec(), None)  # no table: Spark says so
