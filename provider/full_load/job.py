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
from exactly_once_provider.sinks.durable import fsync_dir
from exactly_once_provider.source.identifiers import quote_table
from exactly_once_provider.source.snapshot import plan_chunks
from exactly_once_provider.storage import is_s3

if TYPE_CHECKING:  # the hook is the caller's; the domain only calls its public methods
    from exactly_once_provider.hooks.mysql_source import MySqlSourceHook

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
    :param chunk_rows: target rows per chunk (one Spark partition, one snapshot each).
    :param chunks_per_job: chunks per Spark job (a "wave"); progress is saved after each wave.
    :param chunk_key: columns of a unique NOT NULL index to chunk by instead of the primary key.
    :param fetch_rows: rows per Arrow batch read from the source (a server-side cursor fetch for the row reader).
    :param reader: ``native`` reads MariaDB chunks into Arrow in native code (connectorx); ``rows`` reads them
        through mysqlclient rows (slower; what MySQL always uses). Both load the same values.
    :param full_reload: forget a load in progress or published and start a new snapshot.
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
    chunk_rows: int = 100_000
    chunks_per_job: int = 2
    chunk_key: tuple[str, ...] | None = None
    fetch_rows: int = 10_000
    reader: str = "native"
    full_reload: bool = False
    expected_rows_per_second: float = 20_000
    require_replication: bool = True
    version_base: int = 0
    server_id: int | None = None

    def validate(self) -> FullLoadRequest:
        """Return the request; raise ValueError naming the first setting that is wrong (checked by the operator
        before it submits the job, and by the job itself)."""
        if not self.schema or not self.table or not self.sink_path:
            raise ValueError("schema, table and sink_path must be non-empty.")
        if not isinstance(self.version_base, int) or self.version_base < 0:
            raise ValueError(f"version_base must be a non-negative integer, got {self.version_base!r}.")
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
    log.info("full load: %d/%d chunks, %d rows, %.0f rows/s", p.chunks_done, p.chunks_total, p.rows, p.rows_per_second)


