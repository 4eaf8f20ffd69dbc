"""The full load as a Spark job: plan chunks, read them in waves (one snapshot each), publish atomically.

Where the guarantees live:

* chunk progress  -> the staging manifest (:mod:`.staging`), replaced only after Spark committed the wave;
* the publish     -> ONE Delta commit of all chunks, carrying the handoff positions in the same commit
                     (:func:`exactly_once_provider.delta_commit.commit_with_marker`);
* positions       -> read back with :func:`exactly_once_provider.full_load.handoff.read_handoff`.

A crash before the publish leaves the sink untouched and a manifest of finished chunks; the rerun reads
only the unfinished ones. A crash after the Delta commit is harmless: the rerun's commit has the same
``(txnAppId, txnVersion)`` and Delta skips it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from exactly_once_provider import delta_commit
from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.faults import fault_point
from exactly_once_provider.full_load import handoff
from exactly_once_provider.full_load.columns import META_COLUMNS, Column, table_columns
from exactly_once_provider.full_load.plan import chunk_to_json
from exactly_once_provider.full_load.spark_source import FORMAT, MySqlChunkDataSource, chunk_read_options, spark_schema
from exactly_once_provider.full_load.staging import Staging
from exactly_once_provider.hooks.mysql_identifiers import quote_table
from exactly_once_provider.hooks.mysql_snapshot import plan_chunks
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook

log = logging.getLogger(__name__)
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class FullLoadRequest:
    """What to load and how.

    :param schema: source database name.
    :param table: source table name.
    :param sink_path: the Delta table to publish into (replaced atomically).
    :param staging_path: where staged chunks and the manifest live; default ``<sink_path>._eo_full_load``.
    :param chunk_rows: target rows per chunk (one Spark partition, one snapshot each).
    :param chunks_per_job: chunks per Spark job (a "wave"); progress is saved after each wave.
    :param chunk_key: columns of a unique NOT NULL index to chunk by instead of the primary key.
    :param fetch_rows: rows per server-side cursor fetch (one Arrow batch).
    :param full_reload: forget a load in progress or published and start a new snapshot.
    :param expected_rows_per_second: planned load speed for the binlog retention check.
    :param require_replication: require REPLICATION SLAVE for the capture that follows.
    """

    schema: str
    table: str
    sink_path: str
    staging_path: str | None = None
    chunk_rows: int = 100_000
    chunks_per_job: int = 2
    chunk_key: tuple[str, ...] | None = None
    fetch_rows: int = 10_000
    full_reload: bool = False
    expected_rows_per_second: float = 20_000
    require_replication: bool = True

    def staging(self) -> Staging:
        return Staging(self.staging_path or self.sink_path.rstrip("/") + "._eo_full_load")


@dataclass(frozen=True)
class Progress:
    """Where a running load stands."""

    chunks_done: int
    chunks_total: int
    rows: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class FullLoadResult:
    """The published load: its handoff (positions) and what this run did."""

    handoff: handoff.Handoff
    chunks_read: int
    chunks_resumed: int
    seconds: float
    already_published: bool = False
    stats: dict = field(default_factory=dict)


def _log_progress(p: Progress) -> None:
    log.info("full load: %d/%d chunks, %d rows, %.0f rows/s", p.chunks_done, p.chunks_total, p.rows,
             p.rows_per_second)


def run_full_load(spark, hook: MySqlSourceHook, request: FullLoadRequest,
                  progress: Callable[[Progress], None] = _log_progress) -> FullLoadResult:
    """Load ``request.table`` into ``request.sink_path``, resuming a crashed load; return the handoff.

    :param spark: the SparkSession (local or cluster) to run on.
    :param hook: the source hook (its connection is resolved on the driver; executors get its settings).
    :param request: what to load.
    :param progress: called after each finished wave.
    """
    started = time.monotonic()
    staging = request.staging()
    if request.full_reload:
        staging.reset()
    manifest = staging.load()
    if manifest and manifest.get("published"):
        version = manifest["published"]["table_version"]
        return FullLoadResult(handoff.parse(version, manifest["published"]["marker"]), 0, len(manifest["done"]),
                              time.monotonic() - started, already_published=True)
    checked = hook.preflight(request.schema, request.table, request.chunk_key, request.expected_rows_per_second,
                             request.require_replication)
    with hook._cursor() as cur:
        columns = [c.to_json() for c in table_columns(cur, request.schema, request.table)]
        _check_column_names(request.schema, request.table, [c["name"] for c in columns])
        if manifest is None:
            chunks = plan_chunks(cur, request.schema, request.table, checked.key.columns, request.chunk_rows)
            manifest = {"format": MANIFEST_FORMAT, "load_id": uuid.uuid4().hex, "schema": request.schema,
                        "table": request.table, "key": list(checked.key.columns), "columns": columns,
                        "chunks": [chunk_to_json(c) for c in chunks], "done": {}, "published": None}
            staging.save(manifest)
            log.info("full load %s: planned %d chunks of ~%d rows by key %s", manifest["load_id"], len(chunks),
                     request.chunk_rows, list(checked.key.columns))
    _check_resumable(hook, request, manifest, columns, list(checked.key.columns))
    resumed = len(manifest["done"])
    for orphan in staging.remove_unlisted_waves(manifest):
        log.info("full load: removed wave %s left unfinished by an earlier run", orphan)
    spark.dataSource.register(MySqlChunkDataSource)
    settings = hook.connection_settings()
    staged_schema = spark_schema([Column(**c) for c in columns])
    pending = [c for c in manifest["chunks"] if str(c["index"]) not in manifest["done"]]
    total, read_rows = len(manifest["chunks"]), 0
    size = max(1, request.chunks_per_job)
    for start in range(0, len(pending), size):
        wave, wave_id = pending[start:start + size], uuid.uuid4().hex
        options = chunk_read_options(settings, checked.server.is_mariadb, request.schema, request.table,
                                     [Column(**c) for c in columns], checked.key.columns, wave, request.fetch_rows)
        path = staging.wave_path(wave_id)
        spark.read.format(FORMAT).options(**options).load().write.mode("errorifexists").parquet(path)
        markers = (spark.read.schema(staged_schema).parquet(path).where("_eo_marker")
                   .select("_eo_chunk", "_eo_binlog_file", "_eo_binlog_pos", "_eo_rows").collect())
        found = sorted(m[0] for m in markers)
        if found != sorted(c["index"] for c in wave):
            raise delta_commit.CommitMarkerError(f"Wave {wave_id} staged chunk markers {found}, expected "
                                                 f"{sorted(c['index'] for c in wave)}.")
        for index, file, pos, rows in markers:
            manifest["done"][str(index)] = {"wave": wave_id, "file": file, "pos": int(pos), "rows": int(rows)}
            read_rows += int(rows)
        staging.save(manifest)  # the chunk progress marker, after Spark committed the wave's files
        progress(Progress(len(manifest["done"]), total, read_rows, time.monotonic() - started))
    fault_point("full_load_before_publish")  # every chunk staged, nothing visible yet
    version, body = _publish(spark, request, manifest)
    fault_point("full_load_published")  # the Delta commit exists, the manifest does not know it yet
    manifest["published"] = {"table_version": version, "marker": body}
    staging.save(manifest)
    return FullLoadResult(handoff.parse(version, body), len(pending), resumed, time.monotonic() - started)


# Delta refuses these characters in column names (unless the table uses column mapping, which this load's
# plain overwrite does not set up). Checked before any chunk is read, not after the whole table was staged.
DELTA_INVALID_NAME_CHARACTERS = " ,;{}()\n\t="


def _check_column_names(schema: str, table: str, names: list[str]) -> None:
    bad = [name for name in names if any(ch in DELTA_INVALID_NAME_CHARACTERS for ch in name)]
    if bad:
        raise SourceConfigurationError(
            f"Columns {bad} of {quote_table(schema, table)} contain characters a Delta table cannot hold in a "
            f"column name (any of {DELTA_INVALID_NAME_CHARACTERS!r}): rename them in the source "
            "(ALTER TABLE ... RENAME COLUMN) before the full load.")


def _check_resumable(hook: MySqlSourceHook, request: FullLoadRequest, manifest: dict, columns: list[dict],
                     key: list[str]) -> None:
    """Refuse to resume when staged chunks no longer match the table or their positions were purged."""
    same = (manifest["schema"], manifest["table"], manifest["key"], manifest["columns"]) == (
        request.schema, request.table, key, columns)
    if not same:
        raise ValueError(
            f"The staged full load in {request.staging().root} is for a different table, key or column list "
            f"than {request.schema}.{request.table} now has: rerun with full_reload=True to start a new snapshot."
        )
    retained = set(hook.binary_logs())
    purged = sorted({d["file"] for d in manifest["done"].values()} - retained)
    if purged:
        raise SourceConfigurationError(
            f"Binlog files {purged} holding finished chunks' snapshot positions were purged: the capture could "
            "not continue from them. Rerun with full_reload=True (and raise binlog_expire_logs_seconds)."
        )


def _publish(spark, request: FullLoadRequest, manifest: dict) -> tuple[int, dict]:
    """Write every staged chunk as one Delta commit that carries the handoff positions."""
    done = manifest["done"]
    chunks = [{**c, **{k: v for k, v in done[str(c["index"])].items() if k != "wave"}} for c in manifest["chunks"]]
    body = handoff.marker(manifest["load_id"], manifest["schema"], manifest["table"], tuple(manifest["key"]),
                          chunks)
    waves = sorted({request.staging().wave_path(d["wave"]) for d in done.values()})
    staged = spark.read.schema(spark_schema([Column(**c) for c in manifest["columns"]])).parquet(*waves)
    data = staged.where("NOT _eo_marker").drop(*META_COLUMNS)
    staged_rows = staged.where("NOT _eo_marker").count()
    if staged_rows != body[handoff.MARKER_KEY]["rows"]:
        raise delta_commit.CommitMarkerError(
            f"Staged chunks hold {staged_rows} rows but their markers count {body[handoff.MARKER_KEY]['rows']}: "
            f"the staging area {request.staging().root} is damaged; rerun with full_reload=True."
        )
    version = delta_commit.commit_with_marker(data, request.sink_path, body, f"eo-full-load-{manifest['load_id']}",
                                              1, mode="overwrite")
    return version, body
