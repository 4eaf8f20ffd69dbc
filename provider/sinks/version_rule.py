"""The rule of every keyed sink, in each form a sink needs it: a change replaces its key's row only if its version is
NEWER than the row's.

A version names one state of one key (a change's binlog-ordered ``version``, a full-load row's chunk snapshot), so
a replayed or older change never overwrites a newer state, whatever the order of replays, restarts and reloads;
a delete is a tombstone carrying its version, so an older change cannot bring the row back. ``replace_equal``:
a change of the row's OWN version replaces it too (the rows a schema change refills carry their version).

The forms: Spark SQL for a Delta MERGE's ``whenMatchedUpdate`` (:func:`sql_condition`), Spark columns for the
provider's own merge plans (:func:`takes_change`: Delta and Iceberg rewrites), PostgreSQL for an upsert's
``ON CONFLICT ... DO UPDATE ... WHERE`` (:func:`postgres_condition`). Each keyed sink builds its condition here.
"""

from __future__ import annotations

from typing import Any


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def sql_condition(version: str, replace_equal: bool = False, source: str = "s", target: str = "t") -> str:
    """Return the Spark SQL condition under which the change ``source`` replaces the row ``target``.

    :param version: the version column (the same name on both sides).
    :param replace_equal: also replace a row of the change's own version.
    """
    return f"{source}.{_quoted(version)} {'>=' if replace_equal else '>'} {target}.{_quoted(version)}"


def takes_change(version: str, replace_equal: bool = False, source: str = "s", target: str = "t") -> Any:
    """Return the Spark column, over a full outer join of changes ``source`` and rows ``target`` by key, that is true
    where the change wins: a key without a row is new, a key with one takes the change only if newer; a row no
    change touches (``source`` version null) keeps its row.
    """
    from pyspark.sql import functions as F

    row, change = F.col(f"{target}.{_quoted(version)}"), F.col(f"{source}.{_quoted(version)}")
    newer = (change >= row) if replace_equal else (change > row)
    return change.isNotNull() & (row.isNull() | newer)


def postgres_condition(table: Any, version: str) -> Any:
    """Return the ``psycopg2.sql`` condition of an upsert's ``DO UPDATE ... WHERE``: the ``EXCLUDED`` change is newer
    than ``table``'s row.

    :param table: the target table's ``sql.Identifier``.
    """
    from psycopg2 import sql

    return sql.SQL("{t}.{v} < EXCLUDED.{v}").format(t=table, v=sql.Identifier(version))
