"""The Iceberg sink's keyed modes (``cdc``, ``current``): copy-on-write, ONE overwrite snapshot per batch.

A batch holds the newest change per key (:func:`~exactly_once_provider.spark_jobs.kafka_to_sink.cdc_changes`, or
:func:`~exactly_once_provider.spark_jobs.current_changes.typed_changes`). It reaches the table as Delta's own
MERGE does (:mod:`~exactly_once_provider.sinks.delta_merge`), in Iceberg terms:

1. the data files that may hold a key of the batch are planned by pyiceberg from the manifests' column bounds
   (:func:`candidate_files`), and those that really do are found by one Spark job over their key columns
   (:func:`files_holding`); small files the batch does not touch are added, so a stream of inserts does not
   leave a file per micro-batch (:func:`with_small_files`);
2. Spark rewrites those files with the changes merged in (:func:`merged_rows`): a row is replaced only by a
   NEWER version of its key, new keys are inserted, deletes stay as tombstones (a later, older change of the key
   must not bring the row back: :mod:`~exactly_once_provider.sinks.current_table`); the new files hold key
   ranges, sorted (:func:`clustered`), so the bounds of step 1 keep the next batches' rewrites small;
3. the driver commits ONE ``overwrite`` snapshot that removes the rewritten files and adds the new ones, with the
   batch's fence in its summary (:meth:`~exactly_once_provider.sinks.iceberg.IcebergSink.commit`).

Copy-on-write, not merge-on-read: pyiceberg 0.12 writes no delete files (its ``delete`` rewrites data files and
warns that merge-on-read is not supported), and a table without delete files is read the same by every engine.
"""

from __future__ import annotations

import logging
from typing import Any

from exactly_once_provider.sinks import version_rule
from exactly_once_provider.sinks.current_table import quoted
from exactly_once_provider.storage import comparable_location

log = logging.getLogger(__name__)

# Key types whose batch bounds pyiceberg prunes files with (other key types: every file is a candidate).
BOUNDED_TYPES = ("int", "bigint", "string")
# Rows per rewritten file: the files hold key ranges, so a batch of recent keys rewrites the newest files only.
FILE_ROWS = 500_000
# Untouched files below this size are rewritten with a batch, smallest first, up to the total.
SMALL_FILE_BYTES = 4 << 20
SMALL_FILES_TOTAL_BYTES = 16 << 20
_FILE = "_eo_file"


def key_bounds(changes: Any, key: tuple[str, ...]) -> tuple[int, dict[str, tuple[Any, Any]]]:
    """Return the batch's number of changes and the min/max of each key column pyiceberg can prune by (one job)."""
    from pyspark.sql import functions as F

    types = dict(changes.dtypes)
    bounded = [k for k in key if types[k] in BOUNDED_TYPES]
    aggregates = [F.count(F.lit(1)).alias("n")]
    for n, k in enumerate(bounded):
        aggregates += [F.min(F.col(quoted(k))).alias(f"lo{n}"), F.max(F.col(quoted(k))).alias(f"hi{n}")]
    row = changes.agg(*aggregates).first()
    return int(row["n"]), {k: (row[f"lo{n}"], row[f"hi{n}"]) for n, k in enumerate(bounded)}


def candidate_files(table: Any, bounds: dict[str, tuple[Any, Any]]) -> list[Any]:
    """Return the data files (pyiceberg ``DataFile``) of the current snapshot whose bounds may hold a batch key."""
    from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, LessThanOrEqual

    condition = AlwaysTrue()
    for column, (low, high) in bounds.items():
        condition = And(condition, And(GreaterThanOrEqual(column, low), LessThanOrEqual(column, high)))
    return [task.file for task in table.scan(row_filter=condition).plan_files()]


