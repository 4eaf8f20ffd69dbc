"""The PostgreSQL current table's build, against the real server: it copies the full load's Delta commit (read by
delta-rs) into a typed table once per load, and never replaces a table it did not build.
"""

from __future__ import annotations

from types import SimpleNamespace

import psycopg2
import pyarrow as pa
import pytest

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.sinks.postgres import PostgresSink


def _full_load(tmp_path, load_id: str, rows: int) -> SimpleNamespace:
    """A full load's handoff and its Delta commit (written here by delta-rs: the build only reads it)."""
    from deltalake import write_deltalake

    path = str(tmp_path / load_id)
    write_deltalake(path, pa.table({
        "id": pa.array(range(rows), pa.int32()), "amount": pa.array([f"{i}.50" for i in range(rows)]).cast(
            pa.decimal128(12, 2)), "note": pa.array([None if i % 3 else f"n{i}" for i in range(rows)], pa.string()),
        "_eo_version": pa.array([100] * rows, pa.int64()), "_eo_deleted": pa.array([False] * rows)}))
    columns = (Column("id", "int", "int(11)", 10, 0), Column("amount", "decimal", "decimal(12,2)", 12, 2),
               Column("note", "varchar", "varchar(20)", None, None))
    handoff = SimpleNamespace(load_id=load_id, schema="eo", table="t", key=("id",), table_version=0, columns=columns,
                              min_version=101)
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
    types = dict(_rows(schema, "SELECT column_name, data_type FROM information_schema.columns"
                               " WHERE table_name = 'orders_current'"))
    assert types == {"id": "integer", "amount": "numeric", "note": "text", "_eo_version": "bigint",
                     "_eo_deleted": "boolean"}
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
    with pytest.raises(ValueError, match='"shared" exists and is the current table of pipeline \'p\''):
        _sink(schema, "shared", "q", load).prepare()
    assert _rows(schema, "SELECT count(*) FROM shared") == [(10,)]
