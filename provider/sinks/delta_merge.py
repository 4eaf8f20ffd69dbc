"""The current table's own MERGE: rewrite only the files that hold a batch's keys, commit them by delta-rs.

Where a streaming batch's changes reach the current table (:mod:`~exactly_once_provider.sinks.current_table`)
when the provider rewrites the files (the default; ``commit_with="delta"`` keeps Delta's MERGE,
:func:`~exactly_once_provider.sinks.delta_commit.merge_with_marker`). Same rows, same commit contents as Delta's
MERGE (``remove`` of each rewritten file, ``add`` of its new version, the ``txn`` and the marker), without what
makes Delta's MERGE cost ~1.5 s per batch on 2 cores whatever the batch size: two snapshot state
reconstructions per commit (one for the txn id, one after it) and their analysis. Measured in
``benchmarks/bench_freshness.py``'s stream log: see docs/benchmarks.md.

The steps, each a plain Spark job or a Python read of the log:

1. the table's state at its newest version ``L`` (:func:`~exactly_once_provider.sinks.delta_log.table_state`,
   :func:`~exactly_once_provider.sinks.delta_log.active_files`): protocol, metadata, txn versions, data files;
2. a table of small files only (a few MB: every file is rewritten with any batch, see
   :data:`SMALL_FILES_TOTAL_BYTES`) goes to step 4 at once: one Spark job per batch, the changes counted as
   they are written (an observation). Otherwise the batch's changes are materialised and summarised first
   (they come from Kafka: read once, used twice; their number, integral key bounds, one change per key), and
3. the data files that hold a key of the batch are found (a semi-join of the files' key columns,
   ``_metadata.file_path``) among the files whose key statistics overlap the batch's keys; no scan when every
   such file is a small one rewritten anyway;
4. those files rewritten with the changes merged in: a row is replaced only by a NEWER version of its key
   (:func:`~exactly_once_provider.sinks.current_table.merge_condition`'s rule), new keys are inserted;
5. version ``L+1`` committed by delta-rs (:func:`~exactly_once_provider.sinks.delta_rs.commit`) on the snapshot of
   ``L``: ``commitInfo`` (``numSourceRows``, the marker), ``txn``, one ``remove`` per rewritten file, one ``add``
   per new file (row count and integer-column bounds).

**The fence** is the own append's (:func:`~exactly_once_provider.sinks.delta_commit.append_with_files`): the txn
is checked on the state the commit builds on; a writer that loses ``L+1`` (delta-rs does not rebase it: a
concurrent writer may have added a key of the batch) drops its files and plans the batch again on the newer
state (a winner with this txn means the batch is already in: nothing is written; the commit loop,
:func:`~exactly_once_provider.sinks.commit_loop.commit_batch`, gives up after
:data:`~exactly_once_provider.sinks.commit_loop.ATTEMPTS` lost plans), so two drivers replaying one
batch never both commit, and no commit removes a file another commit already rewrote. A table with a feature
the own commit does not write
(:func:`~exactly_once_provider.sinks.delta_commit.check_appendable`) is merged by Delta instead, with a WARNING
naming it.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from typing import Any, NamedTuple
from urllib.parse import unquote

from exactly_once_provider.sinks import commit_loop, delta_commit, delta_log, delta_rs, version_rule
from exactly_once_provider.sinks.current_table import VERSION_COLUMN, merge_condition, quoted
from exactly_once_provider.sinks.delta_log import Table, table_storage
from exactly_once_provider.storage import comparable_location

log = logging.getLogger(__name__)

# Small files the batch does not touch are rewritten with it (smallest first, up to a total): a stream of
# inserts would otherwise add a file per micro-batch, every later batch's key scan opening each of them.
SMALL_FILE_BYTES = 4 << 20
SMALL_FILES_TOTAL_BYTES = 16 << 20
_FILE = "_eo_file"


def _files_holding(
    changes: Any, storage: Any, files: dict[str, dict], key: tuple[str, ...], table_schema: Any
) -> list[str]:
    """Return the log paths of the data files that hold a key of ``changes`` (one Spark job)."""
    if not files:
        return []
    from pyspark.sql import functions as F

    by_location = {comparable_location(storage.spark_uri(unquote(path))): path for path in files}
    spark = changes.sparkSession
    keys = table_schema.__class__([table_schema[k] for k in key])
    target = spark.read.schema(keys).parquet(*[storage.spark_uri(unquote(p)) for p in files])
    target = target.select(*[F.col(quoted(k)) for k in key], F.col("_metadata.file_path").alias(_FILE)).alias("t")
    on = [F.col(f"t.{quoted(k)}") == F.col(f"s.{quoted(k)}") for k in key]
    hits = target.join(changes.select(*[F.col(quoted(k)) for k in key]).alias("s"), on, "left_semi")
    found = [row[0] for row in hits.select(_FILE).distinct().collect()]
    paths = [by_location.get(comparable_location(location)) for location in found]
    if None in paths:
        raise delta_commit.CommitMarkerError(
            f"Spark read {found[paths.index(None)]!r}, which no add action of {storage.uri()} names."
        )
    return sorted(paths)


def _files_to_rewrite(
    changes: Any,
    storage: Any,
    files: dict[str, dict],
    key: tuple[str, ...],
    table_schema: Any,
    bounds: dict[str, tuple[int, int]],
) -> list[str]:
    """Return the files a batch rewrites: those holding one of its keys, plus small files to compact.

    The key scan (a Spark job) reads only the files whose statistics may hold a key of the batch, and is left
    out when every such file is a small one rewritten anyway (a table of a few MB: all of it).
    """
    candidates = _may_hold(files, bounds)
    compacted = _small_files(files, [])
    if set(candidates) <= set(compacted):
        return compacted
    touched = _files_holding(changes, storage, {p: files[p] for p in candidates}, key, table_schema)
    return touched + _small_files(files, touched)


def _small_files(files: dict[str, dict], touched: list[str]) -> list[str]:
    """Return the untouched files below :data:`SMALL_FILE_BYTES` to rewrite with the batch, smallest first."""
    small = sorted(
        (int(f["size"]), p) for p, f in files.items() if p not in touched and int(f["size"]) < SMALL_FILE_BYTES
    )
    chosen, total = [], 0
    for size, path in small:
        if total + size > SMALL_FILES_TOTAL_BYTES:
            break
        chosen.append(path)
        total += size
    return chosen


def _merged(
    changes: Any, storage: Any, touched: list[str], key: tuple[str, ...], table_schema: Any, replace_equal: bool
) -> Any:
    """Return the rows of the ``touched`` files with ``changes`` merged in, plus the changes of new keys."""
    spark = changes.sparkSession
    plan = _merge_plan(spark.sparkContext, table_schema.json(), key, replace_equal)
    source = changes.select(*plan.source)
    if not touched:
        return source
    target = spark.read.schema(table_schema).parquet(*[storage.spark_uri(unquote(p)) for p in touched])
    return target.alias("t").join(source.alias("s"), plan.on, "full_outer").select(*plan.merged)


class _MergePlan(NamedTuple):
    """The Spark expressions of :func:`_merged` for one table schema (see :func:`_merge_plan`)."""

    source: list
    on: list
    merged: list


@functools.lru_cache(maxsize=1024)
def _merge_plan(context: Any, schema_json: str, key: tuple[str, ...], replace_equal: bool) -> _MergePlan:
    """Return :func:`_merged`'s expressions, built once per table schema and reused by every batch (they name
    columns only; building them is a Py4J call per column and function).

    :param context: the SparkContext the expressions belong to (a new one builds them again).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    table_schema = StructType.fromJson(json.loads(schema_json))
    columns = [f.name for f in table_schema.fields]
    source = [F.col(quoted(c)).cast(table_schema[c].dataType).alias(c) for c in columns]
    on = [F.col(f"t.{quoted(k)}") == F.col(f"s.{quoted(k)}") for k in key]
    # A key of the batch that is not in the touched files is new; one that is takes the change only if newer.
    take_change = version_rule.takes_change(VERSION_COLUMN, replace_equal)
    merged = [F.when(take_change, F.col(f"s.{quoted(c)}")).otherwise(F.col(f"t.{quoted(c)}")).alias(c) for c in columns]
    return _MergePlan(source, on, merged)


