"""A PySpark Python data source: one Spark partition = one chunk read in its own consistent snapshot.

Each partition opens its own connection and snapshot on the executor and streams the chunk's rows as Arrow
batches straight into ONE Parquet file in the staging data directory (written with pyarrow and fsynced on
the executor: the rows never cross into the JVM). The partition's only Spark row is the chunk's *result*:
its exact binlog position, row count and staged file (name and size). The driver records a chunk as done
only from that row, so a task attempt that died left at most an unlisted file, which nothing ever reads
(:meth:`~exactly_once_provider.full_load.staging.Staging.remove_unlisted_files` deletes it).

Connection secrets travel in the ``password`` option, which Spark redacts in plans and UIs
(``spark.redaction.regex``), the way Spark's own JDBC source takes them.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import StructField, StructType

from exactly_once_provider.full_load.columns import Column, arrow_type, raw_conversions, to_arrays
from exactly_once_provider.full_load.plan import chunk_from_json
from exactly_once_provider.hooks.mysql_snapshot import ConnectionSettings, read_chunk

FORMAT = "eo_mysql_chunks"
# The one row each partition returns: the chunk, its snapshot position, its row count and its staged file.
RESULT_SCHEMA = StructType.fromJson({"type": "struct", "fields": [
    {"name": n, "type": t, "nullable": False, "metadata": {}} for n, t in (
        ("chunk", "integer"), ("binlog_file", "string"), ("binlog_pos", "long"), ("rows", "long"),
        ("data_file", "string"), ("data_bytes", "long"))]})


def arrow_schema(columns: list[Column]) -> pa.Schema:
    """Return the Arrow schema of the staged rows (the source columns, in order)."""
    return pa.schema([pa.field(c.name, arrow_type(c)) for c in columns])


def spark_schema(columns: list[Column]) -> StructType:
    """Return the Spark schema matching :func:`arrow_schema` (every field nullable, as the staged files say)."""
    return StructType([StructField(f.name, from_arrow_type(f.type), True) for f in arrow_schema(columns)])


def data_file_name(load_id: str, chunk: int) -> str:
    """Return a new staged file name for ``chunk``: unique per task attempt, tagged with the load."""
    return f"{load_id}-c{chunk:06d}-{uuid.uuid4().hex[:12]}.parquet"


class MySqlChunkDataSource(DataSource):
    """``spark.read.format("eo_mysql_chunks")``; options are written by :func:`chunk_read_options`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return RESULT_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return MySqlChunkReader(dict(self.options))


class MySqlChunkReader(DataSourceReader):
    """Plans one partition per chunk and reads each in its own snapshot."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(json.dumps(chunk)) for chunk in json.loads(self.options["chunks"])]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        o = self.options
        columns = [Column(**c) for c in json.loads(o["columns"])]
        schema = arrow_schema(columns)
        chunk = chunk_from_json(json.loads(partition.value))
        settings = ConnectionSettings(**json.loads(o["connection"]), password=o.get("password", ""))
        name = data_file_name(o["load_id"], chunk.index)
        path = os.path.join(o["data_dir"], name)
        conn = settings.connect(conv=raw_conversions())
        try:
            position, batches = read_chunk(
                conn, o["is_mariadb"] == "true", o["schema"], o["table"], [c.name for c in columns],
                json.loads(o["key"]), chunk, int(o["fetch_rows"]),
            )
            rows = 0
            os.makedirs(o["data_dir"], exist_ok=True)
            with open(path, "wb") as handle:
                with pq.ParquetWriter(handle, schema) as writer:  # an empty chunk still gets a file with its schema
                    for batch in batches:
                        rows += len(batch)
                        writer.write_batch(pa.RecordBatch.from_arrays(to_arrays(columns, batch, raw=True),
                                                                      schema=schema))
                handle.flush()
                os.fsync(handle.fileno())  # durable before the driver can record the chunk as done
        finally:
            conn.close()
        yield (chunk.index, position.file, position.pos, rows, name, os.path.getsize(path))


def chunk_read_options(
    settings: ConnectionSettings, is_mariadb: bool, schema: str, table: str, columns: list[Column],
    key: tuple[str, ...], chunks: list[dict], fetch_rows: int, load_id: str, data_dir: str,
) -> dict[str, str]:
    """Return the reader options for ``chunks`` (JSON chunk dicts from :mod:`.plan`).

    :param data_dir: the staging directory the executors write the chunk files into.
    """
    public = {k: v for k, v in settings.__dict__.items() if k != "password"}
    return {
        "connection": json.dumps(public), "password": settings.password, "is_mariadb": str(is_mariadb).lower(),
        "schema": schema, "table": table, "columns": json.dumps([c.to_json() for c in columns]),
        "key": json.dumps(list(key)), "chunks": json.dumps(chunks), "fetch_rows": str(fetch_rows),
        "load_id": load_id, "data_dir": data_dir,
    }
