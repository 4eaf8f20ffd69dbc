"""A PySpark Python data source: one Spark partition = one chunk read in its own consistent snapshot.

Each partition opens its own connection and snapshot on the executor, streams the chunk's rows as Arrow
batches, and ends with one *marker* row (``_eo_marker = true``) carrying the chunk's exact binlog position
and row count. The marker travels through Spark's task commit with the rows, so a staged chunk and its
position are committed together or not at all.

Connection secrets travel in the ``password`` option, which Spark redacts in plans and UIs
(``spark.redaction.regex``), the way Spark's own JDBC source takes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import StructField, StructType

from exactly_once_provider.full_load.columns import Column, arrow_type, raw_conversions, to_arrays
from exactly_once_provider.full_load.plan import chunk_from_json
from exactly_once_provider.hooks.mysql_snapshot import ConnectionSettings, read_chunk

FORMAT = "eo_mysql_chunks"
_META = [
    ("_eo_chunk", pa.int32()),
    ("_eo_marker", pa.bool_()),
    ("_eo_binlog_file", pa.string()),
    ("_eo_binlog_pos", pa.int64()),
    ("_eo_rows", pa.int64()),
]


def arrow_schema(columns: list[Column]) -> pa.Schema:
    """Return the Arrow schema of the staged rows: source columns, then the loader's meta columns."""
    return pa.schema([pa.field(c.name, arrow_type(c)) for c in columns] + [pa.field(n, t) for n, t in _META])


def spark_schema(columns: list[Column]) -> StructType:
    """Return the Spark schema matching :func:`arrow_schema` (every field nullable: marker rows are null)."""
    return StructType([StructField(f.name, from_arrow_type(f.type), True) for f in arrow_schema(columns)])


class MySqlChunkDataSource(DataSource):
    """``spark.read.format("eo_mysql_chunks")``; options are written by :func:`chunk_read_options`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return spark_schema([Column(**c) for c in json.loads(self.options["columns"])])

    def reader(self, schema: StructType) -> DataSourceReader:
        return MySqlChunkReader(dict(self.options))


class MySqlChunkReader(DataSourceReader):
    """Plans one partition per chunk and reads each in its own snapshot."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(json.dumps(chunk)) for chunk in json.loads(self.options["chunks"])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        o = self.options
        columns = [Column(**c) for c in json.loads(o["columns"])]
        schema = arrow_schema(columns)
        chunk = chunk_from_json(json.loads(partition.value))
        settings = ConnectionSettings(**json.loads(o["connection"]), password=o.get("password", ""))
        conn = settings.connect(conv=raw_conversions())
        try:
            position, batches = read_chunk(
                conn, o["is_mariadb"] == "true", o["schema"], o["table"], [c.name for c in columns],
                json.loads(o["key"]), chunk, int(o["fetch_rows"]),
            )
            rows = 0
            for batch in batches:
                rows += len(batch)
                n = len(batch)
                meta = [pa.array([chunk.index] * n, pa.int32()), pa.array([False] * n), pa.nulls(n, pa.string()),
                        pa.nulls(n, pa.int64()), pa.nulls(n, pa.int64())]
                yield pa.RecordBatch.from_arrays(to_arrays(columns, batch, raw=True) + meta, schema=schema)
            marker = [pa.nulls(1, arrow_type(c)) for c in columns] + [
                pa.array([chunk.index], pa.int32()), pa.array([True]), pa.array([position.file]),
                pa.array([position.pos], pa.int64()), pa.array([rows], pa.int64())]
            yield pa.RecordBatch.from_arrays(marker, schema=schema)
        finally:
            conn.close()


def chunk_read_options(
    settings: ConnectionSettings, is_mariadb: bool, schema: str, table: str, columns: list[Column],
    key: tuple[str, ...], chunks: list[dict], fetch_rows: int,
) -> dict[str, str]:
    """Return the reader options for ``chunks`` (JSON chunk dicts from :mod:`.plan`)."""
    public = {k: v for k, v in settings.__dict__.items() if k != "password"}
    return {
        "connection": json.dumps(public), "password": settings.password, "is_mariadb": str(is_mariadb).lower(),
        "schema": schema, "table": table, "columns": json.dumps([c.to_json() for c in columns]),
        "key": json.dumps(list(key)), "chunks": json.dumps(chunks), "fetch_rows": str(fetch_rows),
    }
