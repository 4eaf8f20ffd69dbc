"""The full load as a Spark job: plan chunks, read them in waves (one snapshot each), publish atomically.

Where the guarantees live:

* chunk progress  -> the staging manifest (:mod:`.staging`), saved only after the wave's Spark job
                     returned every chunk's staged file (durable: fsynced locally, an upload completed on S3)
                     and snapshot position;
* the publish     -> ONE Delta commit of all chunks, carrying the handoff positions in the same commit:
                     a new table adopts the staged files without a rewrite
                     (:func:`exactly_once_provider.sinks.delta_commit.create_with_files`); an existing table is
                     replaced by rewriting them (:func:`exactly_once_provider.sinks.delta_commit.commit_with_marker`);
* positions       -> read back with :func:`exactly_once_provider.full_load.handoff.read_handoff`.

A crash before the publish leaves the sink's table untouched (no Delta log, or the old one) and a manifest of
finished chunks; the rerun reads only the unfinished ones. A crash after the Delta commit is harmless: the
rerun finds its load id in the sink's newest full-load marker (and both commits carry
``(eo-full-load-<load_id>, 1)`` as their Delta ``txn``) and does not commit again.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from exactly_once_provider.connections import connectorx_tls_query
from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.faults import fault_point
from exactly_once_provider.full_load import handoff
from exactly_once_provider.full_load.columns import Column, table_columns
from exactly_once_provider.full_load.plan import chunk_to_json
from exactly_once_provider.full_load.spark_source import chunk_read_options, read_chunks, spark_schema
from exactly_once_provider.full_load.staging import Staging
from exactly_once_provider.sinks import delta_commit
from exactly_once_provider.source.identifiers import quote_table
from exactly_once_provider.source.snapshot import plan_chunks
from exactly_once_provider.storage import is_s3
from exactly_once_provider.storage.durable import fsync_dir

if TYPE_CHECKING:
    from exactly_once_provider.source.server import MySqlSource

log = logging.getLogger(__name__)
MANIFEST_FORMAT = 1
READERS = ("native", "rows")


@dataclass(frozen=True)
class FullLoadRequest:
    """What to load and how.

    :param schema: source database name.
    :param table: source table name.
    :param sink_path: the Delta table to publish into (replaced atomically).
    :param staging_path: where staged chunks and the manifest live: a local (for a cluster: shared) directory or
        ``s3://bucket/prefix``; default ``<sink_path>._eo_full_load``.
    :param chunk_rows: target rows per chunk (one Spark partition, one snapshot each); None: sized from the
        table's row estimate and the application's cores (:func:`auto_chunk_rows`).
    :param chunks_per_job: chunks per Spark job (a "wave"); progress is saved after each wave; None: the
        application's cores (every chunk of a wave read at once).
    :param chunk_key: columns of a unique NOT NULL index to chunk by instead of the primary key.
    :param fetch_rows: rows per Arrow batch read from the source (a server-side cursor fetch for the row reader).
    :param reader: ``native`` reads MariaDB chunks into Arrow in native code (connectorx); ``rows`` reads them
        through mysqlclient rows (slower; what MySQL always uses). Both load the same values.
    :param full_reload: forget a load in progress or published and start a new snapshot (once per ``run_id``: a
        retry of the run that asked for it resumes the snapshot it started).
    :param skip_loaded: leave the table as it is when it holds a full load that ``run_id`` did not take (the
        result is then None): what a load of a whole database does with the tables it loaded before.
    :param run_id: the run asking for the load (an Airflow DAG run), recorded in the staging manifest.
    :param expected_rows_per_second: planned load speed for the binlog retention check.
    :param require_replication: require REPLICATION SLAVE for the capture that follows.
    :param version_base: added to every row's snapshot version: the capture's version base on the server read
        (:func:`exactly_once_provider.capture.resume.full_load_version_base`; 0 before any failover).
    :param server_id: the ``server_id`` that base was found for; the load refuses to read another server.
    """

    schema: str
    table: str
    sink_path: str
    staging_path: str | None = None
    chunk_rows: int | None = None
    chunks_per_job: int | None = None
    chunk_key: tuple[str, ...] | None = None
    fetch_rows: int = 10_000
    reader: str = "native"
    full_reload: bool = False
    expected_rows_per_second: float = 20_000
    require_replication: bool = True
    version_base: int = 0
    server_id: int | None = None
    skip_loaded: bool = False
    run_id: str | None = None

    def validate(self) -> FullLoadRequest:
        """Return the request; raise ValueError naming the first setting that is wrong (checked by the operator
        before it submits the job, and by the job itself)."""
        if not self.schema or not self.table or not self.sink_path:
            raise ValueError("schema, table and sink_path must be non-empty.")
        if not isinstance(self.version_base, int) or self.version_base < 0:
            raise ValueError(f"version_base must be a non-negative integer, got {self.version_base!r}.")
        for name in ("chunk_rows", "chunks_per_job"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer (or None: sized for the table), got {value!r}.")
        if self.reader not in READERS:
            raise ValueError(f"reader must be one of {READERS}, got {self.reader!r}.")
        return self

    @property
    def staging_location(self) -> str:
        """Where the staging area is: ``staging_path``, or next to the sink (on the same store as the sink)."""
        return self.staging_path or self.sink_path.rstrip("/") + "._eo_full_load"

    def staging(self) -> Staging:
        return Staging(self.staging_location)


@dataclass(frozen=True)
class Progress:
    """Where a running load stands (of one table; ``table`` names it)."""

    chunks_done: int
    chunks_total: int
    rows: int
    seconds: float
    table: str = ""

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


@dataclass
class _TableLoad:
    """One table's load between its plan and its publish (driver-side state of :func:`run_full_loads`)."""

    request: FullLoadRequest
    staging: Staging
    manifest: dict
    columns: list[dict]
    is_mariadb: bool
    pending: list[dict]
    resumed: int
    started: float
    estimated_rows: int
    chunk_rows: int
    chunks_per_job: int
    phases: dict = field(default_factory=dict)
    read_rows: int = 0

    @property
    def label(self) -> str:
        return f"{self.request.schema}.{self.request.table}"

    def chunk_weight(self, chunk: dict) -> int:
        """Return the rows a chunk is expected to hold: ``chunk_rows``, less for the last one of a small table
        (the plan cuts every ``chunk_rows`` rows; the row estimate sizes the open-ended last chunk)."""
        total = len(self.manifest["chunks"])
        if chunk["index"] < total - 1:
            return self.chunk_rows
        rest = self.estimated_rows - (total - 1) * self.chunk_rows
        return max(1, min(self.chunk_rows, rest))


