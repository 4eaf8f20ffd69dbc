"""The sink commit primitive: one Delta Lake commit that carries its own progress marker.

Every writer that needs "output and position in the same atomic step" (docs/design.md contract) goes through
this module: the rows are published as ONE Delta commit whose ``commitInfo.userMetadata`` holds the caller's
JSON marker (positions, batch ids...) and whose ``txn`` action holds ``(txnAppId, txnVersion)``. A write
whose ``(app id, version)`` is already committed (Delta's rule: the app's newest txn version is at or above
it) is skipped, so a retry after a crash between the commit and the caller's bookkeeping is a no-op that
returns the same commit.

Markers are read back from the transaction log's JSON commit files with plain Python (no Spark needed), so
a capture process can read them (:mod:`exactly_once_provider.sinks.delta_log`). A table is a local path or an
``s3://``/``s3a://`` URI (or the :class:`~exactly_once_provider.storage.Storage` rooted at it).

Two ways to write the commit, neither of which writes a log entry itself:

* Delta's own writer (:func:`commit_with_marker`, :func:`merge_with_marker`: overwrite, replaceWhere, MERGE;
  the streaming sink's CDC and window modes) with the ``txnAppId``/``txnVersion`` write option. Its txn check
  reconstructs the whole state of every new snapshot, extra Spark jobs per commit that no Delta setting avoids
  (docs/pitfalls.md). The same call registers the app id as read, so a concurrent commit of the same
  ``(app id, version)`` fails with ``ConcurrentTransactionException``.
* Files Spark wrote, committed by delta-rs (:func:`append_with_marker` -> :func:`append_with_files`; the first
  commit of a new table: :func:`create_with_files`; the commit step:
  :func:`exactly_once_provider.sinks.delta_rs.commit`): Spark writes plain Parquet files into a new directory of
  the table, and delta-rs commits them where they are (``commitInfo`` WRITE/Append with the marker, the ``txn``,
  one ``add`` per file with ``numRecords`` and min/max/null counts of the integer columns from the Parquet
  footers; none for strings, so no data skipping on those). What no library does stays here: the txn check on
  the state the commit builds on (:func:`txn_committed`; delta-rs commits a replay of a committed ``(app id,
  version)`` from a fresh snapshot), the marker fence (:func:`check_fence`; both: :func:`fenced`) and, after a lost
  race, both again on the newer state (the commit loop, :mod:`~exactly_once_provider.sinks.commit_loop`): a zombie driver replaying a batch can never add a second copy; a lower version of the same app
  id fails like Delta. Every ``delta.checkpointInterval`` versions a checkpoint is written
  (:func:`checkpoint_if_due`, by delta-rs), as Delta's writer's post-commit step does. **Refused**
  (:func:`check_appendable`; :func:`append_with_marker` then commits through Delta's writer with a WARNING
  naming the reason): column mapping, deletion vectors, row tracking, in-commit timestamps, change data
  feed, clustering / domain metadata, V2 checkpoints, generated / identity / default columns, partitioning,
  CHECK constraints, invariants, NOT NULL columns (the files' rows are never checked), unknown ``delta.*``
  table properties, and a batch whose columns differ from the table's.

Delta's own writer goes through Delta's ``S3SingleDriverLogStore`` on ``s3a://``: its put-if-absent is an
existence check then a plain PUT (safe for one driver at a time, not atomic across drivers: hadoop-aws 3.5.0's
conditional create is only reachable through ``createFile()`` options Delta does not pass). The modes that use
it are idempotent per key (a MERGE by source version, a window replaced whole), every such commit is verified
afterwards (:func:`find_commit` of its txn) and the sink's marker is the source of truth on the next run.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from exactly_once_provider.errors import PipelineError
from exactly_once_provider.sinks import commit_loop, delta_log, delta_rs
from exactly_once_provider.sinks.delta_log import Table, spark_path, table_storage

log = logging.getLogger(__name__)

# Commits of one append when other writers keep committing first: each lost race costs a read of the log only (the
# same files are committed on the newer state), and writers of other app ids appending at once win in turn.
APPEND_ATTEMPTS = 20


class CommitMarkerError(PipelineError):
    """Raise when a Delta commit and its marker disagree (a :class:`PipelineError`: Spark drivers raise it, and
    they import no Airflow)."""


class TableExistsError(CommitMarkerError):
    """Raise when :func:`create_with_files` finds the table already created."""


class UnsupportedTableError(CommitMarkerError):
    """Raise when the own append commit cannot write this table correctly (a feature it does not implement)."""


def _read_commit(table: Table, version: int) -> dict[str, Any]:
    actions: dict[str, Any] = {"txn": []}
    for action in delta_log.read_log_file(table, f"{version:020d}.json"):
        if "commitInfo" in action:
            actions["commitInfo"] = action["commitInfo"]
        elif "txn" in action:
            actions["txn"].append(action["txn"])
    return actions


class ForeignProgressError(CommitMarkerError):
    """A commit carrying the caller's progress-marker key landed after the caller read the table."""