def _merge_info(source_rows: int, removed: list[dict], added: list[dict], on: str) -> dict:
    """Return the ``commitInfo`` fields of the own MERGE that Delta's MERGE records and readers use (delta-rs
    records the operation as a WRITE: ``numSourceRows`` tells the sink's row count it is a MERGE's)."""
    return {
        "operationParameters": {"mode": "Append", "partitionBy": "[]", "predicate": json.dumps([on])},
        "isBlindAppend": False,
        "operationMetrics": {
            "numSourceRows": str(source_rows),
            "numTargetFilesRemoved": str(len(removed)),
            "numTargetFilesAdded": str(len(added)),
            "numOutputRows": str(sum(f["rows"] for f in added)),
            "numTargetBytesRemoved": str(sum(int(f["size"]) for f in removed)),
            "numTargetBytesAdded": str(sum(f["bytes"] for f in added)),
        },
    }


def merge_newer(
    changes: Any,
    path: Table,
    key: tuple[str, ...],
    marker: dict,
    app_id: str,
    version: int,
    replace_equal: bool = False,
    fence: tuple[str, int] | None = None,
) -> int:
    """MERGE ``changes`` into the current table at ``path`` as ONE commit carrying ``marker``; return its version.

    The rows of ``changes`` replace the table's rows of the same key only when their ``_eo_version`` is newer
    (``replace_equal``: or equal); other keys are inserted. Idempotent per ``(app_id, version)`` like
    :func:`~exactly_once_provider.sinks.delta_commit.merge_with_marker`, whose result it has.

    :param changes: the Spark DataFrame of changes, at most one row per key (the current mode's changes are
        grouped by key), with the table's columns. A batch that is summarised first (a table of larger files)
        is refused if two changes share a key.
    :param path: the current table's location (or its storage); it must exist.
    :param key: the source table's primary key columns.
    :param marker: JSON-serialisable progress marker stored in ``commitInfo.userMetadata``.
    :param app_id: stable id of the writer (Delta ``txnAppId``).
    :param version: the writer's version for this commit (Delta ``txnVersion``).
    :param replace_equal: replace a row by a change of the same version too.
    :param fence: ``(marker key, read version)``: fail with
        :class:`~exactly_once_provider.sinks.delta_commit.ForeignProgressError` (nothing committed) if a commit after
        the read version carries that marker key (:func:`~exactly_once_provider.sinks.delta_commit.append_with_files`).
    """
    from pyspark.sql.types import StructType

    storage = table_storage(path)
    done = delta_commit.find_commit(storage, app_id, version)
    if done is not None:
        return done
    on, newer = merge_condition(key, replace_equal=replace_equal)
    changes = changes.persist()
    try:
        summary = functools.cache(lambda: _summary(changes, key))  # once per batch, when a plan needs it
        state = delta_log.table_state(storage)
        if state is None:
            raise delta_commit.CommitMarkerError(
                f"No Delta table at {storage.uri()}: the current table is created by the full load; run it first."
            )
        seen = state.txns.get(app_id)

        def plan_and_commit(state: delta_log.TableState) -> int | None:
            table_schema = StructType.fromJson(json.loads(state.metadata["schemaString"]))
            try:
                delta_commit.check_appendable(state, delta_commit.nullable_schema(table_schema.json()))
                _check_key(state, table_schema, key)
            except delta_commit.UnsupportedTableError as err:
                log.warning(
                    "%s Merging (%s, %d) through Delta's MERGE instead (slower: two table state "
                    "reconstructions per commit).",
                    err,
                    app_id,
                    version,
                )
                return delta_commit.merge_with_marker(changes, storage, on, marker, app_id, version, update_when=newer)
            committed = _rewrite_and_commit(
                changes, storage, state, table_schema, key, marker, app_id, version, replace_equal, summary, on
            )
            if committed is not None:
                delta_commit.checkpoint_if_due(changes.sparkSession, storage, committed)
            return committed

        table_version, _written = commit_loop.commit_batch(
            storage.uri(),
            app_id,
            version,
            state,
            lambda state: delta_commit.fenced(storage, state, app_id, version, seen, fence),
            plan_and_commit,
            lambda lost: delta_log.table_state(storage),
        )
        return table_version
    finally:
        changes.unpersist()


