"""The full load's Spark job: one Spark partition = one chunk read in its own consistent snapshot.

Each partition opens its own connection and snapshot on the executor and streams the chunk's rows as Arrow
batches straight into ONE Parquet file in the staging data directory (written with pyarrow and fsynced on
the executor: the rows never cross into the JVM). The partition returns only the chunk's *result*: its
exact binlog position, row count and staged file (name and size). The driver records a chunk as done only
from that result, so a task attempt that died left at most an unlisted file, which nothing ever reads
(:meth:`~exactly_once_provider.full_load.staging.Staging.remove_unlisted_files` deletes it).

The staging data directory is a local (for a cluster: shared) directory or an ``s3://`` prefix. On S3 the
executor streams the Parquet file into ONE object (a multipart upload: the object exists only once the upload
completed, whole; S3 acknowledges it durably, the counterpart of the fsync) and reports the size the store holds.
Nothing is renamed: the name is unique per task attempt, and only a name the driver's manifest lists is ever read.

The job is a plain RDD job (``parallelize(chunks, len(chunks)).mapPartitions``). It was a PySpark Python
data source, which worked the same way but started three planner processes per wave: measured on a 10-row
chunk, 1.9-2.6 s per wave against 0.6-1.0 s for this job. The options (with the password, and the S3 settings
of a staging area on S3) travel inside the pickled task, never in a plan, a log or a command line.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import StructField, StructType

from exactly_once_provider.full_load.columns import (
    Column,
    arrow_type,
    from_native,
    native_select,
    raw_conversions,
    row_select,
    to_arrays,
)
from exactly_once_provider.full_load.plan import chunk_from_json
from exactly_once_provider.sinks.current_table import DELETED_COLUMN, VERSION_COLUMN, snapshot_version
from exactly_once_provider.source.native_reader import NativeReadError, read_chunk_arrow
from exactly_once_provider.source.snapshot import ConnectionSettings, read_chunk
from exactly_once_provider.storage import is_s3, open_storage
from exactly_once_provider.storage.s3 import S3Settings

log = logging.getLogger(__name__)


def arrow_schema(columns: list[Column]) -> pa.Schema:
    """Return the Arrow schema of the staged rows: the source columns in order, then the current table's
    version and tombstone columns (:mod:`exactly_once_provider.sinks.current_table`)."""
    return pa.schema(
        [pa.field(c.name, arrow_type(c)) for c in columns]
        + [pa.field(VERSION_COLUMN, pa.int64()), pa.field(DELETED_COLUMN, pa.bool_())]
    )


def spark_schema(columns: list[Column]) -> StructType:
    """Return the Spark schema matching :func:`arrow_schema` (every field nullable, as the staged files say)."""
    return StructType([StructField(f.name, from_arrow_type(f.type), True) for f in arrow_schema(columns)])


def data_file_name(load_id: str, chunk: int) -> str:
    """Return a new staged file name for ``chunk``: unique per task attempt, tagged with the load."""
    return f"{load_id}-c{chunk:06d}-{uuid.uuid4().hex[:12]}.parquet"


def read_chunks(spark, options: dict[str, str] | list[dict[str, str]]) -> list[dict]:
    """Run one Spark job reading every chunk of ``options`` (one partition each); return their results.

    :param spark: the SparkSession.
    :param options: from :func:`chunk_read_options`, or a list of them (chunks of several tables in one job);
        each result's ``slot`` is the index of the options it was read with.
    """
    every = [options] if isinstance(options, dict) else list(options)
    work = [(slot, chunk) for slot, o in enumerate(every) for chunk in json.loads(o["chunks"])]

    def run(partition: Iterator[tuple[int, dict]]) -> Iterator[dict]:
        for slot, chunk in partition:
            yield {**stage_chunk(every[slot], chunk), "slot": slot}

    return spark.sparkContext.parallelize(work, len(work)).mapPartitions(run).collect()


def stage_chunk(options: dict[str, str], chunk_json: dict) -> dict:
    """Read one chunk in its own snapshot into one fsynced Parquet file; return its result (on an executor).

    MariaDB chunks are read by the native reader (:mod:`~exactly_once_provider.source.native_reader`) unless the
    load asked for ``reader="rows"``. A chunk the native reader returns no rows for, or cannot read or convert,
    is read again by the row reader in a new snapshot (logged at WARNING when it failed): both give the same
    values, and the row reader names the column of a value nothing can load (a zero date).
    """
    o = options
    columns = [Column(**c) for c in json.loads(o["columns"])]
    chunk = chunk_from_json(chunk_json)
    settings = ConnectionSettings(**json.loads(o["connection"]), password=o.get("password", ""))
    name = data_file_name(o["load_id"], chunk.index)
    target = StagedFile(o["data_dir"], name, S3Settings.from_json(json.loads(o["s3"])) if o.get("s3") else None)
    schema = arrow_schema(columns)
    position, reader = None, "native"
    if o["is_mariadb"] == "true" and o.get("reader", "native") == "native":
        try:
            position, batches = read_chunk_arrow(
                settings,
                o["schema"],
                o["table"],
                [native_select(c) for c in columns],
                json.loads(o["key"]),
                chunk,
                int(o["fetch_rows"]),
            )
            if position is not None:
                meta = _meta_arrays(position, int(o.get("version_base", 0)))
                rows = target.write(
                    schema,
                    (
                        pa.RecordBatch.from_arrays(
                            [from_native(c, a) for c, a in zip(columns, b.columns)] + meta(b.num_rows), schema=schema
                        )
                        for b in batches
                    ),
                )
        except (NativeReadError, pa.ArrowException) as error:
            log.warning(
                "full load chunk %d: the native reader failed (%s); reading it with the row reader", chunk.index, error
            )
            position = None
    if position is None:
        reader = "rows"
        conn = settings.connect(conv=raw_conversions())
        rows_batches = None
        try:
            position, rows_batches = read_chunk(
                conn,
                o["is_mariadb"] == "true",
                o["schema"],
                o["table"],
                [row_select(c) for c in columns],
                json.loads(o["key"]),
                chunk,
                int(o["fetch_rows"]),
            )
            meta = _meta_arrays(position, int(o.get("version_base", 0)))
            rows = target.write(
                schema,
                (
                    pa.RecordBatch.from_arrays(to_arrays(columns, batch) + meta(len(batch)), schema=schema)
                    for batch in rows_batches
                ),
            )
        finally:
            if rows_batches is not None:
                rows_batches.close()  # its cursor and snapshot first: after conn.close() they fail with error 2006
            conn.close()
    return {
        "chunk": chunk.index,
        "binlog_file": position.file,
        "binlog_pos": position.pos,
        "rows": rows,
        "data_file": name,
        "data_bytes": target.size(),
        "reader": reader,
    }


def _meta_arrays(position, version_base: int = 0):
    """Return ``rows -> [version array, tombstone array]`` for a chunk read in the snapshot at ``position``.

    :param version_base: the capture's version base on this server (raised at a failover), on every row.
    """
    version, live = pa.scalar(snapshot_version(position) + version_base, pa.int64()), pa.scalar(False)

    def arrays(rows: int) -> list[pa.Array]:
        # pa.repeat fills in native code: two Python lists per batch cost ~0.8 CPU-s per 10M rows
        return [pa.repeat(version, rows), pa.repeat(live, rows)]

    return arrays


class StagedFile:
    """One chunk's staged Parquet file: a fsynced local file, or one S3 object.

    :param data_dir: the staging data directory (a local path or an ``s3://`` URI).
    :param name: the file's name in it (unique per task attempt).
    :param s3: the settings of a data directory on S3 (from the driver, in the pickled task).
    """

    def __init__(self, data_dir: str, name: str, s3: S3Settings | None = None) -> None:
        self._storage, self._name = open_storage(data_dir, s3), name
        self._filesystem, self._path = self._storage.arrow_path(name)
        self._local = not is_s3(data_dir)

    def write(self, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> int:
        """Write ``batches`` as the ONE Parquet file (replacing it), durable when this returns; return the rows."""
        if self._local:
            os.makedirs(os.path.dirname(self._path), exist_ok=True)
            with open(self._path, "wb") as handle:
                rows = _write_batches(handle, schema, batches)
                handle.flush()
                os.fsync(handle.fileno())  # durable before the driver can record the chunk as done
            return rows
        try:
            # A multipart upload: the object appears only when it completes (on close), whole and durably stored.
            with self._filesystem.open_output_stream(self._path) as stream:
                return _write_batches(stream, schema, batches)
        except BaseException:
            # pyarrow completes the upload on close even after an error (docs/pitfalls.md): drop that partial
            # object now (it is unlisted and never read anyway). Through the storage layer: pyarrow's delete_file
            # would leave a "data/" directory marker object behind.
            try:
                self._storage.delete(self._name)
            except Exception:  # noqa: BLE001 - the original error is what matters
                pass
            raise

    def size(self) -> int:
        """Return the size of the written file as the store holds it (what the publish checks it against)."""
        return self._filesystem.get_file_info(self._path).size


def _write_batches(sink, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> int:
    """Write ``batches`` into the open binary ``sink`` as ONE Parquet file; return the row count."""
    rows, batches = 0, iter(batches)
    first = next(batches, None)
    # an empty chunk still gets its schema
    with pq.ParquetWriter(sink, schema, use_dictionary=dictionary_columns(first)) as writer:
        group = RowGroupBuffer(writer)
        for batch in itertools.chain([first] if first is not None else [], batches):
            rows += batch.num_rows
            group.add(batch)
        group.flush()
    return rows


def dictionary_columns(sample: pa.RecordBatch | None, min_rows: int = 1000) -> list[str] | bool:
    """Return the columns worth dictionary encoding, judged on a chunk's first batch: those that repeat values.

    For a column of distinct values (a key, an amount, a timestamp) the Parquet writer builds a dictionary per
    row group only to drop it at its page limit and write the values plainly after all: measured on 2M rows of
    the full-load benchmark's table, 0.38 CPU-s with dictionaries tried everywhere, 0.26 s with them only where
    values repeat, and a file 5 % smaller. A column whose first batch holds at most one distinct value per two
    rows keeps its dictionary; a batch of fewer than ``min_rows`` rows says too little: every column keeps it.
    """
    if sample is None or sample.num_rows < min_rows:
        return True
    repeating = [
        name
        for name, column in zip(sample.schema.names, sample.columns)
        if 2 * pc.count_distinct(column).as_py() <= sample.num_rows
    ]
    return repeating or False


class RowGroupBuffer:
    """Collect record batches into Parquet row groups of up to ``max_rows`` rows or ``max_bytes`` of Arrow data.

    ``ParquetWriter.write_batch`` makes every fetched batch (``fetch_rows``) a row group of its own, each with
    its own dictionary pages and statistics: measured on 1M rows, 0.3-0.5 s for 100 groups of 10,000 rows
    against 0.2 s for one group. Memory stays bounded by ``max_bytes``.

    :param writer: the open Parquet writer.
    :param max_rows: rows per row group at most.
    :param max_bytes: buffered Arrow bytes at most before a row group is written.
    """

    def __init__(self, writer: pq.ParquetWriter, max_rows: int = 1 << 20, max_bytes: int = 64 << 20) -> None:
        self._writer, self._max_rows, self._max_bytes = writer, max_rows, max_bytes
        self._batches: list[pa.RecordBatch] = []
        self._rows = self._bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Buffer ``batch``; write a row group when the buffer is full."""
        self._batches.append(batch)
        self._rows += batch.num_rows
        self._bytes += batch.nbytes
        if self._rows >= self._max_rows or self._bytes >= self._max_bytes:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as one row group (or more, if over ``max_rows``)."""
        if self._batches:
            self._writer.write_table(pa.Table.from_batches(self._batches), row_group_size=self._max_rows)
        self._batches, self._rows, self._bytes = [], 0, 0


def chunk_read_options(
    settings: ConnectionSettings,
    is_mariadb: bool,
    schema: str,
    table: str,
    columns: list[Column],
    key: tuple[str, ...],
    chunks: list[dict],
    fetch_rows: int,
    load_id: str,
    data_dir: str,
    reader: str = "native",
    version_base: int = 0,
    s3: S3Settings | None = None,
) -> dict[str, str]:
    """Return the job options for ``chunks`` (JSON chunk dicts from :mod:`.plan`).

    :param data_dir: the staging directory the executors write the chunk files into (a path or ``s3://`` URI).
    :param reader: ``native`` (connectorx, MariaDB) or ``rows`` (mysqlclient rows, every server).
    :param version_base: added to every row's snapshot version (:func:`_meta_arrays`).
    :param s3: the settings of a ``data_dir`` on S3 (the driver's staging storage's, secrets included).
    """
    public = {k: v for k, v in settings.__dict__.items() if k != "password"}
    options = {
        "connection": json.dumps(public),
        "password": settings.password,
        "is_mariadb": str(is_mariadb).lower(),
        "schema": schema,
        "table": table,
        "columns": json.dumps([c.to_json() for c in columns]),
        "key": json.dumps(list(key)),
        "chunks": json.dumps(chunks),
        "fetch_rows": str(fetch_rows),
        "load_id": load_id,
        "data_dir": data_dir,
        "reader": reader,
        "version_base": str(version_base),
    }
    if s3 is not None:
        # The executors' Python workers write the chunk objects themselves (the rows never cross into the JVM),
        # so they need a client of their own: Spark's s3a settings live in the JVM's Hadoop configuration, which
        # a Python worker cannot read, and environment variables or spark.executorEnv would put the secret in
        # Spark's conf and on executor command lines. The driver's settings travel like the MySQL password:
        # inside the pickled task, which Spark ships to the executors over its RPC and never logs.
        options["s3"] = json.dumps(s3.to_json())
    return options
