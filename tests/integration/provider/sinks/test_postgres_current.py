"""The PostgreSQL current table's build, against the real server: it copies the full load's Delta commit (read by
delta-rs) into a typed table once per load, and never replaces a table it did not build.
"""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

import psycopg2
import pyarrow as pa
import pytest

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.sinks.base import BatchCommit, SchemaChange
from exactly_once_provider.sinks.postgres import PostgresSink


def _full_load(tmp_path, load_id: str, rows: int) -> SimpleNamespace:
    """A full load's handoff and its Delta commit (written here by delta-rs: the build only reads it)."""
    from deltalake import write_deltalake

    path = str(tmp_path / load_id)
    write_deltalake(
        path,
        pa.table(
            {
                "id": pa.array(range(rows), pa.int32()),
                "amount": pa.array([f"{i}.50" for i in range(rows)]).cast(pa.decimal128(12, 2)),
                "note": pa.array([None if i % 3 else f"n{i}" for i in range(rows)], pa.string()),
                "_eo_version": pa.array([100] * rows, pa.int64()),
                "_eo_deleted": pa.array([False] * rows),
            }
        ),
    )
    columns = (
        Column("id", "int", "int(11)", 10, 0),
        Column("amount", "decimal", "decimal(12,2)", 12, 2),
        Column("note", "varchar", "varchar(20)", None, None),
    )
    handoff = SimpleNamespace(
        load_id=load_id, schema="eo", table="t", key=("id",), table_version=0, columns=columns, min_version=101
    )
    return SimpleNamespace(handoff=handoff, path=path)


def _sink(schema: dict, table: str, pipeline: str, load) -> PostgresSink:
    sink = PostgresSink(table, pipeline, schema, mode="current")
    sink.builds_on(load.handoff, load.path)
    return sink


def _rows(schema: dict, sql: str) -> list[tuple]:
    conn = psycopg2.connect(**schema)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


def test_built_once_per_load_typed_and_rebuilt_by_a_new_load(stack, schema, tmp_path):
    first = _full_load(tmp_path, "load-a", 1000)
    _sink(schema, "orders_current", "p", first).prepare()
    assert _rows(schema, "SELECT count(*), sum(amount), count(note) FROM orders_current") == [(1000, 500000, 334)]
    types = dict(
        _rows(
            schema, "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'orders_current'"
        )
    )
    assert types == {
        "id": "integer",
        "amount": "numeric",
        "note": "text",
        "_eo_version": "bigint",
        "_eo_deleted": "boolean",
    }
    conn = psycopg2.connect(**schema)
    with conn, conn.cursor() as cur:  # a change merged later: a prepare of the same load must keep it
        cur.execute("UPDATE orders_current SET note = 'changed', _eo_version = 200 WHERE id = 1")
    conn.close()
    _sink(schema, "orders_current", "p", first).prepare()
    assert _rows(schema, "SELECT note FROM orders_current WHERE id = 1") == [("changed",)]
    _sink(schema, "orders_current", "p", _full_load(tmp_path, "load-b", 10)).prepare()  # a full reload
    assert _rows(schema, "SELECT count(*), max(note) FROM orders_current") == [(10, "n9")]
    assert _rows(schema, "SELECT load_id FROM eo_current_tables WHERE pipeline = 'p'") == [("load-b",)]


def test_a_table_it_did_not_build_is_never_replaced(stack, schema, tmp_path):
    load = _full_load(tmp_path, "load-a", 10)
    conn = psycopg2.connect(**schema)
    with conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE users_table (id int PRIMARY KEY, keep text)")
        cur.execute("INSERT INTO users_table VALUES (1, 'mine')")
    conn.close()
    with pytest.raises(ValueError, match='"users_table" exists and is not built by this provider'):
        _sink(schema, "users_table", "p", load).prepare()
    assert _rows(schema, "SELECT * FROM users_table") == [(1, "mine")]
    _sink(schema, "shared", "p", load).prepare()
    with pytest.raises(ValueError, match="\"shared\" exists and is the current table of pipeline 'p'"):
        _sink(schema, "shared", "q", load).prepare()
    assert _rows(schema, "SELECT count(*) FROM shared") == [(10,)]