def _summary(changes: Any, key: tuple[str, ...]) -> tuple[int, dict[str, tuple[int, int]]]:
    """Return the number of changes and the bounds ``(min, max)`` of each integral key column, in one job;
    fail if two changes share a key (Delta's MERGE refuses that too: both would land, as two rows of one key)."""
    from pyspark.sql import functions as F

    integral = [
        f.name for f in changes.schema.fields if f.name in key and f.dataType.typeName() in delta_log.INTEGRAL_TYPES
    ]
    bounds = [agg(F.col(quoted(k))) for k in integral for agg in (F.min, F.max)]
    rows, keys, *found = changes.agg(
        F.count(F.lit(1)), F.count_distinct(*[F.col(quoted(k)) for k in key]), *bounds
    ).first()
    if rows != keys:
        raise ValueError(
            f"The batch holds {rows} changes of {keys} keys: a MERGE needs at most one change per key "
            f"({', '.join(key)})."
        )
    return rows, {k: (found[2 * i], found[2 * i + 1]) for i, k in enumerate(integral) if rows}


def _observed_rows(counted: Any, summary: Any) -> int:
    """Return the changes counted while they were written; count them again (:func:`_summary`) when Spark left
    the observation out (it drops it from a plan it proved empty: an empty local DataFrame)."""
    from py4j.protocol import Py4JJavaError

    try:
        return int(counted.get["rows"])
    except (Py4JJavaError, KeyError):
        return summary()[0]