def run_full_load(
    spark, hook: MySqlSourceHook, request: FullLoadRequest, progress: Callable[[Progress], None] = _log_progress
) -> FullLoadResult:
    """Load ``request.table`` into ``request.sink_path``, resuming a crashed load; return the handoff.

    :param spark: the SparkSession (local or cluster) to run on.
    :param hook: the source hook (its connection is resolved on the driver; executors get its settings).
    :param request: what to load.
    :param progress: called after each finished wave.
    """
    request.validate()
    started = time.monotonic()
    phases: dict[str, float] = {}
    staging = request.staging()
    if request.full_reload:
        staging.reset()
    manifest = staging.load()
    if manifest and manifest.get("published"):
        version = manifest["published"]["table_version"]
        return FullLoadResult(
            handoff.parse(version, manifest["published"]["marker"]),
            0,
            len(manifest["done"]),
            time.monotonic() - started,
            already_published=True,
        )
    checked = hook.preflight(
        request.schema, request.table, request.chunk_key, request.expected_rows_per_second, request.require_replication
    )
    with hook.cursor() as cur:
        cur.execute("SELECT @@server_id")
        server_id = int(cur.fetchone()[0])
        if request.server_id is not None and server_id != request.server_id:
            raise SourceConfigurationError(
                f"The full load's version base {request.version_base} was found for server_id {request.server_id},"
                f" but the connection now reaches server_id {server_id} (it changed during the task): retry it."
            )
        columns = [c.to_json() for c in table_columns(cur, request.schema, request.table)]
        _check_column_names(request.schema, request.table, [c["name"] for c in columns])
        if manifest is None:
            chunks = plan_chunks(cur, request.schema, request.table, checked.key.columns, request.chunk_rows)
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
            }
            staging.save(manifest)
            log.info(
                "full load %s: planned %d chunks of ~%d rows by key %s",
                manifest["load_id"],
                len(chunks),
                request.chunk_rows,
                list(checked.key.columns),
            )
    _check_resumable(hook, request, manifest, columns, list(checked.key.columns))
    staged_base = int(manifest.get("version_base") or 0)
    staged_server = manifest.get("server_id", server_id)  # a load staged before servers were recorded: this one
    if request.server_id is not None and (staged_base, staged_server) != (request.version_base, server_id):
        raise ValueError(
            f"The staged full load in {staging.root} took version base {staged_base} on server_id "
            f"{staged_server}, but the capture's base on server_id {server_id} is now "
            f"{request.version_base} (the capture moved on since): rerun with full_reload=True."
        )
    resumed = len(manifest["done"])
    for orphan in staging.remove_unlisted_files(manifest):
        log.info("full load: removed staged file %s an unfinished task left behind", orphan)
    settings = hook.connection_settings()
    if checked.server.is_mariadb and request.reader == "native":
        connectorx_tls_query(settings.ssl, settings.ssl_mode)  # TLS it cannot take: refused now, not on an executor
    pending = [c for c in manifest["chunks"] if str(c["index"]) not in manifest["done"]]
    total, read_rows = len(manifest["chunks"]), 0
    size = max(1, request.chunks_per_job)
    phases["prepare"] = time.monotonic() - started
    for start in range(0, len(pending), size):
        wave = pending[start : start + size]
        options = chunk_read_options(
            settings,
            checked.server.is_mariadb,
            request.schema,
            request.table,
            [Column(**c) for c in columns],
            checked.key.columns,
            wave,
            request.fetch_rows,
            manifest["load_id"],
            str(staging.data_dir),
            request.reader,
            int(manifest.get("version_base") or 0),
            _s3_settings(staging),
        )
        wave_started = time.monotonic()
        results = read_chunks(spark, options)
        phases["read_and_stage"] = phases.get("read_and_stage", 0.0) + time.monotonic() - wave_started
        found = sorted(r["chunk"] for r in results)
        if found != sorted(c["index"] for c in wave):
            raise delta_commit.CommitMarkerError(
                f"A wave returned chunks {found}, expected {sorted(c['index'] for c in wave)}."
            )
        for r in results:
            manifest["done"][str(r["chunk"])] = {
                "file": r["binlog_file"],
                "pos": int(r["binlog_pos"]),
                "rows": int(r["rows"]),
                "data": r["data_file"],
                "bytes": int(r["data_bytes"]),
                "reader": r["reader"],
            }
            read_rows += int(r["rows"])
        staging.save(manifest)  # the chunk progress marker, after the executors made the wave's files durable
        progress(Progress(len(manifest["done"]), total, read_rows, time.monotonic() - started))
    fault_point("full_load_before_publish")  # every chunk staged, nothing visible yet
    publish_started = time.monotonic()
    version, body = _publish(spark, request, manifest, phases)
    fault_point("full_load_published")  # the Delta commit exists, the manifest does not know it yet
    manifest["published"] = {"table_version": version, "marker": body}
    staging.save(manifest)
    phases["publish"] = time.monotonic() - publish_started
    return FullLoadResult(
        handoff.parse(version, body), len(pending), resumed, time.monotonic() - started, stats={"phases": phases}
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
    hook: MySqlSourceHook, request: FullLoadRequest, manifest: dict, columns: list[dict], key: list[str]
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
    retained = set(hook.binary_logs())
    purged = sorted({d["file"] for d in manifest["done"].values()} - retained)
    if purged:
        raise SourceConfigurationError(
            f"Binlog files {purged} holding finished chunks' snapshot positions were purged: the capture could "
            "not continue from them. Rerun with full_reload=True (and raise binlog_expire_logs_seconds)."
        )


# The names data_file_name() gives staged files: <load id>-c<chunk>-<attempt>.parquet.
_STAGED_NAME = re.compile(r"^(?P<load>[0-9a-f]{32})-c\d{6}-[0-9a-f]{12}\.parquet$")


def _publish(spark, request: FullLoadRequest, manifest: dict, phases: dict) -> tuple[int, dict]:
    """Publish every staged chunk as one Delta commit that carries the handoff positions."""
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
        return published.table_version, body  # committed before a crash; the manifest did not know it yet
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
        return delta_commit.create_with_files(sink, schema, listed, body, app_id, 1), body
    staged = spark.read.schema(spark_schema([Column(**c) for c in manifest["columns"]])).parquet(*files.values())
    version = delta_commit.commit_with_marker(staged, request.sink_path, body, app_id, 1, mode="overwrite")
    return version, body


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
