"""The two sides of a reconciliation: a MariaDB/MySQL source table and a sink (PostgreSQL or Delta via Spark).

Every side renders the same canonical row hash (:mod:`.canonical`) and answers the three questions of
:class:`~exactly_once_provider.reconcile.engine.Side`. Each side reads ONE consistent state for the whole
reconciliation: the source inside one consistent snapshot (whose binlog position is the comparison's source
position), PostgreSQL inside one REPEATABLE READ transaction, Delta at one table version.

A sink is described by a :class:`SinkSpec`: a plain table whose columns are named like the source's, or
records whose values sit in a JSON column (``json_column`` + ``json_path``, e.g. the CDC apply's
``record_value`` with the row under ``after``, or a settlement window's records with the row under ``row``),
optionally with tombstones (``deleted_column``) and, for Delta CDC, on top of the full-load table
(``base_path``): a key's newest change replaces its full-load row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactly_once_provider.full_load import handoff
from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.reconcile.canonical import MARIADB, POSTGRES, SPARK, Dialect
from exactly_once_provider.reconcile.engine import Ranges, split_ranges
from exactly_once_provider.reconcile.keys import LABEL_SEPARATOR, Key
from exactly_once_provider.sinks import delta_commit

SINK_KINDS = ("delta", "postgres", "iceberg")


@dataclass(frozen=True)
class SinkSpec:
    """Where the sink's rows are and how they are shaped.

    :param kind: ``delta``, ``postgres`` or ``iceberg``.
    :param location: the Delta table path, the PostgreSQL table (``schema.table`` allowed), or the Iceberg table
        (``namespace.table`` in its catalog).
    :param key_column: the sink's key column for plain tables; default: the source key column.
    :param json_column: the column holding each row as JSON (record-shaped sinks).
    :param json_path: the path inside that JSON to the row's object, e.g. ``("after",)`` or ``("row",)``.
    :param deleted_column: a boolean tombstone column; rows where it is true do not count as present.
    :param filter: an SQL predicate in the sink's dialect selecting the rows to compare (e.g. one window).
    :param base_path: Delta CDC only: the full-load Delta table the changes table applies on top of.
    :param key_json_paths: record-shaped sinks: JSON paths tried in order for the key (deletes carry only a
        ``before`` image); default ``json_path`` + key column.
    :param binary_encoding: how the JSON carries binary values: ``hex`` or ``base64``.
    :param version_column: Delta CDC with ``base_path``: the change's source version column (the CDC apply's
        ``source_version``); a change older than its chunk's snapshot does not replace the full-load row.
    """

    kind: str
    location: str
    key_column: str | None = None
    json_column: str | None = None
    json_path: tuple[str, ...] = ()
    deleted_column: str | None = None
    filter: str | None = None
    base_path: str | None = None
    key_json_paths: tuple[tuple[str, ...], ...] = ()
    binary_encoding: str = "hex"
    version_column: str | None = None

    def validate(self) -> None:
        if self.kind not in SINK_KINDS:
            raise ValueError(f"sink kind must be one of {SINK_KINDS}, got {self.kind!r}.")
        if not self.location:
            raise ValueError("The sink needs a location: the Delta table path or the PostgreSQL table.")
        if self.binary_encoding not in ("hex", "base64"):
            raise ValueError(f"binary_encoding must be 'hex' or 'base64', got {self.binary_encoding!r}.")
        if self.base_path and (self.kind != "delta" or not self.json_column):
            raise ValueError("base_path (CDC changes on top of a full load) needs a delta sink with json_column.")
        if self.kind == "iceberg" and (self.json_column or self.filter):
            raise ValueError(
                "An Iceberg sink is reconciled as a plain table (the current table, read with pyiceberg): not a "
                "JSON-record sink (sink_json_column) or a sink_filter."
            )


def _ranges_predicate(key: str, ranges: Ranges | None) -> str:
    if not ranges:
        return "TRUE"
    singles, spans = split_ranges(ranges)
    terms = [f"{key} IN ({', '.join(str(int(k)) for k in singles)})"] if singles else []
    terms += [f"({key} >= {int(lo)} AND {key} < {int(hi)})" for lo, hi in spans]
    return "(" + " OR ".join(terms) + ")"


def _spark_ranges(key: Any, ranges: Ranges) -> Any:
    """Return a Spark Column: ``key`` in ``ranges``, as a balanced tree (a chain of thousands of ORs would
    overflow Catalyst's recursion)."""
    from pyspark.sql import functions as F

    singles, spans = split_ranges(ranges)
    terms = ([key.isin(singles)] if singles else []) + [(key >= lo) & (key < hi) for lo, hi in spans]
    if not terms:
        return F.lit(False)
    while len(terms) > 1:
        terms = [terms[i] | terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


class SqlSide:
    """A side answered by SQL on a DB-API cursor (the MariaDB source, a PostgreSQL sink)."""

    def __init__(
        self,
        label: str,
        dialect: Dialect,
        cursor: Any,
        relation: str,
        key_expr: str,
        hash_expr: str,
        where: str | None = None,
        key_label_expr: str | None = None,
    ) -> None:
        self.label, self.dialect, self.cursor = label, dialect, cursor
        self.relation, self.key, self.hash, self.where = relation, key_expr, hash_expr, where
        self.key_label = key_label_expr
        self.labels: dict[int, str] = {}  # a hashed key's text, for the keys rows() returned

    def _query(self, sql: str) -> list[tuple]:
        self.cursor.execute(sql)  # no parameters: every value in ``sql`` is an int rendered by this module
        return self.cursor.fetchall()

    def _where(self, ranges: Ranges | None) -> str:
        parts = [p for p in (self.where, _ranges_predicate(self.key, ranges) if ranges else None) if p]
        return f" WHERE {' AND '.join(f'({p})' for p in parts)}" if parts else ""

    def key_bounds(self) -> tuple[int | None, int | None]:
        lo, hi = self._query(f"SELECT MIN({self.key}), MAX({self.key}) FROM {self.relation}{self._where(None)}")[0]
        return (None if lo is None else int(lo)), (None if hi is None else int(hi))

    def segments(self, base: int, width: int, ranges: Ranges | None) -> dict[int, tuple[int, int]]:
        cast = "::numeric" if self.dialect is POSTGRES else ""
        rows = self._query(
            f"SELECT FLOOR(({self.key} - {int(base)}){cast} / {int(width)}) AS eo_seg, COUNT(*), SUM({self.hash})"
            f" FROM {self.relation}{self._where(ranges)} GROUP BY 1"
        )
        return {int(seg): (int(n), int(total or 0)) for seg, n, total in rows}

    def rows(self, ranges: Ranges) -> list[tuple[int, int]]:
        label = f", {self.key_label}" if self.key_label else ""
        found = self._query(f"SELECT {self.key}, {self.hash}{label} FROM {self.relation}{self._where(ranges)}")
        if self.key_label:
            self.labels.update((int(r[0]), str(r[2]).replace(chr(31), LABEL_SEPARATOR)) for r in found)
        return [(int(r[0]), int(r[1])) for r in found]


def source_side(
    cursor: Any, schema: str, table: str, key: Key, columns: list[Column], where: str | None = None
) -> SqlSide:
    """Return the MariaDB/MySQL source side; ``cursor`` should be inside a consistent snapshot.

    :param cursor: an open cursor of the source (UTC session).
    :param schema: the database.
    :param table: the table.
    :param key: the key (:class:`~exactly_once_provider.reconcile.keys.Key`).
    :param columns: the columns to compare (key included or not; the key is always hashed first).
    :param where: an SQL predicate on the source selecting the rows to compare.
    """
    q = MARIADB.quote
    parts = [MARIADB.canonical(q(c.name), c) for c in _with_key(key, columns)]
    return SqlSide(
        "source",
        MARIADB,
        cursor,
        f"{q(schema)}.{q(table)}",
        key.expression(MARIADB),
        MARIADB.row_hash(parts),
        where,
        key.label_expression(MARIADB),
    )


def postgres_side(cursor: Any, spec: SinkSpec, key: Key, columns: list[Column]) -> SqlSide:
    """Return a PostgreSQL sink side (``cursor`` inside a REPEATABLE READ transaction)."""
    q = POSTGRES.quote
    relation = ".".join(q(part) for part in spec.location.split("."))
    if spec.json_column and key.hashed:
        raise ValueError(_JSON_KEY_ERROR)
    if spec.json_column:
        key = key.columns[0]

        def raw(name: str, path: tuple[str, ...] = spec.json_path) -> str:
            return f"({q(spec.json_column)}::jsonb #>> '{{{','.join((*path, name))}}}')"

        key_paths = spec.key_json_paths or ((*spec.json_path, key.name),)
        key_expr = (
            "COALESCE("
            + ", ".join(f"({q(spec.json_column)}::jsonb #>> '{{{','.join(p)}}}')::bigint" for p in key_paths)
            + ")"
        )
        if len(key_paths) == 1:
            key_expr = key_expr[len("COALESCE(") : -1]
        parts = [POSTGRES.canonical(raw(c.name), c, True, spec.binary_encoding) for c in _with_key(key, columns)]
    else:
        key_expr = key.expression(POSTGRES, spec.key_column)
        parts = [POSTGRES.canonical(q(c.name), c) for c in _with_key(key, columns)]
    where = (
        " AND ".join(
            p
            for p in (spec.filter and f"({spec.filter})", spec.deleted_column and f"NOT {q(spec.deleted_column)}")
            if p
        )
        or None
    )
    labels = key.label_expression(POSTGRES) if isinstance(key, Key) else None
    return SqlSide("sink", POSTGRES, cursor, relation, key_expr, POSTGRES.row_hash(parts), where, labels)


class SparkSide:
    """A Delta sink side: a DataFrame of ``(k bigint, h decimal)`` read at one table version.

    The first query (the full pass) caches the ``(k, h)`` pairs (16-24 bytes a row, spilling to disk), so the
    bisection levels and key fetches read the cache instead of scanning the table again.
    """

    label = "sink"

    def __init__(self, frame: Any) -> None:
        from pyspark import StorageLevel

        self.frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
        self.labeled = "label" in frame.columns  # a hashed key's text rides along (rows() keeps it)
        self.labels: dict[int, str] = {}

    def close(self) -> None:
        self.frame.unpersist()

    def key_bounds(self) -> tuple[int | None, int | None]:
        lo, hi = self.frame.selectExpr("min(k)", "max(k)").first()
        return lo, hi

    def _filtered(self, ranges: Ranges | None):
        from pyspark.sql import functions as F

        return self.frame if not ranges else self.frame.where(_spark_ranges(F.col("k"), ranges))

    def segments(self, base: int, width: int, ranges: Ranges | None) -> dict[int, tuple[int, int]]:
        rows = (
            self._filtered(ranges)
            .selectExpr(f"CAST(floor((k - {int(base)}) / {int(width)}) AS BIGINT) AS seg", "h")
            .groupBy("seg")
            .agg({"*": "count", "h": "sum"})
            .collect()
        )
        return {int(r["seg"]): (int(r["count(1)"]), int(r["sum(h)"] or 0)) for r in rows}

    def rows(self, ranges: Ranges) -> list[tuple[int, int]]:
        found = self._filtered(ranges).select("k", "h", *(["label"] if self.labeled else [])).collect()
        if self.labeled:
            self.labels.update((int(r["k"]), r["label"].replace(chr(31), LABEL_SEPARATOR)) for r in found)
        return [(int(r["k"]), int(r["h"])) for r in found]


def columns_not_held(spark: Any, spec: SinkSpec, key: Key, columns: list[Column], version: int) -> list[str]:
    """Return the ``columns`` no record of a JSON-record Delta sink holds (at ``version``, within its filter).

    A settlement window keeps each row as the extraction read it: a column added at the source after the window
    was extracted is in none of its records (re-extracting the window adds it). Such a column cannot be compared;
    one that some records hold and others lack can, and a record without it is a difference. Records without
    any key (an empty selection) hold nothing to decide from: nothing is returned.

    :param version: the table version the comparison reads.
    """
    from pyspark.sql import functions as F

    if not spec.json_column or spec.base_path:
        return []
    frame = spark.read.format("delta").option("versionAsOf", version).load(delta_commit.spark_path(spec.location))
    if spec.filter:
        frame = frame.where(spec.filter)
    row = F.get_json_object(F.col(SPARK.quote(spec.json_column)), "$" + "".join(f".{p}" for p in spec.json_path))
    held = {r[0] for r in frame.select(F.explode(F.json_object_keys(row))).distinct().collect()}
    if not held:
        return []
    return [c.name for c in columns if c.name not in held and c.name not in key.names]


def delta_side(
    spark: Any, spec: SinkSpec, key: Key, columns: list[Column], scope: Ranges | None = None, version: int | None = None
) -> SparkSide:
    """Return a Delta sink side read at the table's current version (pinned for the whole comparison).

    :param scope: a plain table: read only the keys in these ranges (an incremental reconciliation: the rows
        outside are never hashed or cached).
    :param version: the version to read the sink at; default its newest.
    """
    from pyspark.sql import functions as F

    q = SPARK.quote
    cols = _with_key(key, columns)

    def pinned(path: str, version: int | None = None):
        if version is None:
            version = delta_commit.newest_version(path)  # from the log's file names, no Spark job
            if version < 0:
                raise ValueError(f"{path} is not a Delta table (no _delta_log commits): check the sink path.")
        return spark.read.format("delta").option("versionAsOf", version).load(delta_commit.spark_path(path))

    key_expr = key.expression(SPARK, spec.key_column)
    label = key.label_expression(SPARK)

    def plain(frame):
        parts = [SPARK.canonical(q(c.name), c) for c in cols]
        return frame.selectExpr(
            f"{key_expr} AS k", f"{SPARK.row_hash(parts)} AS h", *([f"{label} AS label"] if label else [])
        )

    if not spec.json_column:
        frame = pinned(spec.location, version)
        if spec.filter:
            frame = frame.where(spec.filter)
        if spec.deleted_column:
            frame = frame.where(f"NOT {q(spec.deleted_column)}")
        if scope is not None:
            frame = frame.where(_spark_ranges(F.expr(key_expr), scope))
        return SparkSide(plain(frame))
    if key.hashed:
        raise ValueError(_JSON_KEY_ERROR)
    key = key.columns[0]

    def path_of(*parts: str) -> str:
        return "$." + ".".join(parts)

    json = q(spec.json_column)
    key_paths = spec.key_json_paths or ((*spec.json_path, key.name),)
    json_key = (
        "COALESCE(" + ", ".join(f"CAST(get_json_object({json}, '{path_of(*p)}') AS BIGINT)" for p in key_paths) + ")"
    )
    parts = [
        SPARK.canonical(f"get_json_object({json}, '{path_of(*spec.json_path, c.name)}')", c, True, spec.binary_encoding)
        for c in cols
    ]
    if spec.base_path and delta_commit.newest_version(spec.location) < 0:
        # No change applied yet (the apply creates its table with its first batch): the full load is the table.
        loaded = handoff.read_handoff(spec.base_path)
        return SparkSide(plain(pinned(spec.base_path, loaded.table_version)))
    changes = pinned(spec.location, version)
    if spec.filter:
        changes = changes.where(spec.filter)
    deleted = F.col(spec.deleted_column) if spec.deleted_column else F.lit(False)
    version = F.col(spec.version_column) if spec.version_column else F.lit(None)
    keyed = changes.select(
        F.expr(json_key).alias("k"),
        deleted.alias("eo_deleted"),
        version.alias("eo_version"),
        F.expr(SPARK.row_hash(parts)).alias("h"),
    )
    if not spec.base_path:
        return SparkSide(keyed.where("NOT eo_deleted").select("k", "h"))
    # The effective table: a key's newest change (kept by the CDC apply, tombstones included) replaces its
    # full-load row if the change is after the snapshot of the key's chunk; an older change (left from before a
    # full reload) is already in the snapshot, which wins. Keys never changed keep their full-load row.
    loaded = handoff.read_handoff(spec.base_path)
    newer = keyed.where(f"eo_version >= {loaded.snapshot_version_sql('k')}") if spec.version_column else keyed
    base = plain(pinned(spec.base_path, loaded.table_version))
    return SparkSide(
        base.join(newer.select("k"), "k", "left_anti").unionByName(newer.where("NOT eo_deleted").select("k", "h"))
    )


def version_of(position: BinlogPosition) -> int:
    """Return the change-record version at ``position`` (:attr:`BinlogPosition.version`)."""
    return position.version


_JSON_KEY_ERROR = (
    "A sink holding rows as JSON records (sink_json_column) is reconciled on a single integer key; "
    "reconcile the current table (a plain table) for composite or text keys."
)


def _with_key(key: Key | Column, columns: list[Column]) -> list[Column]:
    keys = list(key.columns) if isinstance(key, Key) else [key]
    names = {c.name for c in keys}
    return keys + [c for c in columns if c.name not in names]
