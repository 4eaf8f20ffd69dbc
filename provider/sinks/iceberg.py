"""Apache Iceberg sink: Spark writes a batch's Parquet files, the driver commits them in ONE Iceberg snapshot.

There is no Iceberg Spark runtime for the project's Spark (4.2), so Spark only writes plain Parquet files into the
table's data folder (``<table location>/data/<checkpoint id>-<batch id>-<nonce>/``, invisible to readers until a
snapshot lists them) and the driver commits them through pyiceberg's ``add_files`` into ONE snapshot whose summary
carries the batch's fence, as Flink's IcebergSink keeps ``flink.max-committed-checkpoint-id`` and Iceberg's Kafka
Connect sink ``kafka.connect.offsets.*`` there::

    eo.pipeline       the pipeline's stable name (one pipeline per table)
    eo.checkpoint-id  the streaming query id of the checkpoint that planned the batch
    eo.batch-id       Spark's micro-batch id within it
    eo.offsets        the batch's Kafka end offsets, JSON {topic: {partition: next offset}}
    eo.rows-total     rows of this pipeline in the table after the commit
    eo.windows        window mode: every window the table holds, JSON {window id: {"version", "rows"}}
    eo.schema         current mode: the columns the table follows (load id, columns, fills, last statement)

The commit (:meth:`IcebergSink.commit`): load the table; its newest snapshot carrying ``eo.pipeline`` (snapshots of
other writers, e.g. a compaction, are stepped over back to it: :func:`newest_commit`) is the batch's predecessor. A
batch already there is skipped (:func:`~.base.replayed`), a batch planned on another predecessor is refused
(:func:`~.base.require_predecessor`). Then the files are written and committed with the main branch's snapshot id
ASSERTED to be the one read (pyiceberg's ``AssertRefSnapshotId``; the SQL catalog's compare-and-set of the metadata
location besides): a commit of another driver in between fails this one with :class:`~.base.StaleBatchError`, and
it is never retried blindly (a retry would append the batch on top of a snapshot it was not planned on).

The catalog is a SQL catalog (pyiceberg's ``SqlCatalog``: the ``iceberg_tables`` table the Java JDBC catalog uses
too) in a PostgreSQL database, given by an Airflow ``postgres`` connection (:func:`catalog_settings`); the Spark
driver receives its settings in the job's secrets file (``iceberg``) and registers them (:func:`register_catalog`).
Tables on ``s3://`` locations are written through the S3 settings of the job's ``aws`` connection.

Window mode (:meth:`IcebergSink.commit_windows`, settlement): each published window version is written to its own
files, and ONE catalog commit deletes the window's previous rows (a delete by ``window_id``: whole files, since a
window's files hold that window only and the column keeps full min/max metrics) and adds the new files, the fence
(with ``eo.windows``) on its snapshots; a version not newer than the one held is refused
(:func:`~.base.require_newer_windows`).

CDC and current modes (:meth:`IcebergSink._commit_changes`): the batch's newest change per key is merged
copy-on-write (:mod:`~exactly_once_provider.sinks.iceberg_merge`: the files holding its keys rewritten, a newer
version wins, deletes as tombstones) into ONE overwrite snapshot carrying the fence; a commit that lost the race
is planned again on the new snapshot (:mod:`~exactly_once_provider.sinks.commit_loop`), where the fence tells a
replay, a zombie or another writer apart. The
current table is first built from the Delta full load (:mod:`~exactly_once_provider.sinks.iceberg_current`), its
schema state in the summary (``eo.schema``).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from exactly_once_provider.errors import PipelineError
from exactly_once_provider.faults import fault_point
from exactly_once_provider.sinks import commit_loop, iceberg_current, iceberg_merge
from exactly_once_provider.sinks.base import (
    UNCHECKED,
    BatchCommit,
    SchemaChange,
    StaleBatchError,
    offsets_from_json,
    offsets_to_json,
    replayed,
    require_newer_windows,
    require_predecessor,
)
from exactly_once_provider.sinks.current_table import VERSION_COLUMN
from exactly_once_provider.storage import Storage, open_storage

log = logging.getLogger(__name__)

PIPELINE = "eo.pipeline"
CHECKPOINT_ID = "eo.checkpoint-id"
BATCH_ID = "eo.batch-id"
OFFSETS = "eo.offsets"
ROWS_TOTAL = "eo.rows-total"
WINDOWS = "eo.windows"
SCHEMA = "eo.schema"
BUILT_BY = "eo.built-by"
# the key of the schema state in a commit's extra, as spark_jobs.current_changes.SCHEMA_MARKER names it
SCHEMA_MARKER = "schema"
DATA = "data/"
# The append mode's columns and their Iceberg types (what kafka_to_sink's SELECT gives Spark's Parquet writer).
APPEND_COLUMNS = (
    ("kafka_topic", "string"),
    ("kafka_partition", "int32"),
    ("kafka_offset", "int64"),
    ("record_key", "string"),
    ("record_value", "string"),
)
# Window mode's columns (:data:`~.base.WINDOW_COLUMNS`, as settlement.window_rows gives them).
WINDOW_MODE_COLUMNS = (("window_id", "string"), ("window_version", "int64"), *APPEND_COLUMNS)
# CDC mode's columns (what kafka_to_sink.cdc_changes gives): the newest change per ``pk``, deletes as tombstones.
CDC_COLUMNS = (
    ("pk", "string"),
    ("source_version", "int64"),
    ("deleted", "bool"),
    ("record_value", "string"),
    ("kafka_topic", "string"),
    ("kafka_partition", "int32"),
    ("kafka_offset", "int64"),
)
# current mode: the full load's columns (iceberg_current), so no fixed list
MODE_COLUMNS = {"append": APPEND_COLUMNS, "window": WINDOW_MODE_COLUMNS, "cdc": CDC_COLUMNS}
MODES = (*MODE_COLUMNS, "current")
DEFAULT_CATALOG = "eo"
# pyiceberg (0.12) retries a commit that lost the race by rebasing it on the new snapshot: a blind retry, which
# would let a zombie driver append its batch a second time. The sink's tables turn it off, and each commit checks.
NO_RETRY = {"commit.retry.num-retries": "0"}

_registered: dict | None = None


# ------------------------------------------------------------------------------------------- the fence
def summary_properties(commit: BatchCommit) -> dict[str, str]:
    """Return the snapshot summary properties that carry ``commit`` (Iceberg summary values are strings)."""
    summary = {
        PIPELINE: commit.pipeline,
        CHECKPOINT_ID: commit.checkpoint_id,
        BATCH_ID: str(commit.batch_id),
        OFFSETS: json.dumps(offsets_to_json(commit.offsets), sort_keys=True, separators=(",", ":")),
        ROWS_TOTAL: str(commit.rows_total),
    }
    if "windows" in commit.extra:
        summary[WINDOWS] = json.dumps(commit.extra["windows"], sort_keys=True, separators=(",", ":"))
    if SCHEMA_MARKER in commit.extra:  # current mode: the columns the table follows (CurrentChanges' state)
        summary[SCHEMA] = json.dumps(commit.extra[SCHEMA_MARKER], sort_keys=True, separators=(",", ":"))
    return summary


def commit_from_summary(summary: Mapping[str, str]) -> BatchCommit | None:
    """Return the :class:`BatchCommit` a snapshot summary carries, or None for a snapshot of another writer."""
    if PIPELINE not in summary:
        return None
    extra = {"windows": json.loads(summary[WINDOWS])} if WINDOWS in summary else {}
    if SCHEMA in summary:
        extra[SCHEMA_MARKER] = json.loads(summary[SCHEMA])
    return BatchCommit(
        summary[PIPELINE],
        summary[CHECKPOINT_ID],
        int(summary[BATCH_ID]),
        offsets_from_json(json.loads(summary[OFFSETS])),
        int(summary.get(ROWS_TOTAL, 0)),
        extra,
    )


def newest_commit(summaries: Iterator[Mapping[str, str]], pipeline: str, table: str) -> BatchCommit | None:
    """Return the pipeline's newest commit among ``summaries`` (newest first: the main branch's ancestry).

    Snapshots without the fence (another writer's: a compaction, an expiry, a user's own insert) are stepped over;
    a fence of another pipeline is refused, as the files sink refuses another pipeline's manifest.

    :param summaries: the summaries of the current snapshot and its ancestors, newest first.
    :param pipeline: this sink's pipeline.
    :param table: the table's name, for the message.
    """
    for summary in summaries:
        found = commit_from_summary(summary)
        if found is None:
            continue
        if found.pipeline != pipeline:
            raise ValueError(
                f"Iceberg table {table} holds pipeline {found.pipeline!r}, not {pipeline!r}: "
                "give each pipeline its own table."
            )
        return found
    return None


def plan_commit(found: BatchCommit | None, commit: BatchCommit, expected: object) -> bool:
    """Return False when ``commit`` is already in the table (a replay: skip it); raise
    :class:`~.base.StaleBatchError` when the table's newest commit is not the one the batch was planned on.

    :param found: the pipeline's newest commit in the snapshot the commit will be based on.
    :param commit: the batch about to be committed.
    :param expected: the commit the batch was planned on, or :data:`~.base.UNCHECKED`.
    """
    if replayed(found, commit):
        return False
    require_predecessor(found, expected, commit, IcebergSink.kind)
    return True


# ------------------------------------------------------------------------------------------- the catalog
def catalog_settings(conn_id: str, name: str = DEFAULT_CATALOG) -> dict[str, Any]:
    """Return the settings of the SQL catalog in the PostgreSQL database of the Airflow connection ``conn_id``.

    They hold the connection's password: they go to the job's 0600 secrets file only, never to a log line.

    :param conn_id: a ``postgres`` connection (TLS settings in its Extra, as for the PostgreSQL sink).
    :param name: the catalog's name (the ``catalog_name`` column of ``iceberg_tables``; a Java JDBC catalog of the
        same name sees the same tables).
    """
    from exactly_once_provider.connections import connect_kwargs

    return {**sql_catalog(connect_kwargs(conn_id), name), "conn_id": conn_id}


def sql_catalog(postgres: dict[str, Any] | Callable[[], dict], name: str = DEFAULT_CATALOG) -> dict[str, Any]:
    """Return the settings of the SQL catalog ``name`` in the database of ``postgres`` (psycopg2 arguments, or a
    function returning them)."""
    return {"type": "sql", "name": name, "postgres": postgres() if callable(postgres) else postgres}


def register_catalog(settings: dict | None) -> None:
    """Make ``settings`` (the secrets file's ``iceberg``) the catalog of every Iceberg sink this process opens."""
    global _registered
    _registered = settings


def _sqlalchemy_uri(postgres: dict[str, Any]) -> str:
    from sqlalchemy.engine import URL

    query = {k: str(v) for k, v in postgres.items() if k not in ("host", "port", "dbname", "user", "password")}
    url = URL.create(
        "postgresql+psycopg2",
        username=postgres.get("user"),
        password=postgres.get("password"),
        host=postgres.get("host"),
        port=int(postgres["port"]) if postgres.get("port") else None,
        database=postgres.get("dbname"),
        query={k: v for k, v in query.items() if v not in ("None", "")},
    )
    return url.render_as_string(hide_password=False)


def open_catalog(settings: dict[str, Any], s3: Any = None) -> Any:
    """Return the pyiceberg catalog of ``settings`` (:func:`catalog_settings`); ``s3``: the tables' S3 settings."""
    if settings.get("type", "sql") != "sql":
        raise ValueError(f"Iceberg catalog type {settings.get('type')!r} is not supported yet: use a SQL catalog.")
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(
        settings.get("name") or DEFAULT_CATALOG,
        uri=_sqlalchemy_uri(settings["postgres"]),
        # one connection at a time: a driver commits batch after batch, a reader reads once
        pool_pre_ping="true",
        **(s3.pyiceberg_properties() if s3 is not None else {}),
    )


def _iceberg_schema(mode: str):
    import pyarrow as pa

    types = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "bool": pa.bool_()}
    return pa.schema([pa.field(name, types[kind], nullable=True) for name, kind in MODE_COLUMNS[mode]])