def read_commit(path: Table, version: int) -> dict[str, Any]:
    """Return the actions of commit ``version`` of the Delta table at ``path`` (as :func:`commits` gives them).

    :raises FileNotFoundError: the commit file does not exist (never written, or removed by log cleanup).
    """
    return _read_commit(path, version)


def newest_version(path: Table) -> int:
    """Return the table's newest commit version (-1 when there is no Delta log yet)."""
    return max(delta_log.commit_versions(delta_log.log_names(path, recent=True)), default=-1)


def check_fence(table: Table, fence: tuple[str, int] | None, upto: int) -> None:
    """Fail if a commit after the fence's read version, up to ``upto``, carries the fence's marker key."""
    if fence is None:
        return
    key, read_version = fence
    for version in range(read_version + 1, upto + 1):
        raw = _read_commit(table, version).get("commitInfo", {}).get("userMetadata")
        marker = json.loads(raw) if raw else None
        if isinstance(marker, dict) and key in marker:
            raise ForeignProgressError(
                f"Version {version} of {table_storage(table).uri()} carries a {key!r} marker committed after this writer read "
                f"the table at version {read_version}: another writer commits the same progress."
            )


def commits(path: Table) -> Iterator[tuple[int, dict]]:
    """Yield ``(version, actions)`` of a Delta table's JSON commits, newest first.

    ``actions`` maps ``commitInfo`` to its dict and ``txn`` to the list of transaction actions.

    :param path: the Delta table's location (local path, ``file://`` or ``s3://`` URI) or its storage.
    """
    storage = table_storage(path)
    recent = delta_log.commit_versions(delta_log.log_names(storage, recent=True))
    for version in reversed(recent):
        yield version, _read_commit(storage, version)
    # Older commits only for a caller that reads on: listing the whole log costs what the log has grown to.
    older = [v for v in delta_log.commit_versions(delta_log.log_names(storage)) if recent and v < recent[0]]
    for version in reversed(older):
        yield version, _read_commit(storage, version)


def find_commit(path: Table, app_id: str, version: int) -> int | None:
    """Return the table version that committed ``(app_id, version)``, or None if none did.

    Cheap on long logs: the log is listed from the checkpoint ``_last_checkpoint`` names, and only the JSON
    commits after the newest Delta checkpoint are parsed (newest first; a
    streaming writer finds its own last commit in the first file). Older commits are looked at only when
    the checkpoint's ``txn`` state (Delta keeps the newest version per app id there) says the pair is
    already committed, i.e. on a replay. Like Delta itself, which skips a write whose ``txnVersion`` is at
    or below the app's newest one, every such version counts as committed: when its own commit file was
    cleaned up by log retention, the checkpoint version is returned.

    :param path: the Delta table's location.
    :param app_id: the writer's stable application id.
    :param version: the writer's monotonically increasing version for that app id.
    """
    storage = table_storage(path)
    names = delta_log.log_names(storage, recent=True)
    versions = list(reversed(delta_log.commit_versions(names)))
    if not versions:
        return None
    newest_checkpoint = delta_log.newest_checkpoint(names)
    checkpoint = newest_checkpoint[0] if newest_checkpoint else None

    def matches(table_version: int) -> bool:
        return any(
            t.get("appId") == app_id and int(t.get("version", -1)) == version
            for t in _read_commit(storage, table_version)["txn"]
        )

    for table_version in versions:
        if checkpoint is not None and table_version <= checkpoint:
            break
        if matches(table_version):
            return table_version
    if newest_checkpoint is None:
        return None
    newest = delta_log.checkpoint_state(storage, newest_checkpoint[1])[2].get(app_id)
    if newest is None or newest < version:
        return None
    older = reversed(delta_log.commit_versions(delta_log.log_names(storage)))  # a replay: the whole log, once
    return next((v for v in older if v <= checkpoint and matches(v)), checkpoint)


def latest_marker(path: Table, key: str) -> tuple[int, dict] | None:
    """Return ``(table version, marker)`` of the newest commit whose marker has top-level ``key``.

    :param path: the Delta table's location.
    :param key: the marker kind, e.g. ``"eo_full_load"``.
    """
    for table_version, actions in commits(path):
        raw = actions.get("commitInfo", {}).get("userMetadata")
        if raw:
            marker = json.loads(raw)
            if isinstance(marker, dict) and key in marker:
                return table_version, marker
    return None


