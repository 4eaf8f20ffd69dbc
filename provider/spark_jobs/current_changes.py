"""The Kafka -> Delta job's ``current`` mode: change records -> typed rows of the current table, newest per key.

The table and its merge rule are :mod:`exactly_once_provider.sinks.current_table`'s; this module only reads the
binlog capture's change records (:mod:`exactly_once_provider.capture.change_record`) into the full load's types.
"""

from __future__ import annotations

from typing import Any

from exactly_once_provider.full_load.columns import Column, is_binary
from exactly_once_provider.full_load.spark_source import spark_schema
from exactly_once_provider.sinks.current_table import DELETED_COLUMN, VERSION_COLUMN, quoted


def _typed(column: Column, text: Any, spark_type: Any) -> Any:
    """Return the Spark expression turning the change record's JSON value of ``column`` into its loaded type.

    The JSON forms are :func:`exactly_once_provider.source.binlog.column_converter`'s: numbers, exact DECIMAL
    strings, ISO date-times (TIMESTAMP with ``Z``), base64 binary, SET as an array of strings.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType

    t = column.data_type
    if t == "set":
        return F.array_join(F.from_json(text, ArrayType(StringType())), ",")
    if is_binary(column):
        return F.unbase64(text)
    if t in ("float", "double"):  # NaN and the infinities arrive quoted by the JSON reader's text copy
        return F.regexp_replace(text, '"', "").cast(spark_type)
    return text.cast(spark_type)


def typed_changes(records: Any, columns: list[Column], key: tuple[str, ...], schema: str, table: str) -> Any:
    """Return the newest change per key of ``records`` as rows of the current table.

    A record of another source table, or without a version or an image, fails the batch before anything is
    committed (Spark's ``raise_error``, evaluated while the MERGE reads its source: no extra pass over the batch).

    :param records: the micro-batch (``record_value`` holds the change record JSON, plus the Kafka columns).
    :param columns: the source columns (the full load's, from its handoff).
    :param key: the primary key columns.
    :param schema: the source database the table's changes come from.
    :param table: the source table.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    types = {f.name: f.dataType for f in spark_schema(columns).fields}
    where = F.concat(F.lit(" (topic "), F.col("kafka_topic"), F.lit(", partition "),
                     F.col("kafka_partition").cast("string"), F.lit(", offset "),
                     F.col("kafka_offset").cast("string"), F.lit(")"))
    source_schema = F.get_json_object("record_value", "$.source.schema")
    source_table = F.get_json_object("record_value", "$.source.table")
    version = F.get_json_object("record_value", "$.version").cast("bigint")
    image = F.coalesce(F.get_json_object("record_value", "$.after"), F.get_json_object("record_value", "$.before"))
    checked = (
        F.when((source_schema != F.lit(schema)) | (source_table != F.lit(table)) | source_schema.isNull(),
               F.raise_error(F.concat(
                   F.lit("A change of "), F.coalesce(source_schema, F.lit("?")), F.lit("."),
                   F.coalesce(source_table, F.lit("?")), where,
                   F.lit(f" reached the current table of {schema}.{table}: one current table takes the topics of "
                         "its own source table only; give each table its own sink."))))
        .when(version.isNull() | image.isNull(),
              F.raise_error(F.concat(F.lit("A record without a numeric version or a before/after image"), where,
                                     F.lit(" is not a change record of the binlog capture."))))
        .otherwise(version))
    as_text = StructType([StructField(c.name, StringType()) for c in columns])
    parsed = records.select(
        checked.alias(VERSION_COLUMN),
        (F.get_json_object("record_value", "$.op") == F.lit("d")).alias(DELETED_COLUMN),
        F.from_json(image, as_text).alias("image"), "kafka_offset")
    rows = parsed.select(
        *[_typed(c, F.col("image")[c.name], types[c.name]).alias(c.name) for c in columns],
        VERSION_COLUMN, DELETED_COLUMN, "kafka_offset")
    newest = F.max_by(F.struct(*[F.col(quoted(c)) for c in rows.columns]),
                      F.struct(VERSION_COLUMN, "kafka_offset"))
    return (rows.groupBy(*[F.col(quoted(k)) for k in key]).agg(newest.alias("c"))
            .select(*[F.col("c")[c.name].alias(c.name) for c in columns],
                    F.col("c")[VERSION_COLUMN].alias(VERSION_COLUMN),
                    F.col("c")[DELETED_COLUMN].alias(DELETED_COLUMN)))