# ------------------------------------------------------------------------------------------- the sink
class IcebergSink:
    """Append a pipeline's batches to the Iceberg table ``identifier``, one snapshot per batch, fenced.

    :param identifier: the table, ``namespace.table``.
    :param pipeline: the pipeline's stable name.
    :param catalog: the catalog's settings (:func:`catalog_settings`), a function returning them, or None: those
        the process registered (:func:`register_catalog`, the Spark driver).
    :param location: the table's location, a local path or ``s3://bucket/prefix``: where :meth:`prepare` creates
        it and Spark writes its data files (the writer side; a reader needs only the catalog).
    :param s3: the S3 settings of an ``s3://`` location (default: those the process registered).
    :param mode: ``append``, ``window``, ``cdc`` or ``current`` (the writer side's mode: the table's columns).
    :param key: ``current`` mode: the source table's primary key columns.
    """

    kind = "iceberg"
    # current mode: a schema change is refused for now (CurrentChanges then never reads the table to fill it)
    fills_in_place = True

    def __init__(
        self,
        identifier: str,
        pipeline: str,
        catalog: dict | Callable[[], dict] | None = None,
        location: str | None = None,
        s3: Any = None,
        mode: str = "append",
        key: tuple[str, ...] = (),
    ) -> None:
        if identifier.count(".") < 1:
            raise ValueError(f"An Iceberg table is named 'namespace.table', got {identifier!r}.")
        if mode not in MODES:
            raise ValueError(f"The iceberg sink writes mode {', '.join(MODES)}, not {mode!r}.")
        if mode == "current" and not key:
            raise ValueError("mode='current' needs the source table's key columns.")
        self.key_columns = tuple(key) if mode == "current" else ("pk",)
        self.identifier = identifier
        self.pipeline = pipeline
        self._catalog_settings = catalog
        self._catalog = None
        self.location = location
        self._s3 = s3
        self._storage: Storage | None = None
        self.mode = mode
        # current mode: the full load the table is built from (builds_on)
        self.source: Any = None
        self.source_location: str | None = None
        self.source_options: dict | None = None

    # -- plumbing
    def catalog(self) -> Any:
        if self._catalog is None:
            settings = self._catalog_settings() if callable(self._catalog_settings) else self._catalog_settings
            settings = settings or _registered
            if settings is None:
                raise ValueError(
                    f"The Iceberg sink {self.identifier} has no catalog: name its connection (iceberg_conn_id)."
                )
            s3 = self._s3
            if s3 is None:
                from exactly_once_provider.storage.s3 import registered_settings

                s3 = registered_settings()
            self._catalog = open_catalog(settings, s3)
        return self._catalog

    def storage(self) -> Storage:
        if self._storage is None:
            if not self.location:
                raise ValueError(f"The Iceberg sink {self.identifier} needs its table location (sink_path) to write.")
            self._storage = open_storage(self.location, self._s3)
        return self._storage

    def _load(self) -> Any | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog().load_table(self.identifier)
        except NoSuchTableError:
            return None

    @staticmethod
    def _summaries(table: Any) -> Iterator[Mapping[str, str]]:
        """The summaries of the main branch's current snapshot and its ancestors, newest first."""
        snapshot = table.current_snapshot()
        while snapshot is not None:
            yield snapshot.summary.additional_properties if snapshot.summary else {}
            parent = snapshot.parent_snapshot_id
            snapshot = table.metadata.snapshot_by_id(parent) if parent is not None else None

    def _commit_in(self, table: Any | None) -> BatchCommit | None:
        return None if table is None else newest_commit(self._summaries(table), self.pipeline, self.identifier)

    # -- reader side
    def committed(self) -> BatchCommit | None:
        """Return the pipeline's newest commit (None before the first, or before the table exists)."""
        return self._commit_in(self._load())

    def published_windows(self) -> dict[str, int]:
        """Return window id -> version the table holds (window mode), from the newest fence."""
        found = self.committed()
        return {w: int(v["version"]) for w, v in (found.extra.get("windows", {}) if found else {}).items()}

    def commit_location(self) -> str:
        """Return ``snapshot <id> of <table>`` ("" before the first snapshot)."""
        table = self._load()
        snapshot = table.current_snapshot() if table is not None else None
        return f"snapshot {snapshot.snapshot_id} of {self.identifier}" if snapshot else ""

    # -- writer side
    def prepare(self) -> None:
        """Create the namespace and the table at :attr:`location` if missing; refuse a table elsewhere."""
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError

        catalog = self.catalog()
        namespace = self.identifier.rsplit(".", 1)[0]
        try:
            catalog.create_namespace(namespace)
        except NamespaceAlreadyExistsError:
            pass
        table = self._load()
        location = self.storage().uri().rstrip("/")
        if self.location and not location.startswith("s3://"):
            location = "file://" + location
        dataset = None
        if self.mode == "current":  # the full load the table is built from (builds_on)
            if self.source is None:
                raise ValueError(f"The Iceberg current table {self.identifier} needs its full load (builds_on).")
            dataset = iceberg_current.full_load_dataset(self.source, self.source_location, self.source_options)
        if table is None:
            from pyiceberg.table.name_mapping import create_mapping_from_schema

            try:
                # window mode: full min/max of window_id, so a window's files are deleted whole, never rewritten
                metrics = {"write.metadata.metrics.column.window_id": "full"} if self.mode == "window" else {}
                table = catalog.create_table(
                    self.identifier,
                    schema=(
                        iceberg_current.table_schema(self.source, dataset) if dataset else _iceberg_schema(self.mode)
                    ),
                    location=location,
                    properties={"format-version": "2", **NO_RETRY, **metrics},
                )
            except TableAlreadyExistsError:  # another driver created it meanwhile
                table = self._load()
            else:
                # Spark's files carry no Iceberg field ids: readers map their columns by name.
                with table.transaction() as tx:
                    tx.set_properties(
                        **{"schema.name-mapping.default": create_mapping_from_schema(table.schema()).model_dump_json()}
                    )
                log.info("iceberg sink: created table %s at %s", self.identifier, location)
        if table.location().rstrip("/") != location:
            raise ValueError(
                f"Iceberg table {self.identifier} lives at {table.location()}, not at sink_path {self.location}: "
                "name the table's own location, or another table."
            )
        columns = [field.name for field in table.schema().fields]
        if dataset is None and columns != [name for name, _ in MODE_COLUMNS[self.mode]]:
            raise ValueError(
                f"Iceberg table {self.identifier} has the columns {columns}, not those of mode={self.mode!r}: "
                "give each pipeline and mode its own table."
            )
        if not _retries_off(table):  # a table created by another tool: no blind retry for this sink's commits
            with table.transaction() as tx:
                tx.set_properties(**NO_RETRY)
            log.info("iceberg sink: turned off pyiceberg's commit retry on %s (%s)", self.identifier, NO_RETRY)
            table = self._load()
        if dataset is not None:
            iceberg_current.build(self, table, dataset)

    def builds_on(self, source: Any, location: str, storage_options: dict | None = None) -> None:
        """current mode: build the table from the full load ``source`` (a
        :class:`~exactly_once_provider.full_load.handoff.Handoff`) of the Delta table at ``location`` (a URI
        delta-rs opens, with its ``storage_options``) when :meth:`prepare` finds it does not hold that load."""
        self.source, self.source_location, self.source_options = source, location, storage_options

    def _write(self, df, folder: str, max_rows: int | None = None) -> tuple[list[str], int]:
        """Write ``df`` as Parquet into the new folder ``folder`` (files of at most ``max_rows`` rows when given);
        return the files' URIs and their rows."""
        import pyarrow.parquet as pq

        storage = self.storage()
        writer = df.write.mode("errorifexists")
        if max_rows:
            writer = writer.option("maxRecordsPerFile", str(max_rows))
        writer.parquet(storage.spark_uri(folder))
        files, rows = [], 0
        for key in storage.list(folder + "/"):
            name = key.removeprefix(folder + "/")
            # the folder's own part files only: not what a failed task attempt left under _temporary/
            if "/" not in name and name.startswith("part-") and name.endswith(".parquet"):
                filesystem, path = storage.arrow_path(key)
                rows += pq.read_metadata(path, filesystem=filesystem).num_rows
                uri = storage.uri(key)
                files.append(uri if uri.startswith("s3://") else "file://" + uri)
        return files, rows

    def _add_files(self, table: Any, files: list[str], properties: dict[str, str], what: str) -> None:
        """Commit ``files`` in one snapshot based on the snapshot ``table`` was loaded at; refuse a moved branch."""
        from pyiceberg.exceptions import CommitFailedException

        try:
            # check_duplicate_files=False: the files are this batch's new folder (a scan of every manifest saved)
            table.add_files(files, snapshot_properties=properties, check_duplicate_files=False)
        except CommitFailedException as err:
            raise self._stale(table, what, err) from err

    def _fenced_state(self) -> tuple[Any, BatchCommit | None]:
        """Load the table (THE snapshot the batch commits on top of: the commit asserts it); return it and the
        pipeline's newest commit in it (what the fence, :func:`plan_commit`, is checked on)."""
        table = self._load()
        if table is None:
            raise PipelineError(f"Iceberg table {self.identifier} does not exist: the sink was not prepared.")
        if not _retries_off(table):
            raise PipelineError(
                f"Iceberg table {self.identifier} allows commit retries ({table.properties.get(_RETRIES)!r}): "
                f"a retry rebases a batch on a snapshot it was not planned on. Set {NO_RETRY} on the table."
            )
        return table, self._commit_in(table)

    def _planned(self, commit: BatchCommit, expected: object) -> tuple[Any, BatchCommit | None, bool]:
        """Return the table, the pipeline's newest commit in it (:meth:`_fenced_state`) and whether ``commit`` is to
        be committed on it (False: a replay)."""
        table, found = self._fenced_state()
        return table, found, plan_commit(found, commit, expected)

    def commit(self, df, commit: BatchCommit, expected: object = UNCHECKED, schema: SchemaChange | None = None) -> bool:
        """Write the batch's files, commit them in one snapshot carrying the fence; False if already committed.

        :param df: the batch's rows (:data:`APPEND_COLUMNS`; cdc and current modes: the newest change per key).
        :param commit: the batch identity and the offsets the next read starts from.
        :param expected: the sink's commit the batch was planned on; another one fails the batch.
        :param schema: current mode: the columns the batch's commit records (its state goes into the snapshot
            summary); a batch that follows a schema change is refused for now.
        """
        if self.mode in ("cdc", "current"):
            return self._commit_changes(df, commit, expected, schema)
        table, found, planned = self._planned(commit, expected)
        if not planned:
            return False
        files, rows = self._write(df, f"data/{commit.checkpoint_id}-{commit.batch_id}-{uuid.uuid4().hex[:8]}")
        # EO_FAULT_AT=sink_written_<batch>: the batch's files written, its snapshot not committed
        fault_point(f"sink_written_{commit.batch_id}")
        fenced = replace(commit, rows_total=(found.rows_total if found else 0) + rows)
        self._add_files(table, files, summary_properties(fenced), f"batch {commit.batch_id}")
        return True

    def _commit_changes(self, df, commit: BatchCommit, expected: object, schema: SchemaChange | None) -> bool:
        """cdc / current mode: merge the batch's changes by key into ONE overwrite snapshot carrying the fence.

        A commit that loses the race (another snapshot landed while Spark wrote) is planned again on the new
        snapshot (the commit loop, :func:`~exactly_once_provider.sinks.commit_loop.commit_batch`): the fence then
        tells a batch another driver committed (skipped), a zombie's stale plan (:class:`~.base.StaleBatchError`),
        or another writer's snapshot, e.g. a compaction (merged again on it).
        """
        from pyiceberg.exceptions import CommitFailedException

        self._refuse_schema_change(schema)
        changes = df.persist()  # read from Kafka once: its bounds, the key scan and the rewrite use it
        extra = {SCHEMA_MARKER: schema.state} if self.mode == "current" and schema and schema.state else {}

        def plan_and_commit(planned: tuple[Any, BatchCommit | None]) -> bool | None:
            table, found = planned
            try:
                self._merge(table, changes, replace(commit, extra=extra), found)
            except CommitFailedException as err:  # the catalog's compare-and-set: another snapshot came first
                log.info("iceberg sink: %s refused the snapshot of batch %d: %s", self.identifier, commit.batch_id, err)
                return None
            return True

        def committed(planned: tuple[Any, BatchCommit | None]) -> bool | None:
            return None if plan_commit(planned[1], commit, expected) else False

        try:
            _, written = commit_loop.commit_batch(
                self.identifier,
                f"{commit.pipeline}:{commit.checkpoint_id}",
                commit.batch_id,
                self._fenced_state(),
                committed,
                plan_and_commit,
                lambda lost: self._fenced_state(),
            )
            return written
        finally:
            changes.unpersist()

    def _refuse_schema_change(self, schema: SchemaChange | None) -> None:
        if self.mode == "current" and schema is not None and (schema.changed or schema.new_fills):
            raise PipelineError(
                f"The source table of the Iceberg current table {self.identifier} changed its schema (ALTER TABLE): "
                "the Iceberg sink does not follow schema changes yet. Nothing of this batch was committed; run a "
                "full reload (full_reload=true) to build the table in the new columns, or use the Delta sink."
            )

    def _merge(self, table: Any, changes, commit: BatchCommit, found: BatchCommit | None) -> None:
        """Rewrite the files holding the batch's keys and commit them in one snapshot on ``table``'s snapshot."""
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.io.pyarrow import parquet_file_to_data_file
        from pyspark.sql.types import StructType

        # Iceberg reads no INT96 timestamps (Spark's default): the rewritten files store microseconds
        changes.sparkSession.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        columns = [field.name for field in table.schema().fields]
        schema = StructType([changes.schema[name] for name in columns])
        count, bounds = iceberg_merge.key_bounds(changes, self.key_columns)
        every = [task.file for task in table.scan().plan_files()]
        touched = []
        if count:
            candidates = iceberg_merge.candidate_files(table, bounds)
            touched = iceberg_merge.files_holding(changes, candidates, self.key_columns, schema, _spark_uri)
            touched = iceberg_merge.with_small_files(touched, every)
        merged = iceberg_merge.merged_rows(
            changes,
            [_spark_uri(f.file_path) for f in touched],
            self.key_columns,
            _VERSION[self.mode],
            schema,
        )
        folder = f"data/{commit.checkpoint_id}-{commit.batch_id}-{uuid.uuid4().hex[:8]}"
        files, rows = ([], 0)
        if count:
            out = iceberg_merge.clustered(merged, self.key_columns, len(touched))
            files, rows = self._write(out, folder, max_rows=iceberg_merge.FILE_ROWS)
        # EO_FAULT_AT=sink_written_<batch>: the batch's files written, its snapshot not committed
        fault_point(f"sink_written_{commit.batch_id}")
        rows_total = _total_records(table) - sum(f.record_count for f in touched) + rows
        properties = summary_properties(replace(commit, rows_total=rows_total))
        try:
            with table.transaction() as tx:
                with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
                    for data_file in touched:
                        overwrite.delete_data_file(data_file)
                    for uri in files:
                        overwrite.append_data_file(parquet_file_to_data_file(table.io, tx.table_metadata, uri))
        except CommitFailedException:
            # The catalog refused the snapshot (its compare-and-set): no snapshot lists these files, and the next
            # plan writes its own. Any other failure may have committed them: those are left for orphan removal.
            self.storage().delete_prefix(folder + "/")
            raise
        log.info(
            "iceberg sink: batch %d merged %d changes into %s: %d files rewritten, %d written, %d rows in the table",
            commit.batch_id,
            count,
            self.identifier,
            len(touched),
            len(files),
            rows_total,
        )

    def commit_windows(
        self, df, windows: dict[str, int], rows: dict[str, int], commit: BatchCommit, expected: object = UNCHECKED
    ) -> bool:
        """Replace the rows of ``windows`` by ``df`` and commit versions and offsets in ONE catalog commit; return
        False if the batch was already committed (the parameters: :meth:`~.base.Sink.commit_windows`, whose
        ``windows`` may be empty: the offsets move on alone)."""
        from pyspark.sql import functions as F

        table, found, planned = self._planned(commit, expected)
        if not planned:
            return False
        state = dict(found.extra.get("windows", {})) if found else {}
        require_newer_windows(windows, {w: int(v["version"]) for w, v in state.items()})
        replaced = sorted(w for w in windows if w in state)  # the table holds an older version of these
        name = f"{commit.checkpoint_id}-{commit.batch_id}-{uuid.uuid4().hex[:8]}"
        files: list[str] = []
        for n, window in enumerate(sorted(windows)):  # a window's own files: replaced whole by a newer version
            written, _rows = self._write(df.filter(F.col("window_id") == window).coalesce(1), f"data/{name}-w{n}")
            files += written
            state[window] = {"version": windows[window], "rows": rows[window]}
        fenced = replace(commit, rows_total=sum(w["rows"] for w in state.values()), extra={"windows": state})
        fault_point(f"sink_written_{commit.batch_id}")
        self._replace_windows(table, replaced, files, summary_properties(fenced), f"batch {commit.batch_id}")
        return True

    def _replace_windows(
        self, table: Any, windows: list[str], files: list[str], properties: dict[str, str], what: str
    ) -> None:
        """Delete the rows of ``windows`` and add ``files`` in ONE catalog commit on the snapshot ``table`` was
        loaded at (pyiceberg stages a delete and an append snapshot; readers see both or neither)."""
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.expressions import In

        try:
            with table.transaction() as tx:
                if windows:
                    tx.delete(In("window_id", windows), snapshot_properties=properties)
                tx.add_files(files, snapshot_properties=properties, check_duplicate_files=False)
        except CommitFailedException as err:
            raise self._stale(table, what, err) from err

    def _stale(self, table: Any, what: str, err: Exception) -> StaleBatchError:
        return StaleBatchError(
            f"Iceberg table {self.identifier} got a new snapshot while {what} was being written (the commit "
            f"asserted snapshot {_snapshot_id(table)}: {err}): another driver commits pipeline "
            f"{self.pipeline!r}, or another writer commits this table. Nothing of this batch was committed "
            "(its files are unreferenced); it is not retried on top of a snapshot it was not planned on."
        )

    def append(self, df) -> None:
        """At-least-once baseline: the same files and snapshot, without the fence or its checks."""
        table = self._load()
        files, _rows = self._write(df, f"data/_at_least_once-{uuid.uuid4().hex}")
        self._add_files(table, files, {}, "an at-least-once append")


_RETRIES = "commit.retry.num-retries"


def _retries_off(table: Any) -> bool:
    """Whether pyiceberg commits to ``table`` without retrying (read from the metadata the commit is based on)."""
    return table.properties.get(_RETRIES) == NO_RETRY[_RETRIES]


# the version column of each keyed mode: a change replaces a row only if its version is newer
_VERSION = {"cdc": "source_version", "current": VERSION_COLUMN}


def _total_records(table: Any) -> int:
    """Rows of the table's current snapshot (its summary's ``total-records``; 0 before the first snapshot)."""
    snapshot = table.current_snapshot()
    return int(snapshot.summary["total-records"] or 0) if snapshot and snapshot.summary else 0


def _spark_uri(location: str) -> str:
    """Return a manifest's file location as Spark reads it (``s3a://`` for ``s3://``)."""
    return "s3a://" + location.removeprefix("s3://") if location.startswith("s3://") else location


def _snapshot_id(table: Any) -> int | None:
    snapshot = table.current_snapshot()
    return snapshot.snapshot_id if snapshot else None