def commit_with_marker(
    df: Any,
    path: Table,
    marker: dict,
    app_id: str,
    version: int,
    mode: str = "overwrite",
    replace_where: str | None = None,
) -> int:
    """Write ``df`` to the Delta table at ``path`` as one commit carrying ``marker``; return the table version.

    Idempotent per ``(app_id, version)``: if that pair is already committed nothing is written.

    :param df: the Spark DataFrame to write.
    :param path: the Delta table's location.
    :param marker: JSON-serialisable progress marker stored in ``commitInfo.userMetadata``.
    :param app_id: stable id of the writer (Delta ``txnAppId``).
    :param version: the writer's version for this commit (Delta ``txnVersion``).
    :param mode: ``overwrite`` (atomic replace of the table) or ``append``.
    :param replace_where: with ``overwrite``: replace only the rows matching this predicate (Delta
        ``replaceWhere``; every row of ``df`` must match it), in the same single commit.
    """
    if mode not in ("overwrite", "append"):
        raise ValueError(f"mode must be 'overwrite' or 'append', got {mode!r}.")
    if replace_where and mode != "overwrite":
        raise ValueError("replace_where needs mode='overwrite'.")
    done = find_commit(path, app_id, version)
    if done is not None:
        return done
    writer = (
        df.write.format("delta")
        .mode(mode)
        .option("txnAppId", app_id)
        .option("txnVersion", version)
        .option("userMetadata", json.dumps(marker, sort_keys=True))
    )
    if replace_where:
        writer = writer.option("replaceWhere", replace_where)
    elif mode == "overwrite":
        writer = writer.option("overwriteSchema", "true")
    writer.save(spark_path(path))
    done = find_commit(path, app_id, version)
    if done is None:
        raise CommitMarkerError(f"Delta write to {path} finished but no commit records txn ({app_id}, {version}).")
    return done


_TXN_CONFS = (
    "spark.databricks.delta.write.txnAppId",
    "spark.databricks.delta.write.txnVersion",
    "spark.databricks.delta.commitInfo.userMetadata",
)
_SESSION_TXN = threading.Lock()


def merge_with_marker(
    source: Any,
    path: Table,
    on: str,
    marker: dict,
    app_id: str,
    version: int,
    update_when: str | None = None,
    delete_when: str | None = None,
    evolve_schema: bool = False,
) -> int:
    """MERGE ``source`` into the Delta table at ``path`` as one commit carrying ``marker``; return its version.

    The MERGE counterpart of :func:`commit_with_marker` (added for the streaming CDC apply): Delta takes the
    ``(txnAppId, txnVersion)`` of a DML statement from the session confs
    ``spark.databricks.delta.write.txnAppId/txnVersion`` and the marker from
    ``spark.databricks.delta.commitInfo.userMetadata``; they are set for this statement only. Idempotent per
    ``(app_id, version)`` like :func:`commit_with_marker`. Matched rows are updated (or deleted when
    ``delete_when`` holds) only if ``update_when`` holds; unmatched rows are inserted.

    :param source: the Spark DataFrame of changes (at most one row per key).
    :param path: the Delta table's location; it must exist.
    :param on: the join condition between ``t`` (target) and ``s`` (source), e.g. ``"t.pk = s.pk"``.
    :param marker: JSON-serialisable progress marker stored in ``commitInfo.userMetadata``.
    :param app_id: stable id of the writer (Delta ``txnAppId``).
    :param version: the writer's version for this commit (Delta ``txnVersion``).
    :param update_when: extra condition for matched rows, e.g. ``"s.v > t.v"``.
    :param delete_when: condition (on matched rows that pass ``update_when``) to delete instead of update.
    :param evolve_schema: add the source's columns the table lacks, in the same commit (Delta schema evolution:
        the commit carries the new ``metaData``).
    """
    from delta.tables import DeltaTable

    done = find_commit(path, app_id, version)
    if done is not None:
        return done
    spark = source.sparkSession
    values = (app_id, str(version), json.dumps(marker, sort_keys=True))
    with _SESSION_TXN:  # the confs are the session's: one MERGE at a time among the driver's threads
        for key, value in zip(_TXN_CONFS, values):
            spark.conf.set(key, value)
        try:
            merge = DeltaTable.forPath(spark, spark_path(path)).alias("t").merge(source.alias("s"), on)
            if delete_when:
                cond = f"({update_when}) AND ({delete_when})" if update_when else delete_when
                merge = merge.whenMatchedDelete(condition=cond)
            merge = merge.whenMatchedUpdateAll(condition=update_when).whenNotMatchedInsertAll()
            if evolve_schema:
                merge = merge.withSchemaEvolution()
            merge.execute()
        finally:
            for key in _TXN_CONFS:
                spark.conf.unset(key)
    done = find_commit(path, app_id, version)
    if done is None:
        raise CommitMarkerError(f"Delta MERGE into {path} finished but no commit records txn ({app_id}, {version}).")
    return done


