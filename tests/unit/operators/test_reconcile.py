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


def _tables_operator(**kwargs) -> ReconcileOperator:
    entries = [
        {"name": "p.orders", "table": "shop.orders", "sink_path": "/lake/orders", "key_column": "id"},
        {"name": "p.lines", "table": "shop.lines", "sink_path": "/lake/lines", "key_column": ["o", "n"]},
        {"name": "p.users", "table": "shop.users", "sink_path": "/lake/users"},
    ]
    return ReconcileOperator(task_id="reconcile", tables=entries, sink="delta", scope="changed", **kwargs)


def test_several_tables_are_compared_in_one_task_each_by_its_own_arguments_and_the_failures_named(monkeypatch):
    import pytest
    from airflow.sdk.exceptions import AirflowException

    seen = []

    def compare_one(self, context):
        seen.append((self.name, self.table, self.sink_path, self.key_column, self.scope))
        if self.name == "p.lines":
            self.openlineage_result = {"clean": False, "source_rows": 7, "in_flight": 0, "missing": 1}
            self.openlineage_result |= {"extra": 0, "duplicate": 0, "changed": 0}
            raise reconcile.ReconciliationMismatch("Sink differs from shop.lines: 1 key(s)")
        clean = {"clean": True, "source_rows": 5, "in_flight": 0, "missing": 0, "extra": 0, "duplicate": 0}
        return {"name": self.name, **clean, "changed": 0, "position": {"scope": {"kind": self.scope}}}

    monkeypatch.setattr(ReconcileOperator, "execute_one", compare_one)
    op = _tables_operator(full_scope_tables='["users"]')
    with pytest.raises(reconcile.ReconciliationMismatch, match=r"1 of 3 tables failed.*p\.lines: .*shop\.lines"):
        op.execute({})
    assert [s[:4] for s in seen] == [
        ("p.orders", "shop.orders", "/lake/orders", "id"),
        ("p.lines", "shop.lines", "/lake/lines", ["o", "n"]),
        ("p.users", "shop.users", "/lake/users", None),
    ]
    assert op.table is None and op.tables[0]["name"] == "p.orders"  # the operator itself is left as it was
    summary = reconcile._tables_summary(op.table_views(), op.openlineage_result["tables"], {"p.lines": "mismatch"})
    assert [line.split()[:2] for line in summary.splitlines()[2:]] == [
        ["p.orders", "CLEAN"],
        ["p.lines", "MISMATCH"],
        ["p.users", "CLEAN"],
    ]

    def broken(self, context):  # a table that cannot be compared does not stop the others
        if self.name in ("p.orders", "p.lines"):
            raise ValueError(f"key_column ['id'] is not in {self.table}")
        return compare_one(self, context)

    monkeypatch.setattr(ReconcileOperator, "execute_one", broken)
    with pytest.raises(AirflowException, match=r"2 of 3 tables failed.*p\.orders: ValueError: key_column") as err:
        _tables_operator().execute({})
    assert not isinstance(err.value, reconcile.ReconciliationMismatch)


def test_full_scope_tables_names_tables_qualified_or_bare_and_entries_are_checked():
    import pytest

    op = _tables_operator(full_scope_tables=["shop.orders", "users"])
    assert [v._in_full_scope() for v in op.table_views()] == [True, False, True]
    assert not _tables_operator(full_scope_tables="[]").table_views()[0]._in_full_scope()
    with pytest.raises(ValueError, match=r"only arguments of one table .* not \['sink'\]"):
        ReconcileOperator(task_id="r", sink="delta", tables=[{"name": "a", "table": "s.a", "sink": "x"}]).table_views()
    with pytest.raises(ValueError, match="must differ"):
        ReconcileOperator(task_id="r", sink="delta", tables=[{"name": "a", "table": "s.a"}] * 2).table_views()
    with pytest.raises(ValueError, match="not both"):
        ReconcileOperator(
            task_id="r", sink="delta", name="a", table="s.a", tables=[{"name": "a", "table": "s.a"}]
        ).table_views()
    with pytest.raises(ValueError, match="Name the reconciliation"):
        ReconcileOperator(task_id="r", sink="delta").execute({})