# Sizing a table's chunks when the request leaves it open: one wave of `cores` chunks for a table up to
# cores * MAX_AUTO_CHUNK_ROWS rows (the fastest plan measured: every chunk read at once, one Spark job, one
# manifest save), more waves of chunks that size beyond it (a killed load then loses at most one wave); never
# below MIN_AUTO_CHUNK_ROWS (a snapshot, a connection and a file per chunk).
MIN_AUTO_CHUNK_ROWS = 100_000
MAX_AUTO_CHUNK_ROWS = 2_500_000


def auto_chunk_rows(estimated_rows: int, cores: int) -> int:
    """Return the chunk size of a table of about ``estimated_rows`` rows read by ``cores`` cores."""
    cores = max(1, cores)
    waves = max(1, -(-estimated_rows // (cores * MAX_AUTO_CHUNK_ROWS)))
    return max(MIN_AUTO_CHUNK_ROWS, -(-estimated_rows // (cores * waves)))


def result_json(
    h: handoff.Handoff,
    already_published: bool,
    chunks_read: int = 0,
    chunks_resumed: int | None = None,
    seconds: float = 0.0,
) -> dict:
    """Return what a task needs of a published load: its handoff and what this run did (the job's result)."""
    return {
        "load_id": h.load_id,
        "schema": h.schema,
        "table": h.table,
        "rows": h.rows,
        "table_version": h.table_version,
        "min_position": str(h.min_position),
        "max_position": str(h.max_position),
        "already_published": already_published,
        "chunks_read": chunks_read,
        "chunks_resumed": len(h.chunks) if chunks_resumed is None else chunks_resumed,
        "seconds": round(seconds, 3),
        "chunks": [{"index": c.chunk.index, "rows": c.rows, "position": str(c.position)} for c in h.chunks],
    }


def _log_progress(p: Progress) -> None:
    log.info(
        "full load %s: %d/%d chunks, %d rows, %.0f rows/s",
        p.table,
        p.chunks_done,
        p.chunks_total,
        p.rows,
        p.rows_per_second,
    )


def run_full_load(
    spark, source: MySqlSource, request: FullLoadRequest, progress: Callable[[Progress], None] = _log_progress
) -> FullLoadResult:
    """Load ``request.table`` into ``request.sink_path``, resuming a crashed load; return the handoff.

    :param spark: the SparkSession (local or cluster) to run on.
    :param source: the source server (its settings came with the job; executors get them in their options).
    :param request: what to load.
    :param progress: called after each finished wave.
    """
    result = run_full_loads(spark, source, [request], progress)[0]
    if result is None:
        raise ValueError(f"skip_loaded left {request.table} as it is: it has a full load; nothing to return.")
    return result


def run_full_loads(
    spark,
    source: MySqlSource,
    requests: list[FullLoadRequest],
    progress: Callable[[Progress], None] = _log_progress,
) -> list[FullLoadResult | None]:
    """Load several tables in ONE Spark application; return each table's result (None: left as it was).

    Each table is planned, staged and published exactly as a load of its own (its own snapshot per chunk, its
    own manifest, its own Delta commit carrying its handoff positions), but the chunks of all tables are read
    together: a wave (one Spark job) takes chunks of as many tables as fit ``chunks_per_job * chunk_rows``
    expected rows, so a hundred small tables cost a few Spark jobs, not a hundred. Tables are read in order and
    each is published as soon as its last chunk is staged, so after a crash the tables published before it are
    not read again (their manifests say so) and the others resume at their unfinished chunks.

    :param spark: the SparkSession (local or cluster) to run on.
    :param source: the source server (its settings came with the job; executors get them in their options).
    :param requests: what to load, one request per table (a table named twice is refused).
    :param progress: called for a table after each wave that read some of its chunks.
    """
    names = [(r.schema, r.table) for r in requests]
    if len(set(names)) != len(names):
        raise ValueError(f"A full load names a table twice: {names}.")
    results: list[FullLoadResult | None] = [None] * len(requests)
    loads: dict[int, _TableLoad] = {}
    retained = functools.cache(source.binary_logs)  # asked once, after the first preflight checked the binlog is on
    cores = int(spark.sparkContext.defaultParallelism)
    with source.cursor() as cur:
        cur.execute("SELECT @@server_id")
        server_id = int(cur.fetchone()[0])
    for i, request in enumerate(requests):
        prepared = _prepare(source, request, server_id, retained, cores)
        if isinstance(prepared, _TableLoad):
            loads[i] = prepared
        else:
            results[i] = prepared
    if not loads:
        return results
    settings = source.connection_settings()
    if any(load.is_mariadb and load.request.reader == "native" for load in loads.values()):
        connectorx_tls_query(settings.ssl, settings.ssl_mode)  # TLS it cannot take: refused now, not on an executor
    for load in loads.values():
        load.phases["prepare"] = time.monotonic() - load.started
    for i in [i for i, load in loads.items() if not load.pending]:  # every chunk staged by an earlier attempt
        results[i] = _finish(spark, loads.pop(i))
    queue = [(i, chunk) for i, load in loads.items() for chunk in load.pending]
    for wave in _waves(queue, loads):
        by_table: dict[int, list[dict]] = {}
        for i, chunk in wave:
            by_table.setdefault(i, []).append(chunk)
        slots = list(by_table)
        options = [_read_options(settings, loads[i], by_table[i]) for i in slots]
        wave_started = time.monotonic()
        staged = read_chunks(spark, options)
        seconds = time.monotonic() - wave_started
        for slot, i in enumerate(slots):
            load = loads[i]
            mine = [r for r in staged if r.get("slot", 0) == slot]
            found = sorted(r["chunk"] for r in mine)
            if found != sorted(c["index"] for c in by_table[i]):
                raise delta_commit.CommitMarkerError(
                    f"A wave returned chunks {found} of {load.label}, expected {sorted(c['index'] for c in by_table[i])}."
                )
            for r in mine:
                load.manifest["done"][str(r["chunk"])] = {
                    "file": r["binlog_file"],
                    "pos": int(r["binlog_pos"]),
                    "rows": int(r["rows"]),
                    "data": r["data_file"],
                    "bytes": int(r["data_bytes"]),
                    "reader": r["reader"],
                }
                load.read_rows += int(r["rows"])
            load.phases["read_and_stage"] = load.phases.get("read_and_stage", 0.0) + seconds
            load.staging.save(load.manifest)  # the chunk progress marker, after the executors made the files durable
            done = len(load.manifest["done"])
            total = len(load.manifest["chunks"])
            progress(Progress(done, total, load.read_rows, time.monotonic() - load.started, load.label))
            if done == total:
                results[i] = _finish(spark, loads.pop(i))
    return results


# Chunks of one wave at most: a wave is one Spark job, and its chunks' progress is saved only when it ends.
MAX_CHUNKS_PER_WAVE = 64


def _waves(queue: list[tuple[int, dict]], loads: dict[int, _TableLoad]) -> list[list[tuple[int, dict]]]:
    """Cut the chunks of every table, in order, into waves of about ``chunks_per_job * chunk_rows`` expected rows
    (the first table's settings): a big table's waves hold ``chunks_per_job`` chunks, small tables share one."""
    waves: list[list[tuple[int, dict]]] = []
    budget, filled = 0, 0
    for i, chunk in queue:
        load = loads[i]
        weight = load.chunk_weight(chunk)
        if not waves or filled + weight > budget or len(waves[-1]) >= MAX_CHUNKS_PER_WAVE:
            waves.append([])
            budget, filled = load.chunks_per_job * load.chunk_rows, 0
        waves[-1].append((i, chunk))
        filled += weight
    return waves


def _read_options(settings, load: _TableLoad, chunks: list[dict]) -> dict[str, str]:
    request, manifest = load.request, load.manifest
    return chunk_read_options(
        settings,
        load.is_mariadb,
        request.schema,
        request.table,
        [Column(**c) for c in load.columns],
        tuple(manifest["key"]),
        chunks,
        request.fetch_rows,
        manifest["load_id"],
        str(load.staging.data_dir),
        request.reader,
        int(manifest.get("version_base") or 0),
        _s3_settings(load.staging),
    )


def left_as_is(request: FullLoadRequest, manifest: dict | None) -> bool:
    """Return whether ``skip_loaded`` leaves the table as it is: its Delta table holds a full load, and neither
    ``full_reload`` nor a load of this run (``manifest``: its staging manifest) asks for another look."""
    same_run = bool(manifest and request.run_id and manifest.get("run_id") == request.run_id)
    return request.skip_loaded and not request.full_reload and not same_run and handoff.has_full_load(request.sink_path)


def _prepare(
    source: MySqlSource,
    request: FullLoadRequest,
    server_id: int,
    retained: Callable[[], list[str]],
    cores: int,
) -> _TableLoad | FullLoadResult | None:
    """Return a table's load to run, its result when it was published already, or None when it is skipped."""
    request.validate()
    started = time.monotonic()
    staging = request.staging()
    manifest = staging.load()
    same_run = bool(manifest and request.run_id and manifest.get("run_id") == request.run_id)
    if request.full_reload and not same_run:  # a retry of the run that asked for the reload resumes its load
        staging.reset()
        manifest = None
    if manifest and manifest.get("published") and (same_run or not request.skip_loaded):
        version = manifest["published"]["table_version"]
        return FullLoadResult(
            handoff.parse(version, manifest["published"]["marker"]),
            0,
            len(manifest["done"]),
            time.monotonic() - started,
            already_published=True,
        )
    if left_as_is(request, manifest):
        log.info("full load %s.%s: the table holds a full load already; left as it is", request.schema, request.table)
        return None
    checked = source.preflight(
        request.schema, request.table, request.chunk_key, request.expected_rows_per_second, request.require_replication
    )
    if request.server_id is not None and server_id != request.server_id:
        raise SourceConfigurationError(
            f"The full load's version base {request.version_base} was found for server_id {request.server_id},"
            f" but the connection now reaches server_id {server_id} (it changed during the task): retry it."
        )
    with source.cursor() as cur:
        columns = [c.to_json() for c in table_columns(cur, request.schema, request.table)]
        _check_column_names(request.schema, request.table, [c["name"] for c in columns])
        if manifest is None:
            chunk_rows = request.chunk_rows or auto_chunk_rows(int(checked.estimated_rows or 0), cores)
            chunks = plan_chunks(cur, request.schema, request.table, checked.key.columns, chunk_rows)
            manifest = {
                "format": MANIFEST_FORMAT,
                "load_id": uuid.uuid4().hex,
                "schema": request.schema,
                "table": request.table,
                "key": list(checked.key.columns),
                "columns": columns,
                "chunks": [chunk_to_json(c) for c in chunks],
                "done": {},
                "published": None,
                "version_base": request.version_base,
                "server_id": server_id,
                "run_id": request.run_id,
                "chunk_rows": chunk_rows,
            }
            staging.save(manifest)
            log.info(
                "full load %s of %s.%s: planned %d chunks of ~%d rows by key %s",
                manifest["load_id"],
                request.schema,
                request.table,
                len(chunks),
                chunk_rows,
                list(checked.key.columns),
            )
    _check_resumable(request, manifest, columns, list(checked.key.columns), retained)
    staged_base = int(manifest.get("version_base") or 0)
    staged_server = manifest.get("server_id", server_id)  # a load staged before servers were recorded: this one
    if request.server_id is not None and (staged_base, staged_server) != (request.version_base, server_id):
        raise ValueError(
            f"The staged full load in {staging.root} took version base {staged_base} on server_id "
            f"{staged_server}, but the capture's base on server_id {server_id} is now "
            f"{request.version_base} (the capture moved on since): rerun with full_reload=True."
        )
    for orphan in staging.remove_unlisted_files(manifest):
        log.info("full load: removed staged file %s an unfinished task left behind", orphan)
    pending = [c for c in manifest["chunks"] if str(c["index"]) not in manifest["done"]]
    return _TableLoad(
        request,
        staging,
        manifest,
        columns,
        checked.server.is_mariadb,
        pending,
        len(manifest["done"]),
        started,
        int(checked.estimated_rows or 0),
        # a load staged before sizes were recorded: the request's (the default then: 100,000)
        int(manifest.get("chunk_rows") or request.chunk_rows or 100_000),
        request.chunks_per_job or cores,
    )


def _finish(spark, load: _TableLoad) -> FullLoadResult:
    """Publish a table whose every chunk is staged; record the publish in its manifest."""
    fault_point("full_load_before_publish")  # every chunk staged, nothing visible yet
    publish_started = time.monotonic()
    version, body, before = _publish(spark, load.request, load.manifest, load.phases)
    fault_point("full_load_published")  # the Delta commit exists, the manifest does not know it yet
    load.manifest["published"] = {"table_version": version, "marker": body}
    load.staging.save(load.manifest)
    load.phases["publish"] = time.monotonic() - publish_started
    return FullLoadResult(
        handoff.parse(version, body),
        len(load.pending),
        load.resumed,
        time.monotonic() - load.started,
        already_published=before,
        stats={"phases": load.phases},
    )


# Delta refuses these characters in column names (unless the table uses column mapping, which this load's
# plain overwrite does not set up). Checked before any chunk is read, not after the whole table was staged.
DELTA_INVALID_NAME_CHARACTERS = " ,;{}()\n\t="


def _check_column_names(schema: str, table: str, names: list[str]) -> None:
    bad = [name for name in names if any(ch in DELTA_INVALID_NAME_CHARACTERS for ch in name)]
    if bad:
        raise SourceConfigurationError(
            f"Columns {bad} of {quote_table(schema, table)} contain characters a Delta table cannot hold in a "
            f"column name (any of {DELTA_INVALID_NAME_CHARACTERS!r}): rename them in the source "
            "(ALTER TABLE ... RENAME COLUMN) before the full load."
        )


def _check_resumable(
    request: FullLoadRequest, manifest: dict, columns: list[dict], key: list[str], retained: Callable[[], list[str]]
) -> None:
    """Refuse to resume when staged chunks no longer match the table or their positions were purged."""
    same = (manifest["schema"], manifest["table"], manifest["key"], manifest["columns"]) == (
        request.schema,
        request.table,
        key,
        columns,
    )
    if not same:
        raise ValueError(
            f"The staged full load in {request.staging().root} is for a different table, key or column list "
            f"than {request.schema}.{request.table} now has: rerun with full_reload=True to start a new snapshot."
        )
    if any("data" not in d for d in manifest["done"].values()):
        raise ValueError(
            f"The staged full load in {request.staging().root} was staged by an older version of this provider "
            "(per-wave Spark output): rerun with full_reload=True to start a new snapshot."
        )
    purged = sorted({d["file"] for d in manifest["done"].values()} - set(retained()) if manifest["done"] else ())
    if purged:
        raise SourceConfigurationError(
            f"Binlog files {purged} holding finished chunks' snapshot positions were purged: the capture could "
            "not continue from them. Rerun with full_reload=True (and raise binlog_expire_logs_seconds)."
        )


# The names data_file_name() gives staged files: <load id>-c<chunk>-<attempt>.parquet.
_STAGED_NAME = re.compile(r"^(?P<load>[0-9a-f]{32})-c\d{6}-[0-9a-f]{12}\.parquet$")


def _publish(spark, request: FullLoadRequest, manifest: dict, phases: dict) -> tuple[int, dict, bool]:
    """Publish every staged chunk as one Delta commit that carries the handoff positions; return its version,
    the handoff and whether an earlier attempt had committed it already."""
    done = manifest["done"]
    chunks = [
        {**c, **{k: v for k, v in done[str(c["index"])].items() if k in ("file", "pos", "rows")}}
        for c in manifest["chunks"]
    ]
    body = handoff.marker(
        manifest["load_id"],
        manifest["schema"],
        manifest["table"],
        tuple(manifest["key"]),
        chunks,
        manifest["columns"],
        str(request.staging().root),
        int(manifest.get("version_base") or 0),
        manifest.get("server_id"),
    )
    sink = request.sink_path.removeprefix("file://")
    try:
        published = handoff.read_handoff(sink)
    except LookupError:
        published = None
    if published is not None and published.load_id == manifest["load_id"]:
        return published.table_version, body, True  # committed before a crash; the manifest did not know it yet
    staging = request.staging()
    files = _staged_files(staging, sink, done)
    adopt = _can_adopt(sink, staging, manifest["load_id"])
    phases["publish_mode"] = "adopt staged files" if adopt else "rewrite into the existing table"
    app_id = f"eo-full-load-{manifest['load_id']}"
    if adopt:
        os.makedirs(sink, exist_ok=True)
        for name, path in files.items():  # a rename on the same filesystem; a crash leaves some moved: fine
            if path != os.path.join(sink, name):
                os.replace(path, os.path.join(sink, name))
        fsync_dir(sink)
        listed = [
            {"name": e["data"], "bytes": e["bytes"], "rows": e["rows"]}
            for _, e in sorted(done.items(), key=lambda item: int(item[0]))
        ]
        schema = spark_schema([Column(**c) for c in manifest["columns"]]).json()
        return delta_commit.create_with_files(sink, schema, listed, body, app_id, 1), body, False
    staged = spark.read.schema(spark_schema([Column(**c) for c in manifest["columns"]])).parquet(*files.values())
    version = delta_commit.commit_with_marker(staged, request.sink_path, body, app_id, 1, mode="overwrite")
    return version, body, False


def _s3_settings(staging: Staging):
    """Return the S3 settings of a staging area on S3 (its storage's), None for a local one."""
    return getattr(staging.storage, "settings", None) if is_s3(str(staging.root)) else None


def _staged_files(staging: Staging, sink: str, done: dict) -> dict[str, str]:
    """Return name -> location (as Spark names it) of every chunk's staged file, checking its size and row count.

    Both are read from the store itself, locally or on S3 (the object's size, its Parquet footer by range
    requests): a staged file missing, truncated or replaced since its chunk was recorded is refused here.
    """
    import pyarrow.parquet as pq
    from pyarrow import fs

    files = {}
    for index, entry in sorted(done.items(), key=lambda item: int(item[0])):
        name = entry["data"]
        filesystem, path = staging.storage.arrow_path(f"data/{name}")
        location = staging.storage.spark_uri(f"data/{name}")
        info = filesystem.get_file_info(path)
        moved = os.path.join(sink, name)
        if info.type != fs.FileType.File and isinstance(staging.root, Path) and os.path.isfile(moved):
            # already moved into the sink by a publish (a new local table adopting the files) that crashed
            filesystem, path, location = fs.LocalFileSystem(), moved, moved
            info = filesystem.get_file_info(path)
        problem = None
        if info.type != fs.FileType.File:
            problem = "is missing"
        elif info.size != entry["bytes"]:
            problem = f"has {info.size} bytes, not {entry['bytes']}"
        else:
            try:
                rows = pq.read_metadata(path, filesystem=filesystem).num_rows
            except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
                rows, problem = None, f"is not a readable Parquet file ({error})"
            if rows is not None and rows != entry["rows"]:
                problem = f"holds {rows} rows, not {entry['rows']}"
        if problem:
            raise delta_commit.CommitMarkerError(
                f"Staged file {name} of chunk {index} {problem}: the staging area {staging.root} is damaged; rerun "
                "with full_reload=True."
            )
        files[name] = location
    return files


def _can_adopt(sink: str, staging, load_id: str) -> bool:
    """Return whether the staged files can become the sink table as they are: a new table, same filesystem.

    Files an unpublished earlier load moved into the sink directory (same name pattern, another load id)
    are deleted: they were never part of a table (there is no Delta log) and never will be.
    """
    if is_s3(sink) or not isinstance(staging.root, Path):
        return False  # no rename on object stores: Delta's writer rewrites the staged files into the table
    if os.path.isdir(os.path.join(sink, "_delta_log")) and any(
        n.endswith(".json") and not n.startswith(".") for n in os.listdir(os.path.join(sink, "_delta_log"))
    ):
        return False
    # The sink's folder, or its nearest existing parent: the publish creates the missing ones (a table_path whose
    # parent folders do not exist yet is a new table like any other).
    existing = os.path.abspath(sink)
    while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if os.stat(existing).st_dev != os.stat(staging.root).st_dev:
        return False
    for name in os.listdir(sink) if os.path.isdir(sink) else []:
        if (m := _STAGED_NAME.match(name)) and m["load"] != load_id:
            os.unlink(os.path.join(sink, name))
    return True