def create_with_files(
    path: Table,
    schema_json: str,
    files: list[dict],
    marker: dict,
    app_id: str,
    version: int,
) -> int:
    """Create a NEW Delta table at ``path`` from Parquet files already in it, in one commit carrying ``marker``.

    The publish of a first full load (added for its speed): the files are adopted where they are, nothing is
    rewritten. delta-rs writes the table's first commit (:func:`~exactly_once_provider.sinks.delta_rs.create`:
    ``metaData``, ``protocol``, the ``txn`` ``(app_id, version)``, one ``add`` per file with its row count and
    integer-column bounds as ``stats``, the marker as ``commitInfo.userMetadata``) with put-if-absent, so the
    table appears with every file at once or not at all, and of two concurrent creators exactly one succeeds.
    Before it the directory is no Delta table; files in it that ``files`` does not list stay invisible.

    Only for a table that has no commit yet (an existing one raises: replace it with
    :func:`commit_with_marker`). Idempotent per ``(app_id, version)`` like :func:`commit_with_marker`.

    :param path: the table's location (or its storage); the files are in it.
    :param schema_json: the Spark schema as JSON (``StructType.json()``); flat, no column mapping.
    :param files: ``{"name", "bytes", "rows"}`` per Parquet file, ``name`` relative to ``path``.
    :param marker: JSON-serialisable progress marker stored in ``commitInfo.userMetadata``.
    :param app_id: stable id of the writer (Delta ``txnAppId``).
    :param version: the writer's version for this commit (Delta ``txnVersion``).
    :raises TableExistsError: the table has a commit already (before the call, or another writer's first).
    """
    done = find_commit(path, app_id, version)
    if done is not None:
        return done
    storage = table_storage(path)
    if newest_version(storage) >= 0:
        raise TableExistsError(f"{storage.uri()} already is a Delta table: replace it with commit_with_marker().")
    now = int(time.time() * 1000)
    adds = add_actions(storage, files, now)
    if not delta_rs.create(storage, schema_json, adds, marker, app_id, version, now, _write_metrics(files)):
        raise TableExistsError(f"Another writer created the Delta table at {storage.uri()} first.")
    return 0


def add_actions(storage: Any, files: list[dict], now: int) -> list[Any]:
    """Return one delta-rs ``AddAction`` per file (its row count and optional column ``stats`` as ``stats``),
    checking each file's size in storage (one listing-free stat per file: local ``stat``, S3 ``HEAD``).

    :param files: ``{"name", "bytes", "rows"[, "stats"]}`` per Parquet file, ``name`` relative to the table.
    """
    from deltalake.transaction import AddAction

    adds = []
    for f in files:
        filesystem, location = storage.arrow_path(f["name"])
        info = filesystem.get_file_info(location)
        if info.size != f["bytes"]:
            raise CommitMarkerError(f"{storage.uri(f['name'])} has {info.size} bytes, not {f['bytes']}.")
        mtime = int(info.mtime.timestamp() * 1000) if info.mtime is not None else now
        stats = json.dumps({"numRecords": f["rows"], **f.get("stats", {})})
        adds.append(AddAction(f["name"], f["bytes"], {}, mtime, True, stats))  # delta-rs URL-encodes the path
    return adds


def remove_actions(files: list[dict], now: int) -> list[Any]:
    """Return one delta-rs ``RemoveAction`` per data file of :func:`~.delta_log.active_files` (its path as the log
    names it)."""
    from deltalake.transaction import RemoveAction

    return [RemoveAction(f["path"], True, now, int(f["size"]), dict(f["partitionValues"])) for f in files]


def _write_metrics(files: list[dict]) -> dict[str, str]:
    """Return the ``operationMetrics`` Delta's own WRITE records (readers count a commit's rows with them)."""
    return {
        "numFiles": str(len(files)),
        "numOutputRows": str(sum(f["rows"] for f in files)),
        "numOutputBytes": str(sum(f["bytes"] for f in files)),
    }


# ------------------------------------------------------------------------------------- own append commits
# What the own append commit writes correctly: plain Parquet files, no partitions, statistics = row counts.
_READER_FEATURES = frozenset({"timestampNtz"})
_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "checkConstraints", "timestampNtz"})
_LEGACY_WRITER_VERSIONS = {4: "change data feed or generated columns", 5: "column mapping", 6: "identity columns"}
# Table properties that change nothing in what an append writes (others starting with "delta." are refused).
_NEUTRAL_PROPERTIES = frozenset(
    {
        "delta.appendOnly",
        "delta.checkpointInterval",
        "delta.logRetentionDuration",
        "delta.deletedFileRetentionDuration",
        "delta.setTransactionRetentionDuration",
        "delta.enableExpiredLogCleanup",
        "delta.dataSkippingNumIndexedCols",
        "delta.dataSkippingStatsColumns",
        "delta.checkpoint.writeStatsAsJson",
        "delta.checkpoint.writeStatsAsStruct",
        "delta.isolationLevel",
        "delta.minReaderVersion",
        "delta.minWriterVersion",
    }
)
_OFF_PROPERTIES = {
    "delta.enableChangeDataFeed": "false",
    "delta.enableDeletionVectors": "false",
    "delta.enableRowTracking": "false",
    "delta.enableInCommitTimestamps": "false",
    "delta.columnMapping.mode": "none",
    "delta.enableTypeWidening": "false",
}
# Each own append's files: a new directory of the table (visible to VACUUM, which removes a killed writer's
# orphans after the retention period; names starting with "_" or "." would hide them from it forever).
DATA_PREFIX = "eo-"


