"""The Kafka -> Delta job's ``current`` mode: change records -> typed rows of the current table, newest per key.

The table and its merge rule are :mod:`exactly_once_provider.sinks.current_table`'s; this module only reads the
binlog capture's change records (:mod:`exactly_once_provider.capture.change_record`) into the full load's types,
and follows the table's schema changes (:class:`CurrentChanges`, rules in
:mod:`exactly_once_provider.spark_jobs.schema_change`).
"""

from __future__ import annotations

import functools
import json
import logging
import re
from typing import Any, NamedTuple

from exactly_once_provider.full_load.columns import Column, is_binary
from exactly_once_provider.full_load.spark_source import spark_schema
from exactly_once_provider.sinks import bad_values
from exactly_once_provider.sinks.base import SchemaChange
from exactly_once_provider.sinks.current_table import DELETED_COLUMN, VERSION_COLUMN, quoted
from exactly_once_provider.spark_jobs.schema_change import DDL_OP, Fill, SchemaRecord, evolve

log = logging.getLogger(__name__)
# A schema record's value starts like this (compact JSON, keys in the documented order): a prefix test is
# cheaper than parsing every record of the batch.
DDL_PREFIX = '{"format":1,"op":"%s"' % DDL_OP
# What a batch planned without reading its schema records fails with when it holds a newer one (CurrentChanges).
SCHEMA_AHEAD = "EO_SCHEMA_RECORD_AHEAD"
_SCHEMA_ERROR = "_eo_schema_error"  # a change's schema_version error (NULL: none), raised after the snapshot's filter
# The end of the fail mode's messages of a bad value (sinks/bad_values.py).
_STOPPED = (
    ". Nothing of this batch was committed; with on_bad_record='dead_letter' such a record goes to the dead-letter "
    "store instead."
)


