"""What a reconciliation compares, read from both sides' catalogs: the key, the columns, the sink's columns.

The source's key is its primary key unless the caller names one; every compared column must have one canonical
text (:func:`~exactly_once_provider.reconcile.canonical.kind_of`). The sink may lag one ``ALTER TABLE ... ADD
COLUMN`` behind the source (it reaches the current table with the first batch applied after it): such columns are
compared by neither side and reported as pending (:func:`split_pending`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from exactly_once_provider.full_load.columns import Column, table_columns
from exactly_once_provider.reconcile.canonical import kind_of
from exactly_once_provider.reconcile.keys import Key
from exactly_once_provider.reconcile.sides import SinkSpec


def primary_key(cur: Any, schema: str, table: str) -> list[str]:
    """Return the columns of the source table's primary key, in index order ([] without one).

    :param cur: a cursor on the source server.
    :param schema: the database.
    :param table: the table.
    """
    cur.execute(
        "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND "
        "TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
        (schema, table),
    )
    return [row[0] for row in cur.fetchall()]


def key_and_columns(
    cur: Any, schema: str, table: str, key_column: str | list[str] | None, columns: list[str] | None
) -> tuple[Key, list[Column]]:
    """Return the key and the compared columns of a source table; ValueError names what the table lacks.

    :param cur: a cursor on the source server.
    :param schema: the database.
    :param table: the table.
    :param key_column: the key's column(s); None: the primary key.
    :param columns: the compared columns; None: every column.
    """
    found = table_columns(cur, schema, table)
    by_name = {c.name: c for c in found}
    key_names = [key_column] if isinstance(key_column, str) else list(key_column or ())
    if not key_names:
        key_names = primary_key(cur, schema, table)
        if not key_names:
            raise ValueError(
                f"{schema}.{table} has no primary key; pass key_column (a unique column, or a "
                "list of columns that are unique together)."
            )
    unknown = [n for n in key_names if n not in by_name]
    if unknown:
        raise ValueError(f"key_column {unknown} is not in {schema}.{table} (it has {list(by_name)}).")
    wanted = list(columns) if columns else [c.name for c in found]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ValueError(f"columns {unknown} are not in {schema}.{table} (it has {list(by_name)}).")
    chosen = [by_name[n] for n in wanted]
    for column in chosen:
        kind_of(column)  # refuses types without one canonical text, naming the column
    return Key.of([by_name[n] for n in key_names]), chosen


def sink_column_names(spec: SinkSpec, pg_conn: Any = None, table: Any = None) -> set[str] | None:
    """Return the column names of the sink's table (None: no table yet).

    :param spec: the sink.
    :param pg_conn: a PostgreSQL sink: a psycopg2 connection to its database.
    :param table: a Delta sink: its location or storage.
    """
    if spec.kind == "postgres":
        from psycopg2 import sql

        with pg_conn.cursor() as cur:
            name = sql.Identifier(*spec.location.split("."))
            cur.execute("SELECT to_regclass(%s)", (name.as_string(cur),))
            if cur.fetchone()[0] is None:
                return None
            cur.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(name))
            return {d[0] for d in cur.description}
    from exactly_once_provider.sinks.delta_log import table_state

    state = table_state(table if table is not None else spec.location)
    if state is None:
        return None
    return {f["name"] for f in json.loads(state.metadata["schemaString"])["fields"]}


def split_pending(
    spec: SinkSpec, key: Key, columns: list[Column], held: Callable[[], set[str] | None], named: bool
) -> tuple[list[Column], list[str]]:
    """Return the compared columns the sink's table has, and the source columns it does not have yet.

    Comparing every source column would fail on one an ``ALTER TABLE ... ADD COLUMN`` added that the sink has not
    received yet: the reconciliation compares the columns both sides have and reports the others as pending. Only
    for the default column list of a plain table: columns the caller named must be on the sink.

    :param spec: the sink.
    :param key: the key (never pending).
    :param columns: the source's compared columns.
    :param held: reads the sink table's column names (:func:`sink_column_names`; None: no table yet), called only
        when they matter.
    :param named: the caller named the columns (``columns=``).
    """
    if spec.json_column or (named and spec.kind != "postgres"):
        return columns, []
    names = held()
    if names is None:
        return columns, []
    pending = [c.name for c in columns if c.name not in names and c.name not in key.names]
    if named and pending:
        raise ValueError(
            f"The PostgreSQL table {spec.location} has no column(s) {pending}: reconcile the "
            "columns it has (leave columns= unset to compare every column both sides have)."
        )
    return [c for c in columns if c.name not in pending], pending


def delta_rows(table: Any) -> float:
    """Return the rows of a Delta table's newest version from its log's file statistics.

    Infinite when a file has none, or there is no table yet (a Spark application then reads it, and says so).

    :param table: the table's location or storage.
    """
    from exactly_once_provider.sinks import delta_log

    state = delta_log.table_state(table)
    if state is None:
        return float("inf")
    rows = 0
    for add in delta_log.active_files(state).values():
        if not add.get("stats") or "numRecords" not in add["stats"]:
            return float("inf")
        rows += int(json.loads(add["stats"])["numRecords"])
    return rows