def _fields(schema: dict, prefix: str = "") -> Iterator[tuple[str, dict]]:
    """Yield ``(dotted name, field)`` of every struct field in a Spark schema (JSON form), nested ones too."""
    kinds = [schema]
    while kinds:
        kind = kinds.pop()
        if not isinstance(kind, dict):
            continue
        if kind.get("type") == "struct":
            for f in kind["fields"]:
                yield prefix + f["name"], f
                kinds.append(f["type"])
        elif kind.get("type") == "array":
            kinds.append(kind["elementType"])
        elif kind.get("type") == "map":
            kinds += [kind["keyType"], kind["valueType"]]


def _shape(kind: Any) -> Any:
    """A Spark type (JSON form) without nullability and column metadata: what two schemas must share."""
    if not isinstance(kind, dict):
        return kind
    if kind.get("type") == "struct":
        return ("struct", tuple((f["name"], _shape(f["type"])) for f in kind["fields"]))
    if kind.get("type") == "array":
        return ("array", _shape(kind["elementType"]))
    if kind.get("type") == "map":
        return ("map", _shape(kind["keyType"]), _shape(kind["valueType"]))
    return json.dumps(kind, sort_keys=True)


def nullable_schema(schema_json: str) -> str:
    """Return ``schema_json`` with every field nullable: what Delta records for a table a DataFrame creates."""

    def relax(kind: Any) -> Any:
        if not isinstance(kind, dict):
            return kind
        if kind.get("type") == "struct":
            return {**kind, "fields": [{**f, "nullable": True, "type": relax(f["type"])} for f in kind["fields"]]}
        if kind.get("type") == "array":
            return {**kind, "containsNull": True, "elementType": relax(kind["elementType"])}
        if kind.get("type") == "map":
            return {
                **kind,
                "valueContainsNull": True,
                "keyType": relax(kind["keyType"]),
                "valueType": relax(kind["valueType"]),
            }
        return kind

    return json.dumps(relax(json.loads(schema_json)))


def check_appendable(state: delta_log.TableState, schema_json: str) -> None:
    """Raise :class:`UnsupportedTableError` unless an own append of ``schema_json`` rows is correct for the table.

    The own commit writes plain Parquet files with row-count statistics and nothing else, so every feature
    that asks a writer to do more is refused by name: column mapping, deletion vectors, row tracking,
    in-commit timestamps, change data feed, clustering, domain metadata, V2 checkpoints, generated or identity
    columns, default values, partitioning, CHECK constraints, invariants and NOT NULL columns (the own commit
    checks no row), any other unknown ``delta.*`` table property; and a batch whose columns (names and types,
    in order) are not the table's.

    :param state: the table's state (:func:`exactly_once_provider.sinks.delta_log.table_state`).
    :param schema_json: the batch's Spark schema as JSON.
    """
    reasons = []
    protocol, metadata = state.protocol, state.metadata
    reader, writer = int(protocol.get("minReaderVersion", 1)), int(protocol.get("minWriterVersion", 1))
    if reader not in (1, 3):
        reasons.append(f"reader version {reader} (column mapping)")
    if writer in _LEGACY_WRITER_VERSIONS or writer > 7:
        reasons.append(f"writer version {writer} ({_LEGACY_WRITER_VERSIONS.get(writer, 'unknown')})")
    features = (set(protocol.get("readerFeatures") or ()) - _READER_FEATURES) | (
        set(protocol.get("writerFeatures") or ()) - _WRITER_FEATURES
    )
    reasons += [f"table feature {f}" for f in sorted(features)]
    if metadata.get("partitionColumns"):
        reasons.append(f"partition columns {metadata['partitionColumns']}")
    if (metadata.get("format") or {}).get("provider", "parquet") != "parquet":
        reasons.append(f"data format {metadata['format']['provider']}")
    for key, value in sorted(state.configuration.items()):
        if key.startswith("delta.constraints."):
            reasons.append(f"CHECK constraint {key.removeprefix('delta.constraints.')}")
        elif (
            key.startswith("delta.")
            and key not in _NEUTRAL_PROPERTIES
            and str(value).lower() != _OFF_PROPERTIES.get(key)
        ):
            reasons.append(f"table property {key}={value}")
    table_schema = json.loads(metadata["schemaString"])
    for name, f in _fields(table_schema):
        if not f.get("nullable", True):
            reasons.append(f"NOT NULL column {name}")
        declared = sorted(k for k in (f.get("metadata") or {}) if k.startswith("delta.") or k.endswith("_DEFAULT"))
        if declared:
            reasons.append(f"column {name} with {', '.join(declared)}")
    if _shape(table_schema) != _shape(json.loads(schema_json)):
        reasons.append(
            f"columns {_column_list(table_schema)} while the batch has {_column_list(json.loads(schema_json))}"
        )
    if reasons:
        raise UnsupportedTableError(
            f"The own append commit does not write the Delta table at {state.path} correctly: "
            f"it has {'; '.join(reasons)}."
        )