class _Changes:
    """A batch's changes as the sink takes them from Spark (``toArrow``)."""

    def __init__(self, ids: range, version: int) -> None:
        self.table = pa.table(
            {
                "id": pa.array(ids, pa.int32()),
                "amount": pa.array([f"{version}.00"] * len(ids)).cast(pa.decimal128(12, 2)),
                "note": pa.array([f"v{version}"] * len(ids), pa.string()),
                "_eo_version": pa.array([version] * len(ids), pa.int64()),
                "_eo_deleted": pa.array([False] * len(ids)),
            }
        )

    def toArrow(self) -> pa.Table:  # noqa: N802 - Spark's name
        return self.table


def _route(schema: dict, table: str, topic: str, load) -> PostgresSink:
    """One query of an application whose queries (routes) share the pipeline ``p``: its own table and topic."""
    sink = PostgresSink(table, "p", schema, mode="current", topics=[topic])
    sink.builds_on(load.handoff, load.path)
    sink.prepare()
    return sink


def _loaded(load) -> SchemaChange:
    """The columns of a batch into the table of ``load``, no schema change followed."""
    return SchemaChange(
        {
            "load_id": load.handoff.load_id,
            "columns": [c.to_json() for c in load.handoff.columns],
            "fills": [],
            "applied": load.handoff.min_version,
        }
    )


def test_routes_of_one_pipeline_each_commit_their_own_batches_and_skip_their_own_replays(stack, schema, tmp_path):
    """Two queries of one application (one pipeline), each into its own table from its own topic: each one's
    batches interleave with the other's, each replay is recognised by its own query's state, each table keeps
    its own load and schema state."""
    loads = _full_load(tmp_path, "load-a", 10), _full_load(tmp_path, "load-b", 20)
    a, b = _route(schema, "a_current", "topic-a", loads[0]), _route(schema, "b_current", "topic-b", loads[1])
    in_a, in_b = _loaded(loads[0]), _loaded(loads[1])
    assert a.commit(_Changes(range(3), 201), BatchCommit("p", "ckpt-a", 0, {"topic-a": {0: 3}}), None, schema=in_a)
    planned_on = a.committed()  # a's next batch is planned; b commits meanwhile
    assert b.commit(_Changes(range(5, 9), 202), BatchCommit("p", "ckpt-b", 0, {"topic-b": {0: 4}}), None, schema=in_b)
    assert a.commit(
        _Changes(range(3, 5), 203), BatchCommit("p", "ckpt-a", 1, {"topic-a": {0: 5}}), planned_on, schema=in_a
    )
    # a's driver died before its checkpoint commit: Spark replays a's batch 1, b has committed once more since
    assert b.commit(
        _Changes(range(9, 10), 204), BatchCommit("p", "ckpt-b", 1, {"topic-b": {0: 5}}), b.committed(), schema=in_b
    )
    assert not a.commit(
        _Changes(range(3, 5), 203), BatchCommit("p", "ckpt-a", 1, {"topic-a": {0: 5}}), a.committed(), schema=in_a
    )

    assert (a.committed().checkpoint_id, a.committed().batch_id, a.committed().rows_total) == ("ckpt-a", 1, 5)
    assert (b.committed().checkpoint_id, b.committed().batch_id, b.committed().rows_total) == ("ckpt-b", 1, 5)
    assert _rows(schema, "SELECT _eo_version, count(*) FROM a_current GROUP BY 1 ORDER BY 1") == [
        (100, 5),
        (201, 3),
        (203, 2),
    ]
    assert _rows(schema, "SELECT _eo_version, count(*) FROM b_current GROUP BY 1 ORDER BY 1") == [
        (100, 15),
        (202, 4),
        (204, 1),
    ]
    assert _rows(schema, "SELECT table_name, load_id FROM eo_current_tables ORDER BY 1") == [
        ('"a_current"', "load-a"),
        ('"b_current"', "load-b"),
    ]
    # a restart of the application: both tables hold their loads, neither is built again
    _route(schema, "a_current", "topic-a", loads[0]), _route(schema, "b_current", "topic-b", loads[1])
    assert _rows(schema, "SELECT count(*) FROM a_current UNION ALL SELECT count(*) FROM b_current") == [(10,), (20,)]