def files_holding(changes: Any, candidates: list[Any], key: tuple[str, ...], schema: Any, spark_uri: Any) -> list[Any]:
    """Return the ``candidates`` that hold a key of ``changes``: a semi-join of their key columns (one Spark job).

    :param schema: the table's Spark schema (the files are read with it: no inference).
    :param spark_uri: turns a manifest's file location into the URI Spark reads it by.
    """
    if not candidates:
        return []
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    by_location = {comparable_location(spark_uri(f.file_path)): f for f in candidates}
    keys = StructType([schema[k] for k in key])
    target = changes.sparkSession.read.schema(keys).parquet(*[spark_uri(f.file_path) for f in candidates])
    target = target.select(*[F.col(quoted(k)) for k in key], F.col("_metadata.file_path").alias(_FILE)).alias("t")
    on = [F.col(f"t.{quoted(k)}") == F.col(f"s.{quoted(k)}") for k in key]
    hits = target.join(changes.select(*[F.col(quoted(k)) for k in key]).alias("s"), on, "left_semi")
    found = [comparable_location(row[0]) for row in hits.select(_FILE).distinct().collect()]
    missing = [location for location in found if location not in by_location]
    if missing:
        raise RuntimeError(f"Spark read {missing[0]!r}, which no manifest of the snapshot names.")
    return [by_location[location] for location in sorted(found)]


def with_small_files(touched: list[Any], every: list[Any]) -> list[Any]:
    """Return ``touched`` plus the untouched files below :data:`SMALL_FILE_BYTES`, smallest first, up to a total."""
    held = {f.file_path for f in touched}
    chosen, total = list(touched), 0
    for data_file in sorted((f for f in every if f.file_path not in held), key=lambda f: f.file_size_in_bytes):
        if (
            data_file.file_size_in_bytes >= SMALL_FILE_BYTES
            or total + data_file.file_size_in_bytes > SMALL_FILES_TOTAL_BYTES
        ):
            break
        chosen.append(data_file)
        total += data_file.file_size_in_bytes
    return chosen


def merged_rows(
    changes: Any, files: list[str], key: tuple[str, ...], version: str, schema: Any, replace_equal: bool = False
) -> Any:
    """Return the rows of ``files`` with ``changes`` merged in (a full outer join on the key), plus new keys.

    :param files: the Spark URIs of the data files the batch rewrites.
    :param version: the version column: a change replaces a row only if its version is newer.
    :param schema: the table's Spark schema (the changes are cast to it, the files read with it).
    :param replace_equal: a change of the row's own version replaces it too (a schema change's filled rows).
    """
    from pyspark.sql import functions as F

    columns = [f.name for f in schema.fields]
    source = changes.select(*[F.col(quoted(c)).cast(schema[c].dataType).alias(c) for c in columns])
    if not files:
        return source
    target = changes.sparkSession.read.schema(schema).parquet(*files)
    take = version_rule.takes_change(version, replace_equal)  # a rewritten file's rows the batch leaves: kept
    on = [F.col(f"t.{quoted(k)}") == F.col(f"s.{quoted(k)}") for k in key]
    merged = [F.when(take, F.col(f"s.{quoted(c)}")).otherwise(F.col(f"t.{quoted(c)}")).alias(c) for c in columns]
    return target.alias("t").join(source.alias("s"), on, "full_outer").select(*merged)


def clustered(rows: Any, key: tuple[str, ...], files: int) -> Any:
    """Return ``rows`` sorted by key in ``files`` partitions, range-partitioned when more than one: each file Spark
    writes (split at :data:`FILE_ROWS`) then holds one key range, which :func:`candidate_files` prunes by.

    :param files: the number of files the batch rewrites (at least one partition).
    """
    from pyspark.sql import functions as F

    columns = [F.col(quoted(k)) for k in key]
    if files <= 1:  # one partition: no sampling job for the range bounds
        return rows.coalesce(1).sortWithinPartitions(*columns)
    return rows.repartitionByRange(files, *columns).sortWithinPartitions(*columns)