def _column_list(schema: dict) -> str:
    return ", ".join(
        f"{f['name']} {f['type'] if isinstance(f['type'], str) else f['type'].get('type')}"
        for f in schema.get("fields", [])
    )


def txn_committed(storage: Any, state: delta_log.TableState, app_id: str, version: int, seen: int | None) -> int | None:
    """Return the table version that holds ``(app_id, version)`` if ``state`` shows it committed, else None.

    Delta's rule, which every own commit checks on the state it builds on: the app's newest txn version at or
    above ``version`` means the write is done (a replay, or a zombie that committed it first). A newer txn of the
    app below ``version`` than the ``seen`` one (read when the writer started) means two writers share the app id.

    :param seen: the app's newest txn version when the writer first read the table (None: none).
    """
    newest = state.txns.get(app_id)
    if newest is not None and newest >= version:
        done = find_commit(storage, app_id, version)
        return state.version if done is None else done
    if newest != seen:
        raise CommitMarkerError(
            f"Another writer committed txn ({app_id}, {newest}) to {storage.uri()} while this one was committing "
            f"({app_id}, {version}): two writers share one app id; run one writer per app id."
        )
    return None


def append_with_files(
    path: Table,
    schema_json: str,
    files: list[dict],
    marker: dict,
    app_id: str,
    version: int,
    fence: tuple[str, int] | None = None,
) -> tuple[int, bool]:
    """Append Parquet files already in the table's directory as ONE commit carrying ``marker``.

    The commit Delta's own blind append would write (``commitInfo`` WRITE/Append with ``userMetadata``, ``txn`` =
    ``(app_id, version)``, one ``add`` per file with its row count), committed by delta-rs as version ``L + 1``
    on the snapshot of ``L``, the table's newest version (:func:`~exactly_once_provider.sinks.delta_rs.commit`).
    Delta's fence is kept: the txn is checked on the state of ``L`` right before the commit; when another writer
    took ``L + 1`` first, the table is read again and checked again (txn, protocol, metadata, the marker fence)
    before the next try, up to :data:`APPEND_ATTEMPTS` tries (the commit loop:
    :func:`~exactly_once_provider.sinks.commit_loop.commit_batch`). So two writers of the same ``(app_id, version)`` (a zombie driver replaying a batch)
    never both commit: the loser finds the winner's txn and writes nothing. A concurrent commit of the same app id
    with a lower version fails the call, as Delta's ``ConcurrentTransactionException`` does.

    :param path: the table's location (or its storage); the files are in it.
    :param schema_json: the files' Spark schema as JSON; it must be the table's (:func:`check_appendable`).
    :param files: ``{"name", "bytes", "rows"}`` per Parquet file, ``name`` relative to ``path``.
    :param marker: JSON-serialisable progress marker stored in ``commitInfo.userMetadata``.
    :param app_id: stable id of the writer (Delta ``txnAppId``).
    :param version: the writer's version for this commit (Delta ``txnVersion``).
    :param fence: ``(marker key, read version)``: fail with :class:`ForeignProgressError` (nothing committed)
        if any commit after the read version carries that marker key, checked against every commit up to
        the one this call commits, so it is a compare-and-set of the marker's predecessor.
    :return: ``(table version, written)``: ``written`` is False when ``(app_id, version)`` was already
        committed (the version is then the one that recorded it, or the table's newest when a higher txn
        version of the app superseded it) and the files were NOT added: the caller removes them.
    :raises UnsupportedTableError: the table (or a concurrent change of it) has a feature the commit does
        not write correctly; nothing was committed.
    :raises ~exactly_once_provider.sinks.commit_loop.LostRacesError: other writers committed first on every try.
    """
    storage = table_storage(path)
    found = delta_rs.snapshot(storage, app_id)
    if found is None:
        raise CommitMarkerError(f"No Delta table at {storage.uri()}: create it with create_with_files().")
    adds = add_actions(storage, files, int(time.time() * 1000))

    def plan_and_commit(snapshot: tuple[Any, delta_log.TableState]) -> int | None:
        table, state = snapshot
        check_appendable(state, schema_json)
        now = int(time.time() * 1000)
        info = {"operationMetrics": _write_metrics(files), "isBlindAppend": True}
        if delta_rs.commit(storage, state.version, adds, marker, app_id, version, now, info, table=table):
            return state.version + 1
        return None  # the files stay: the same ones are committed on the newer state

    def read_again(lost: tuple[Any, delta_log.TableState]) -> tuple[Any, delta_log.TableState]:
        newer = delta_rs.snapshot(storage, app_id)
        if newer is None or newer[1].version <= lost[1].version:
            raise CommitMarkerError(
                f"{storage.uri(delta_log.LOG)} holds commit {lost[1].version + 1} but lists only up to "
                f"{newer[1].version if newer else -1}."
            )
        return newer

    return commit_loop.commit_batch(
        storage.uri(),
        app_id,
        version,
        found,
        lambda snapshot: fenced(storage, snapshot[1], app_id, version, found[1].txns.get(app_id), fence),
        plan_and_commit,
        read_again,
        attempts=APPEND_ATTEMPTS,
    )