def test_a_table_gone_or_renamed_after_changes_is_not_built_again_from_the_old_load(stack, schema, tmp_path):
    load = _full_load(tmp_path, "load-a", 10)
    sink = _route(schema, "orders_current", "topic-a", load)
    assert sink.commit(
        _Changes(range(3), 201), BatchCommit("p", "ckpt", 0, {"topic-a": {0: 3}}), None, schema=_loaded(load)
    )
    with pytest.raises(ValueError, match='"orders_renamed" is new to it .*miss them.*full_reload=true'):
        _route(schema, "orders_renamed", "topic-a", load)
    conn = psycopg2.connect(**schema)
    with conn, conn.cursor() as cur:
        cur.execute("DROP TABLE orders_current")
    conn.close()
    with pytest.raises(ValueError, match='"orders_current" is gone.*built from full load load-a'):
        _route(schema, "orders_current", "topic-a", load)
    assert _rows(schema, "SELECT to_regclass('orders_current'), to_regclass('orders_renamed')") == [(None, None)]
    _route(schema, "orders_current", "topic-a", _full_load(tmp_path, "load-b", 7))  # the full reload
    assert _rows(schema, "SELECT count(*) FROM orders_current") == [(7,)]


class _WideChanges(_Changes):
    """A batch after ``MODIFY id BIGINT, MODIFY amount DECIMAL(18,4)``: the key past INT, an amount past 10 digits."""

    def __init__(self, ids: list[int], version: int) -> None:
        self.table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "amount": pa.array(["12345678901234.5678"] * len(ids)).cast(pa.decimal128(18, 4)),
                "note": pa.array([f"v{version}"] * len(ids), pa.string()),
                "_eo_version": pa.array([version] * len(ids), pa.int64()),
                "_eo_deleted": pa.array([False] * len(ids)),
            }
        )


def test_a_widening_alters_the_column_types_in_the_batch_transaction_once(stack, schema, tmp_path, monkeypatch):
    """INT -> BIGINT of the key and a larger DECIMAL: ``ALTER COLUMN ... TYPE`` in the batch's transaction; a batch
    that fails after it leaves the old types, its retry widens once, a replay alters nothing."""
    from exactly_once_provider import faults

    load = _full_load(tmp_path, "load-a", 10)
    sink = _route(schema, "wide_current", "topic-a", load)
    state = dict(
        _loaded(load).state,
        columns=[
            Column("id", "bigint", "bigint(20)", 19, 0).to_json(),
            Column("amount", "decimal", "decimal(18,4)", 18, 4).to_json(),
            load.handoff.columns[2].to_json(),
        ],
        applied=150,
    )
    widened = SchemaChange(state, changed=True)
    types = "SELECT column_name, data_type, numeric_precision, numeric_scale FROM information_schema.columns"
    types += " WHERE table_name = 'wide_current' AND column_name IN ('id', 'amount') ORDER BY 1"
    batch = _WideChanges([1, 5_000_000_000], 201)
    commit = BatchCommit("p", "ckpt", 0, {"topic-a": {0: 3}})

    def killed(step: str) -> None:
        raise RuntimeError(f"killed at {step}")

    monkeypatch.setattr(faults, "fault_point", killed)
    with pytest.raises(RuntimeError, match="current_schema_changed"):
        sink.commit(batch, commit, None, schema=widened)
    assert _rows(schema, types) == [("amount", "numeric", 12, 2), ("id", "integer", 32, 0)]
    monkeypatch.undo()
    assert sink.commit(batch, commit, None, schema=widened)
    assert _rows(schema, types) == [("amount", "numeric", 18, 4), ("id", "bigint", 64, 0)]
    assert _rows(
        schema, "SELECT id, amount, _eo_version FROM wide_current WHERE id IN (1, 2, 5000000000) ORDER BY 1"
    ) == [
        (1, Decimal("12345678901234.5678"), 201),
        (2, Decimal("2.5000"), 100),
        (5_000_000_000, Decimal("12345678901234.5678"), 201),
    ]
    assert not sink.commit(batch, commit, sink.committed(), schema=widened)  # a replay
    next_batch = BatchCommit("p", "ckpt", 1, {"topic-a": {0: 4}})  # the table already holds the wider types
    assert sink.commit(_WideChanges([5_000_000_000], 202), next_batch, sink.committed(), schema=SchemaChange(state))
    assert _rows(schema, "SELECT note FROM wide_current WHERE id = 5000000000") == [("v202",)]