def _may_hold(files: dict[str, dict], bounds: dict[str, tuple[int, int]]) -> list[str]:
    """Return the files whose key statistics overlap the batch's key ``bounds`` (a file without statistics of a
    key column may hold any key): a batch of new keys above every file's range (an auto-increment key's
    inserts) scans no file for them."""

    def overlaps(add: dict) -> bool:
        stats = json.loads(add.get("stats") or "{}")
        lows, highs = stats.get("minValues", {}), stats.get("maxValues", {})
        for column, (low, high) in bounds.items():
            file_low, file_high = lows.get(column), highs.get(column)
            if isinstance(file_low, int) and isinstance(file_high, int) and (file_high < low or file_low > high):
                return False
        return True

    return sorted(path for path, add in files.items() if overlaps(add))


def _check_key(state: delta_log.TableState, table_schema: Any, key: tuple[str, ...]) -> None:
    missing = [k for k in (*key, VERSION_COLUMN) if k not in table_schema.fieldNames()]
    if missing:
        raise delta_commit.UnsupportedTableError(
            f"The current table at {state.path} has no column {', '.join(missing)}."
        )


def _rewrite_and_commit(
    changes: Any,
    storage: Any,
    state: delta_log.TableState,
    table_schema: Any,
    key: tuple[str, ...],
    marker: dict,
    app_id: str,
    version: int,
    replace_equal: bool,
    summary: Any,
    on: str,
) -> int | None:
    """Write the merged files and commit them as ``state.version + 1``; None (nothing left behind) if another
    writer committed that version first.

    :param summary: returns the batch's number of changes and its key bounds (:func:`_summary`), computed once.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    files = delta_log.active_files(state)
    everything = _small_files(files, [])
    counted = None
    if set(files) <= set(everything):  # all of it is rewritten whatever the keys: no summary, no scan
        touched, counted = everything, Observation()
        source = changes.observe(counted, F.count(F.lit(1)).alias("rows"))
    else:
        source_rows, bounds = summary()
        touched = _files_to_rewrite(changes, storage, files, key, table_schema, bounds) if source_rows else []
        source = changes
    folder = f"{delta_commit.DATA_PREFIX}{uuid.uuid4().hex}"
    written = False
    try:
        _merged(source, storage, touched, key, table_schema, replace_equal).write.parquet(storage.spark_uri(folder))
        if counted is not None:
            source_rows = _observed_rows(counted, summary)
        if not source_rows:  # an empty batch (small files were rewritten as they were): its marker alone
            touched = []
            storage.delete_prefix(folder + "/")
        added = delta_commit.written_files(storage, folder, json.loads(table_schema.json())) if source_rows else []
        now = int(time.time() * 1000)
        removed = [files[p] for p in touched]
        actions = [*delta_rs.remove_actions(removed, now), *delta_commit.add_actions(storage, added, now)]
        info = _merge_info(source_rows, removed, added, on)
        written = delta_rs.commit(storage, state.version, actions, marker, app_id, version, now, info)
        return state.version + 1 if written else None
    finally:
        if not written:  # a lost race or a failure: no commit names these files
            storage.delete_prefix(folder + "/")


# ------------------------------------------------------------------------------------ widened column types
# Widenings Delta's MERGE applies by itself on a table with type widening enabled (schema evolution in the MERGE
# writes the wider type and its ``delta.typeChanges``): within one family. An integer to DECIMAL is a widening
# the protocol allows but Delta's MERGE does not apply automatically (it would cast the batch to the old type).
_SAME_FAMILY = (frozenset({"byte", "short", "integer", "long"}), frozenset({"float", "double"}))


def widened_columns(table_schema: dict, changes_schema: Any) -> dict[str, tuple[str, str]]:
    """Return ``{column: (table type, batch type)}`` of the columns the batch holds in another (wider) type.

    :param table_schema: the table's schema (the JSON form of its ``metaData.schemaString``).
    :param changes_schema: the batch's Spark schema (typed by the columns the schema state follows).
    """
    held = {f["name"]: f["type"] for f in table_schema.get("fields", [])}
    return {
        f.name: (_type_name(held[f.name]), _type_name(f.dataType.jsonValue()))
        for f in changes_schema.fields
        if f.name in held and _type_name(held[f.name]) != _type_name(f.dataType.jsonValue())
    }


def _type_name(kind: Any) -> str:
    return kind if isinstance(kind, str) else json.dumps(kind, sort_keys=True)


def widens_in_place(state: delta_log.TableState, widened: dict[str, tuple[str, str]]) -> bool:
    """Return whether Delta's MERGE widens these columns in place (metadata only, no file rewritten): the table
    has ``delta.enableTypeWidening`` and each change stays within its family (integers, floating point, or
    DECIMAL to a DECIMAL)."""
    if str(state.configuration.get("delta.enableTypeWidening", "false")).lower() != "true":
        return False
    for old, new in widened.values():
        decimals = old.startswith("decimal") and new.startswith("decimal")
        if not decimals and not any(old in family and new in family for family in _SAME_FAMILY):
            return False
    return True


def merge_widening(
    changes: Any,
    path: Table,
    key: tuple[str, ...],
    marker: dict,
    app_id: str,
    version: int,
    replace_equal: bool = False,
) -> int:
    """MERGE ``changes`` into the current table and widen its columns to the batch's types: ONE commit that
    rewrites every file of the table; return its version.

    The batch after a widening ``ALTER TABLE`` (``INT`` -> ``BIGINT``, a larger ``DECIMAL``, ``FLOAT`` ->
    ``DOUBLE``) carries the wider types. Every row of the table is read, cast to them (exact: each is a
    widening, :func:`exactly_once_provider.spark_jobs.schema_change.type_change`), merged with the batch by the
    current table's rule (a change replaces a row only if newer; ``replace_equal``: or equal) and written as one
    Delta overwrite with ``overwriteSchema`` carrying the txn id and ``marker``
    (:func:`~exactly_once_provider.sinks.delta_commit.commit_with_marker`): the new schema, the rewritten rows
    and the offsets in one commit, or none of them; a replay finds the txn and writes nothing.

    Why a rewrite and not Delta's ``typeWidening`` table feature (metadata only, the old files keep their
    physical type): that feature is a READER feature, and delta-rs (``deltalake`` 1.6.6, this project's reader
    without Spark: the reconciliation, the PostgreSQL current table's build) refuses every read of such a table.
    A table whose owner enabled ``delta.enableTypeWidening`` is widened in place instead (:func:`widens_in_place`).
    No table feature is added, the table's protocol and properties stay; the columns keep the table's order, new
    ones after them.

    :param changes: the batch's newest change per key, typed with the wider types.
    :param path: the current table's location (or its storage).
    :param key: the source table's primary key columns.
    :param marker: JSON-serialisable progress marker stored in ``commitInfo.userMetadata``.
    :param app_id: stable id of the writer (Delta ``txnAppId``).
    :param version: the writer's version for this commit (Delta ``txnVersion``).
    :param replace_equal: replace a row by a change of the same version too (the batch carries filled rows).
    """
    from pyspark.sql import functions as F

    storage = table_storage(path)
    done = delta_commit.find_commit(storage, app_id, version)
    if done is not None:
        return done
    spark = changes.sparkSession
    table = spark.read.format("delta").load(storage.spark_uri())
    types = {f.name: f.dataType for f in table.schema.fields}
    types.update({f.name: f.dataType for f in changes.schema.fields})
    names = table.columns + [c for c in changes.columns if c not in table.columns]

    def side(frame: Any, rank: int) -> Any:
        held = set(frame.columns)
        return frame.select(
            *[(F.col(quoted(n)) if n in held else F.lit(None)).cast(types[n]).alias(n) for n in names],
            F.lit(rank).alias("_eo_rank"),
        )

    # Newest version per key; at an equal version the table's row stays unless replace_equal (the MERGE's rule).
    both = side(table, 0).unionByName(side(changes, 1 if replace_equal else -1))
    newest = F.max_by(F.struct(*[F.col(quoted(n)) for n in names]), F.struct(VERSION_COLUMN, "_eo_rank"))
    rows = (
        both.groupBy(*[F.col(quoted(k)) for k in key])
        .agg(newest.alias("c"))
        .select(*[F.col("c")[n].alias(n) for n in names])
    )
    log.info(
        "Widening %s of %s: every file rewritten with the batch (%s, %d) in one commit.",
        ", ".join(
            f"{f.name} {f.dataType.simpleString()} -> {types[f.name].simpleString()}"
            for f in table.schema.fields
            if f.dataType != types[f.name]
        ),
        storage.uri(),
        app_id,
        version,
    )
    return delta_commit.commit_with_marker(rows, storage, marker, app_id, version, mode="overwrite")