def fenced(
    storage: Any,
    state: delta_log.TableState,
    app_id: str,
    version: int,
    seen: int | None,
    fence: tuple[str, int] | None,
) -> int | None:
    """The fence of an own commit on ``state`` (:func:`~.commit_loop.commit_batch`'s ``committed``): return the
    table version holding ``(app_id, version)`` (a replay), else check that no other writer committed this app id
    (:func:`txn_committed`) or the marker (:func:`check_fence`) since the writer read the table, and return None.

    :param seen: the app's newest txn version when the writer first read the table (None: none).
    :param fence: ``(marker key, read version)`` or None (:func:`append_with_files`).
    """
    done = txn_committed(storage, state, app_id, version, seen)
    if done is None:
        check_fence(storage, fence, state.version)
    return done


def append_with_marker(
    df: Any, path: Table, marker: dict, app_id: str, version: int, fence: tuple[str, int] | None = None
) -> int:
    """Append ``df`` to the Delta table at ``path`` as one commit carrying ``marker``; return the table version.

    The fast path of :func:`commit_with_marker` ``mode="append"`` (same result, same idempotence per
    ``(app_id, version)``): Spark writes the rows as Parquet into a new directory of the table,
    ``<path>/eo-<uuid>/`` (nothing is moved afterwards: object stores have no rename), and they are
    committed where they are by :func:`append_with_files` (:func:`create_with_files` for the table's first
    commit), so no Delta state reconstruction runs per commit. Files a writer wrote but did not commit (a
    lost race, a replay) are deleted; those of a killed writer are orphans no commit names, removed by
    ``VACUUM`` like the orphans of Delta's own writer. Every ``delta.checkpointInterval`` versions a checkpoint
    is written (:func:`checkpoint_if_due`), as Delta's writer does after a commit. A table with a feature
    the own commit does not write (:func:`check_appendable`) is written by Delta's writer instead
    (:func:`commit_with_marker`), with a WARNING naming the feature.

    :param df: the Spark DataFrame to append.
    :param path: the Delta table's location (local path, ``file://`` or ``s3://``/``s3a://`` URI) or its storage.
    :param marker: JSON-serialisable progress marker stored in ``commitInfo.userMetadata``.
    :param app_id: stable id of the writer (Delta ``txnAppId``).
    :param version: the writer's version for this commit (Delta ``txnVersion``).
    :param fence: see :func:`append_with_files` (a table Delta's writer commits is checked before the write only).
    """
    import uuid

    storage = table_storage(path)
    done = find_commit(storage, app_id, version)
    if done is not None:
        return done
    schema_json = nullable_schema(df.schema.json())
    state = delta_log.table_state(storage)
    try:
        if state is not None:
            check_appendable(state, schema_json)
    except UnsupportedTableError as err:
        check_fence(storage, fence, newest_version(storage))
        return _with_delta_writer(df, storage, marker, app_id, version, err)
    folder = f"{DATA_PREFIX}{uuid.uuid4().hex}"
    written = False
    try:
        df.write.parquet(storage.spark_uri(folder))
        files = written_files(storage, folder, json.loads(schema_json))
        try:
            table_version, written = _commit_files(storage, schema_json, files, marker, app_id, version, state, fence)
        except UnsupportedTableError as err:  # the table changed under us: nothing of ours was committed
            storage.delete_prefix(folder + "/")
            check_fence(storage, fence, newest_version(storage))
            return _with_delta_writer(df, storage, marker, app_id, version, err)
    finally:
        if not written:  # a replay, a lost race, a failure: no commit names these files
            storage.delete_prefix(folder + "/")
    if written:
        checkpoint_if_due(df.sparkSession, storage, table_version)
    return table_version


def _commit_files(
    path: Any,
    schema_json: str,
    files: list[dict],
    marker: dict,
    app_id: str,
    version: int,
    state: delta_log.TableState | None,
    fence: tuple[str, int] | None,
) -> tuple[int, bool]:
    if state is None:
        try:
            return create_with_files(path, schema_json, files, marker, app_id, version), True
        except TableExistsError:
            pass  # another writer created the table since: append to it
    return append_with_files(path, schema_json, files, marker, app_id, version, fence=fence)