def _typed(column: Column, text: Any, spark_type: Any, refuse: Any = None) -> Any:
    """Return the Spark expression turning the change record's JSON value of ``column`` into its loaded type.

    The JSON forms are :func:`exactly_once_provider.source.binlog.column_converter`'s: numbers, exact DECIMAL
    strings, ISO date-times (TIMESTAMP with ``Z``), base64 binary, SET as an array of strings.

    :param refuse: ``refuse(column, text, spark_type)`` returns the ``raise_error`` of a DECIMAL value the type
        cannot hold exactly (:func:`~exactly_once_provider.sinks.bad_values.bad_decimal`): Spark's cast would
        round it, or give NULL (ANSI off); not relying on the ANSI setting, never a silent NULL.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, DecimalType, StringType

    t = column.data_type
    if t == "set":
        return F.array_join(F.from_json(text, ArrayType(StringType())), ",")
    if is_binary(column):
        return F.unbase64(text)
    if t in ("float", "double"):  # NaN and the infinities arrive quoted by the JSON reader's text copy
        return F.regexp_replace(text, '"', "").cast(spark_type)
    if isinstance(spark_type, DecimalType) and refuse is not None:
        return F.when(bad_values.bad_decimal(text, spark_type), refuse(column, text, spark_type)).otherwise(
            text.try_cast(spark_type)
        )
    return text.cast(spark_type)


def _filled(name: str, fills: list[Fill], version: Any, value_of: Any, spark_type: Any) -> Any:
    """Return the row's value of column ``name`` (``value_of(name)``) unless a fill of it is newer than
    ``version``; the newest such fill wins, and a renamed column's fill is its source column's value then."""
    from pyspark.sql import functions as F

    chain = None
    for fill in sorted((f for f in fills if f.column == name), key=lambda f: -f.version):
        if fill.source is not None:
            earlier = [f for f in fills if f.version < fill.version]
            literal = _filled(fill.source, earlier, version, value_of, spark_type).cast(spark_type)
        else:
            literal = F.lit(fill.value).cast(spark_type)
        condition = version < F.lit(fill.version)
        chain = F.when(condition, literal) if chain is None else chain.when(condition, literal)
    return value_of(name) if chain is None else chain.otherwise(value_of(name))


def schema_change_ahead(err: BaseException) -> bool:
    """Return whether ``err`` is a batch planned without its schema records meeting one (:data:`SCHEMA_AHEAD`)."""
    return SCHEMA_AHEAD in str(err)


def typed_changes(
    records: Any,
    columns: list[Column],
    key: tuple[str, ...],
    schema: str,
    table: str,
    fills: list[Fill] = (),
    since: int | str | None = None,
    refuse_schema_after: int | None = None,
    applied: int | None = None,
) -> Any:
    """Return the newest change per key of ``records`` as rows of the current table.

    Schema records (``op`` ``ddl``) are left out (:class:`CurrentChanges` reads them), or, newer than
    ``refuse_schema_after``, fail the batch. A change older than a
    :class:`~exactly_once_provider.spark_jobs.schema_change.Fill` of a column takes the fill's value in it (the
    value the server gave the row by the statement, without a row event).

    A record of another source table, or without a version or an image, fails the batch before anything is
    committed (Spark's ``raise_error``, evaluated while the MERGE reads its source: no extra pass over the batch);
    so does a bad value (:mod:`~exactly_once_provider.sinks.bad_values`): a DECIMAL the column cannot hold exactly
    (``decimal_overflow``), a row image naming a column ``columns`` does not hold (``schema_version``; planned
    without the batch's schema records, :data:`SCHEMA_AHEAD`: the batch is planned again with them first).

    :param records: the micro-batch (``record_value`` holds the change record JSON, plus the Kafka columns).
    :param columns: the source columns (the full load's, from its handoff).
    :param key: the primary key columns.
    :param schema: the source database the table's changes come from.
    :param table: the source table.
    :param fills: the values rows older than a schema change take (see above).
    :param refuse_schema_after: fail the batch (:data:`SCHEMA_AHEAD`, raised while the MERGE reads its source:
        before anything is written) if it holds a schema record newer than this version; default: leave every
        schema record out (the caller has read them).
    :param since: leave out changes of a lower version: the full load's snapshot of their key holds them (a
        version, or a Spark SQL expression of the key columns:
        :meth:`~exactly_once_provider.full_load.handoff.Handoff.snapshot_version_sql`). Its rows would win over
        them anyway, but a key deleted before the snapshot has no row there, and its older change (still in
        Kafka, not merged before the full load replaced the table: a capture that was behind, a failover) would
        bring it back until the batch holding its delete is merged.
    :param applied: the version of the last schema change ``columns`` follow (named by a ``schema_version`` error).
    """
    plan = _change_plan(
        records.sparkSession.sparkContext,
        tuple(columns),
        tuple(key),
        schema,
        table,
        tuple(fills),
        since,
        refuse_schema_after,
        applied,
    )
    rows = records.filter(plan.keep).select(*plan.parsed).select(*plan.rows)
    if plan.since is not None:  # on the typed key, after the checks: bad records still fail
        rows = rows.where(plan.since)
    # After the snapshot's filter: a change the snapshot holds may be of an older schema (a full reload after an
    # ALTER TABLE the table could not follow), and is left out rather than refused.
    rows = rows.where(plan.known)
    return rows.groupBy(*plan.key).agg(plan.newest.alias("c")).select(*plan.out)


class _ChangePlan(NamedTuple):
    """The Spark expressions of :func:`typed_changes` for one table's columns (see :func:`_change_plan`)."""

    keep: Any
    parsed: list
    rows: list
    since: Any
    key: list
    newest: Any
    out: list
    known: Any


@functools.lru_cache(maxsize=1024)
def _change_plan(
    context: Any,
    columns: tuple[Column, ...],
    key: tuple[str, ...],
    schema: str,
    table: str,
    fills: tuple[Fill, ...],
    since: int | str | None,
    refuse_schema_after: int | None,
    applied: int | None = None,
) -> _ChangePlan:
    """Return :func:`typed_changes`' expressions, built once per table state and session and reused by every
    batch: they name columns only, and building them costs ~1,000 Py4J calls (~0.1 s a batch per table).

    :param context: the SparkContext the expressions belong to (a new one builds them again).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType, StringType

    types = {f.name: f.dataType for f in spark_schema(columns).fields}
    where = F.concat(
        F.lit(" (topic "),
        F.col("kafka_topic"),
        F.lit(", partition "),
        F.col("kafka_partition").cast("string"),
        F.lit(", offset "),
        F.col("kafka_offset").cast("string"),
        F.lit(")"),
    )
    source_schema = F.get_json_object("record_value", "$.source.schema")
    source_table = F.get_json_object("record_value", "$.source.table")
    version = F.get_json_object("record_value", "$.version").cast("bigint")
    image = F.coalesce(F.get_json_object("record_value", "$.after"), F.get_json_object("record_value", "$.before"))
    name = f"{schema}.{table}"
    if refuse_schema_after is not None:  # the batch's schema records may add the column: plan again with them
        unknown = F.lit(f"{SCHEMA_AHEAD}: a change names a column the plan does not hold; planned again with them.")
    else:
        unknown = F.concat(
            F.lit(f"{bad_values.SCHEMA_VERSION}: "),
            bad_values.schema_error(list(columns), applied, name, F.col("record_value"), F.to_json("image"), where),
            F.lit(_STOPPED),
        )
    checked = (
        F.when(
            (source_schema != F.lit(schema)) | (source_table != F.lit(table)) | source_schema.isNull(),
            F.raise_error(
                F.concat(
                    F.lit("A change of "),
                    F.coalesce(source_schema, F.lit("?")),
                    F.lit("."),
                    F.coalesce(source_table, F.lit("?")),
                    where,
                    F.lit(
                        f" reached the current table of {schema}.{table}: one current table takes the topics of "
                        "its own source table only; give each table its own sink (one application: "
                        "the operator's streams)."
                    ),
                )
            ),
        )
        .when(
            version.isNull() | image.isNull(),
            F.raise_error(
                F.concat(
                    F.lit("A record without a numeric version or a before/after image"),
                    where,
                    F.lit(" is not a change record of the binlog capture."),
                )
            ),
        )
        .otherwise(version)
    )
    by_name = {c.name: c for c in columns}

    def refuse(column: Column, text: Any, spark_type: Any) -> Any:
        message = bad_values.decimal_error(column, spark_type, name, text, where)
        return F.raise_error(F.concat(F.lit(f"{bad_values.DECIMAL_OVERFLOW}: "), message, F.lit(_STOPPED)))

    def image_value(column: str) -> Any:
        return _typed(by_name[column], F.col("image")[column], types[column], refuse)

    ddl = F.col("record_value").startswith(DDL_PREFIX)
    keep = ~ddl
    if refuse_schema_after is not None:
        newer = F.get_json_object("record_value", "$.version").cast("bigint") > F.lit(refuse_schema_after)
        keep = F.when(
            ddl & newer,
            F.raise_error(
                F.lit(
                    f"{SCHEMA_AHEAD}: the batch holds a schema change its plan did not read; it is planned again with it."
                )
            ),
        ).otherwise(keep)
    parsed = [
        checked.alias(VERSION_COLUMN),
        (F.get_json_object("record_value", "$.op") == F.lit("d")).alias(DELETED_COLUMN),
        # one parse of the image, as a map: its values by column, and its names for the schema_version check
        F.from_json(image, MapType(StringType(), StringType())).alias("image"),
        "kafka_offset",
        "kafka_topic",  # with the partition and the record: named by the errors (pruned from the plan otherwise)
        "kafka_partition",
        "record_value",
    ]
    names = F.array(*[F.lit(c.name) for c in columns])
    unknown_names = F.array_except(F.map_keys(F.col("image")), names)
    rows = [
        *[
            _filled(c.name, list(fills), F.col(VERSION_COLUMN), image_value, types[c.name]).alias(c.name)
            for c in columns
        ],
        VERSION_COLUMN,
        DELETED_COLUMN,
        "kafka_offset",
        F.when(F.size(unknown_names) > 0, unknown).alias(_SCHEMA_ERROR),
    ]
    newer = None
    if since is not None:
        newer = F.col(VERSION_COLUMN) >= (F.lit(since) if isinstance(since, int) else F.expr(since))
    names = [c.name for c in columns] + [VERSION_COLUMN, DELETED_COLUMN, "kafka_offset"]
    newest = F.max_by(F.struct(*[F.col(quoted(n)) for n in names]), F.struct(VERSION_COLUMN, "kafka_offset"))
    out = [
        *[F.col("c")[c.name].alias(c.name) for c in columns],
        F.col("c")[VERSION_COLUMN].alias(VERSION_COLUMN),
        F.col("c")[DELETED_COLUMN].alias(DELETED_COLUMN),
    ]
    known = F.when(F.col(_SCHEMA_ERROR).isNull(), F.lit(True)).otherwise(F.raise_error(F.col(_SCHEMA_ERROR)))
    return _ChangePlan(keep, parsed, rows, newer, [F.col(quoted(k)) for k in key], newest, out, known)


SCHEMA_MARKER = "schema"  # in each stream commit's marker: the columns the current table follows (see below)


class CurrentChanges:
    """The ``current`` mode's batch -> changes step, following the source table's ``ALTER TABLE`` statements.

    The sink's columns are the full load's, evolved by every schema record applied since (the state rides in
    each commit's marker under :data:`SCHEMA_MARKER`: columns, fills, the version of the last statement applied,
    the full load they build on; a new full load starts again from its own columns). A batch holding a new
    schema record evolves the columns (:func:`~exactly_once_provider.spark_jobs.schema_change.evolve`, which also
    refuses what cannot be followed, failing the batch before anything of it is committed) and returns, with the
    batch's changes, the :class:`~exactly_once_provider.sinks.base.SchemaChange` the caller passes to the sink's
    ``commit`` with them:

    * ``state``: the state the commit records, and ``changed``: the commit must evolve the table (Delta schema
      evolution in the MERGE: a ``metaData`` action in the same commit as the batch);
    * ``new_fills``: the rows written before the statement take the value the server gave them without a row
      event (an added column's default, NULL in a dropped column). For Delta they are merged as part of the
      batch's source, rewritten in the same commit, with the update rule relaxed to ``>=``: a row equal in
      version to its source row is that row (versions are unique per key), so re-applying it only adds the fill.

    :param source: the handoff of the full load the table builds on.
    :param sink: the :class:`~exactly_once_provider.sinks.delta.DeltaSink` or
        :class:`~exactly_once_provider.sinks.postgres.PostgresSink` (current mode) of the table; the PostgreSQL
        one fills the older rows itself (``fills_in_place``: an ``UPDATE`` in the batch's transaction).
    """

    def __init__(self, source: Any, sink: Any) -> None:
        self.source = source
        self.sink = sink
        self.name = f"{source.schema}.{source.table}"

    @property
    def change_key(self) -> Any:
        """Where a change record names its key and version (a dead letter's, read on the driver)."""
        from exactly_once_provider.sinks.dead_letters import ChangeKey

        return ChangeKey.current(tuple(self.source.key))

    def _state(self) -> tuple[list[Column], list[Fill], int]:
        previous = self.sink.committed()
        body = previous.extra.get(SCHEMA_MARKER) if previous else None
        if body and body.get("load_id") == self.source.load_id:
            return ([Column(**c) for c in body["columns"]], [Fill(*f) for f in body["fills"]], int(body["applied"]))
        # A statement at or before the snapshot is in the full load's columns already (the capture skips it).
        return list(self.source.columns), [], self.source.min_version

    def __call__(self, df: Any, schema_records: bool = False) -> tuple[Any, SchemaChange]:
        """Return the batch's changes as rows of the current table and the columns their commit records (see the
        class).

        :param df: the micro-batch.
        :param schema_records: read the batch's schema records first (one more pass over the batch) and follow
            them. Without it, the common case (a batch holds no schema change), the batch is planned on the
            columns as they are: a schema record in it newer than the last one followed fails the MERGE's read
            of its source with :data:`SCHEMA_AHEAD`, before anything is written, and
            :func:`~exactly_once_provider.spark_jobs.kafka_to_sink.process_batch` plans the batch again with it.
        """
        from pyspark.sql import functions as F

        columns, fills, applied = self._state()
        started_at = applied
        found = (
            [
                SchemaRecord.from_json(json.loads(row[0]))
                for row in df.filter(F.col("record_value").startswith(DDL_PREFIX)).select("record_value").collect()
            ]
            if schema_records
            else []
        )
        new_fills: list[Fill] = []
        for record in sorted((r for r in found if r.version > applied), key=lambda r: r.version):
            columns, added = evolve(columns, self.source.key, record, self.name)
            new_fills += added
            applied = record.version
            log.info(
                "Schema change at %s on %s followed: %s (columns now %s; %d fill(s) of older rows)",
                record.position,
                self.name,
                record.query[:200],
                [c.name for c in columns],
                len(added),
            )
        fills = fills + new_fills
        schema = SchemaChange(
            state={
                "load_id": self.source.load_id,
                "columns": [c.to_json() for c in columns],
                "fills": [[f.column, f.version, f.value, f.source] for f in fills],
                "applied": applied,
            },
            changed=applied != started_at,
            new_fills=tuple(new_fills),
        )
        changes = typed_changes(
            df,
            columns,
            self.source.key,
            self.source.schema,
            self.source.table,
            fills,
            since=self.source.snapshot_version_sql(quoted(self.source.key[0])),
            refuse_schema_after=None if schema_records else applied,
            applied=applied,
        )
        if not new_fills or self.sink.fills_in_place:  # PostgreSQL: an UPDATE in the batch's transaction
            return changes, schema
        return self._with_backfill(changes, columns, new_fills), schema

    def letter_rules(self, raw: Any) -> list[tuple[Any, str, Any]]:
        """Return the dead-letter rules of the typed conversion (:func:`~exactly_once_provider.sinks.dead_letters.flag`
        form: condition, error class, message column) over a raw batch (binary ``value``): ``schema_version``, then
        ``decimal_overflow`` per DECIMAL column (:mod:`~exactly_once_provider.sinks.bad_values`).

        Judged on the columns as the batch's own schema records leave them (read here: one pass over the cached
        batch), so a change after a followed ``ADD COLUMN`` is good. A schema change the table cannot follow still
        stops the job (:class:`~exactly_once_provider.spark_jobs.schema_change.RefusedSchemaChange`): a full reload,
        not a letter, is its fix. A change older than a fill of a column takes the fill's value there, so its own
        value of it cannot be bad.
        """
        from pyspark.sql import functions as F
        from pyspark.sql.types import DecimalType, StringType, StructField, StructType

        text = F.try_validate_utf8(F.col("value").cast("string"))
        columns, fills, applied = self._state()
        found = [
            SchemaRecord.from_json(json.loads(row[0]))
            for row in raw.select(text.alias("v")).filter(F.col("v").startswith(DDL_PREFIX)).collect()
        ]
        for record in sorted((r for r in found if r.version > applied), key=lambda r: r.version):
            columns, added = evolve(columns, self.source.key, record, self.name)
            fills, applied = fills + added, record.version
        image = F.coalesce(F.get_json_object(text, "$.after"), F.get_json_object(text, "$.before"))
        version = F.get_json_object(text, "$.version").try_cast("bigint")
        change = (
            ~text.startswith(DDL_PREFIX)
            & (F.get_json_object(text, "$.source.schema") == F.lit(self.source.schema))
            & (F.get_json_object(text, "$.source.table") == F.lit(self.source.table))
            & image.isNotNull()
            & (version >= self._snapshot_version())  # as typed_changes' since: older ones are left out, not judged
        )
        rules = [
            (
                change & bad_values.has_unknown_columns(image, [c.name for c in columns]),
                bad_values.SCHEMA_VERSION,
                bad_values.schema_error(columns, applied, self.name, text, image),
            )
        ]
        types = {f.name: f.dataType for f in spark_schema(columns).fields}
        decimals = [c for c in columns if isinstance(types[c.name], DecimalType)]
        values = (
            F.from_json(image, StructType([StructField(c.name, StringType()) for c in decimals])) if decimals else None
        )
        for column in decimals:
            value = values[column.name]
            bad = change & bad_values.bad_decimal(value, types[column.name])
            newest_fill = max((f.version for f in fills if f.column == column.name), default=None)
            if newest_fill is not None:  # an older change takes the fill's value in this column (_filled)
                bad = bad & (version >= F.lit(newest_fill))
            message = bad_values.decimal_error(column, types[column.name], self.name, value)
            rules.append((bad, bad_values.DECIMAL_OVERFLOW, message))
        return rules

    def _snapshot_version(self) -> Any:
        """Return the Spark column of a raw record's snapshot version (:meth:`Handoff.snapshot_version_sql` of its
        image's key, as :func:`typed_changes` reads it): its chunk's for one integer key column, else the oldest
        chunk's."""
        from pyspark.sql import functions as F

        name = self.source.key[0]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):  # a name a JSON path cannot spell plainly
            return F.lit(self.source.min_version)
        text = "try_validate_utf8(CAST(value AS STRING))"
        key = f"try_cast(coalesce(get_json_object({text}, '$.after.{name}'), get_json_object({text}, '$.before.{name}')) AS BIGINT)"
        return F.expr(self.source.snapshot_version_sql(key))

    def _with_backfill(self, changes: Any, columns: list[Column], fills: list[Fill]) -> Any:
        """Add the table's rows older than the newest fill, filled, to ``changes`` (newest per key kept)."""
        from pyspark.sql import functions as F

        types = {f.name: f.dataType for f in spark_schema(columns).fields}
        table = changes.sparkSession.read.format("delta").load(self.sink.path)
        held = set(table.columns)
        newest = max(f.version for f in fills)
        version = F.col(VERSION_COLUMN)

        def held_value(name: str) -> Any:
            return F.col(quoted(name)) if name in held else F.lit(None).cast(types[name])

        old = table.filter(version < F.lit(newest)).select(
            *[_filled(c.name, fills, version, held_value, types[c.name]).alias(c.name) for c in columns],
            VERSION_COLUMN,
            DELETED_COLUMN,
        )
        both = changes.withColumn("_eo_change", F.lit(1)).unionByName(old.withColumn("_eo_change", F.lit(0)))
        names = [c.name for c in columns] + [VERSION_COLUMN, DELETED_COLUMN]
        newest_row = F.max_by(F.struct(*[F.col(quoted(n)) for n in names]), F.struct(VERSION_COLUMN, "_eo_change"))
        return (
            both.groupBy(*[F.col(quoted(k)) for k in self.source.key])
            .agg(newest_row.alias("c"))
            .select(*[F.col("c")[n].alias(n) for n in names])
        )