def _with_delta_writer(df: Any, path: Table, marker: dict, app_id: str, version: int, err: Exception) -> int:
    log.warning(
        "%s Committing (%s, %d) through Delta's own writer instead (slower: it rebuilds the table "
        "state for the txn id on every commit).",
        err,
        app_id,
        version,
    )
    return commit_with_marker(df, path, marker, app_id, version, mode="append")


def written_files(storage: Any, folder: str, schema: dict) -> list[dict]:
    """Return name (relative to the table), size, rows and stats of each Parquet file Spark wrote in ``folder``.

    Files without rows are left out (Spark writes one for an empty batch), and so is everything hidden
    (``_SUCCESS``, ``_temporary/`` of failed task attempts): only what Spark's job commit published.
    """
    import pyarrow.parquet as pq

    files = []
    for key in storage.list(folder + "/"):
        name = key[len(folder) + 1 :]
        if "/" in name or not name.endswith(".parquet") or name.startswith((".", "_")):
            continue
        filesystem, location = storage.arrow_path(key)
        footer = pq.read_metadata(location, filesystem=filesystem)
        if footer.num_rows == 0:
            continue
        files.append(
            {
                "name": key,
                "bytes": filesystem.get_file_info(location).size,
                "rows": footer.num_rows,
                "stats": _column_stats(footer, schema),
            }
        )
    return files


def _column_stats(footer: Any, schema: dict) -> dict:
    """Return Delta file statistics of the top-level integral columns from a Parquet footer.

    ``minValues``/``maxValues``/``nullCount`` as Delta's writer records them, for byte/short/integer/long
    columns only: Parquet keeps their exact bounds, so readers can skip files on them (Kafka partition and
    offset in the streaming sink). Other columns get none (Delta's string bounds are truncated prefixes,
    not Parquet's); a column without stats is simply never skipped.
    """
    wanted = {f["name"] for f in schema.get("fields", []) if f["type"] in delta_log.INTEGRAL_TYPES}
    lows: dict[str, int] = {}
    highs: dict[str, int] = {}
    nulls: dict[str, int] = {}
    complete = set(wanted)
    for group in range(footer.num_row_groups):
        row_group = footer.row_group(group)
        for i in range(row_group.num_columns):
            column = row_group.column(i)
            name = column.path_in_schema
            if name not in wanted:
                continue
            stats = column.statistics
            if stats is None or not stats.has_null_count:
                complete.discard(name)
                continue
            nulls[name] = nulls.get(name, 0) + stats.null_count
            if stats.has_min_max:
                lows[name] = min(lows.get(name, stats.min), stats.min)
                highs[name] = max(highs.get(name, stats.max), stats.max)
            elif stats.null_count != row_group.num_rows:  # values without bounds: no bounds for the file
                complete.discard(name)
    result = {
        "minValues": {n: v for n, v in lows.items() if n in complete},
        "maxValues": {n: v for n, v in highs.items() if n in complete},
        "nullCount": {n: v for n, v in nulls.items() if n in complete},
    }
    return {k: v for k, v in result.items() if v}


def checkpoint_if_due(spark: Any, path: Table, version: int) -> bool:
    """Checkpoint ``version`` of the table if its log has ``delta.checkpointInterval`` commits since the newest
    checkpoint; return whether a checkpoint of ``version`` now exists.

    Delta's own writer checkpoints in its post-commit step every ``delta.checkpointInterval`` (default 10)
    versions; own commits do the same, so the log a reader replays stays short. The checkpoint is written by
    delta-rs (``deltalake``: a classic single-file checkpoint and ``_last_checkpoint``, which Delta and every
    reader here read), then the log entries past ``delta.logRetentionDuration`` are cleaned up as Delta's
    checkpoint does. Not through Delta in the JVM: that rebuilds the table state in Spark jobs, measured at 2-5 s
    per checkpoint on 2 cores (every 10th micro-batch of a stream 3-5x slower than the others) against ~40 ms.

    :param spark: the SparkSession (unused: kept for callers; the checkpoint needs no Spark job).
    :param path: the Delta table's location.
    :param version: the table version just committed.
    """
    from deltalake import DeltaTable

    storage = table_storage(path)
    state = delta_log.table_state(storage)
    interval = int(state.configuration.get("delta.checkpointInterval", 10))
    if version - (state.checkpoint or 0) < interval:
        return False
    try:
        table = DeltaTable(storage.uri(), version=version, storage_options=delta_rs.storage_options(storage))
        table.create_checkpoint()
        table.cleanup_metadata()
    except Exception as err:  # an optimisation: the table is complete without it, the next commit tries again
        log.warning(
            "No checkpoint of version %d of %s: %s: %s; the next commit tries again.",
            version,
            storage.uri(),
            type(err).__name__,
            err,
        )
        return False
    written = delta_log.newest_checkpoint(delta_log.log_names(storage, recent=True))
    return written is not None and written[0] >= version
