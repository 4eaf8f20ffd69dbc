"""Operator: reconcile a source table with its sink by key range; store the result; fail on a mismatch."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from airflow.sdk.exceptions import AirflowException

from exactly_once_provider import lineage
from exactly_once_provider import lineage_facets as facets
from exactly_once_provider.connections import connect_kwargs, postgres_connection
from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.hooks.kafka_client import checked_kafka_config
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.operators.failures import fail_task_on_pipeline_error
from exactly_once_provider.operators.spark_submit import PackagedSparkJobOperator
from exactly_once_provider.plugins.links import PipelineStatusLink
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.reconcile import catalog, engine, letters, position, results, run, sides
from exactly_once_provider.reconcile import scope as change_scope
from exactly_once_provider.reconcile.keys import Key
from exactly_once_provider.reconcile.run import report_from_json
from exactly_once_provider.sinks import dead_letters
from exactly_once_provider.source.server import source_secrets
from exactly_once_provider.storage import is_s3, open_storage

SCOPES = ("full", "changed")
DELTA_READERS = ("auto", "spark", "delta-rs")
# A whole Delta table of up to this many rows is compared in the task by delta-rs when delta_reader="auto": no
# Spark application to start (at 1M rows 9.9 s against 24.4 s through Spark, docs/benchmarks.md), and the
# keys and hashes it holds in memory stay small. A whole database's first reconciliations then start no Spark.
DELTA_RS_MAX_ROWS = 1_000_000
# What each entry of ``tables`` may set: the arguments that differ from one table to the next.
PER_TABLE = frozenset(
    {
        "name",
        "table",
        "key_column",
        "columns",
        "sink_path",
        "sink_table",
        "sink_key_column",
        "source_filter",
        "sink_filter",
        "base_path",
        "topics",
        "full_load_path",
    }
)


class ReconciliationMismatch(AirflowException):
    """Raise when the sink differs from the source (the report names the differing keys)."""


class ReconcileOperator(facets.OpenLineageMixin, PackagedSparkJobOperator):
    """
    Compare a MySQL/MariaDB table with its sink by key range (counts + checksums), bisecting to the keys.

    Costs one full scan per side when nothing differs (see :mod:`exactly_once_provider.reconcile.engine`).
    For a CDC pipeline (``capture_pipeline`` set) the comparison runs at a common position without stopping
    anything: keys changed at the source after the position the sink reached are reported as in flight, not
    as mismatches (the rule: :mod:`exactly_once_provider.reconcile.position`). The result is logged as a
    table, stored in the PostgreSQL table ``eo_reconciliation`` (:mod:`~exactly_once_provider.reconcile.results`)
    and returned (XCom mirrors it for display).

    A PostgreSQL sink is compared from the task itself. A Delta sink is compared in a Spark application
    submitted through the Spark connection (cluster deploy mode supported): the driver pins the Delta table's
    version, opens the source snapshot and runs the comparison; its report comes back in a small result file
    and the task stores it and fails on a mismatch as for PostgreSQL. A retry compares again (``durable`` is
    off: the comparison only reads).

    :param name: the reconciliation's name in the result table (usually the pipeline).
    :param table: the source table, ``table`` or ``schema.table``.
    :param tables: several tables in this one task instead of ``name`` and ``table``: a list of mappings of the
        arguments that differ per table (``name``, ``table``, ``key_column``, ``columns``, ``sink_path`` or
        ``sink_table``, ``topics``, ``full_load_path``...; :data:`PER_TABLE`), the other arguments shared. Each
        table is compared in turn (a Delta table of up to :data:`DELTA_RS_MAX_ROWS` rows in the task, a larger
        one in its own Spark application) and stored under its own ``name``; the task logs one line per table
        and fails after the last one if any differs (or could not be compared), naming them. XCom:
        ``{"tables": {name: result}}``.
    :param full_scope_tables: tables (``schema.table`` or bare names; a list or its JSON text) compared in full
        whatever ``scope`` says, e.g. the tables a full load loaded in this run.
    :param sink: ``delta``, ``postgres`` or ``iceberg`` (a plain table, e.g. the current table, read in this task
        with pyiceberg at its current snapshot; its tombstones: ``sink_deleted_column="_eo_deleted"``).
    :param sink_path: the Delta table (``delta``); ``iceberg``: the table's location (``<full load>_iceberg`` for a
        current table), for its lineage and to read it on ``s3://`` with ``aws_conn_id``.
    :param sink_table: the PostgreSQL table (``postgres``); ``iceberg``: the table, ``namespace.table``.
    :param key_column: the key: one column or a list of columns unique together; default: the table's primary
        key. A single integer column is bisected by value (index range reads on the source); any other key (text,
        composite) by the 60-bit hash of its canonical text (:mod:`~exactly_once_provider.reconcile.keys`: each
        bisection level scans the source table, and differences are named by the key's text).
    :param columns: the columns to compare; default: every source column.
    :param source_filter: SQL predicate (MariaDB) selecting the source rows to compare, e.g. a window.
    :param sink_filter: SQL predicate in the sink's dialect selecting the sink rows, e.g. a batch.
    :param sink_key_column: the sink's key column of a plain table; default ``key_column``.
    :param sink_json_column: the sink column holding each row as JSON (CDC/window records).
    :param sink_json_path: dotted path to the row inside that JSON, e.g. ``"after"`` or ``"row"``.
    :param sink_key_json_paths: dotted JSON paths tried in order for the key (e.g. ``["after.id", "before.id"]``).
    :param sink_deleted_column: tombstone column (rows where it is true are absent).
    :param sink_binary_encoding: how JSON records carry binary values: ``hex`` (watermark) or ``base64`` (binlog).
    :param base_path: Delta CDC: the full-load table the changes table applies on top of.
    :param sink_version_column: Delta CDC with ``base_path``: the changes' source version column; a change older
        than its chunk's snapshot (left from before a full reload) does not replace the full-load row.
    :param capture_pipeline: CDC: the capture's pipeline name in the offsets ledger (enables the common position).
    :param capture_source_partition: CDC: the capture's source partition in the ledger (the capture's default).
    :param topics: CDC: the data topics the sink applies (their stable end offsets must be applied).
    :param sink_pipeline: CDC: the Spark job's pipeline name whose sink-committed offsets are checked; with or
        without CDC, the pipeline whose dead letters are read (``dead_letter_store``).
    :param full_load_path: CDC before the first capture: the full-load table whose smallest chunk position
        is the captured position; default ``base_path``.
    :param scope: ``full`` compares the whole table; ``changed`` (CDC) compares only the keys of the change
        records the sink applied since the last clean reconciliation of ``name``, plus its in-flight keys
        (:mod:`~exactly_once_provider.reconcile.scope`): its cost follows the changes, not the table. Without a
        clean reconciliation to start from, ``changed`` compares in full.
    :param delta_reader: how a Delta sink is read: ``spark`` (a Spark application; any table size), ``delta-rs``
        (in the task through the ``deltalake`` package, no application to start; the compared rows' keys and hashes
        are held in memory, so meant for a ``changed`` scope or a small table) or ``auto``: ``delta-rs`` for a
        ``changed`` scope of a plain table (local or on S3) and for a whole plain table of up to
        :data:`DELTA_RS_MAX_ROWS` rows (its log's row counts), ``spark`` otherwise.
    :param fail_on_mismatch: fail the task when a real mismatch is found (in-flight keys never fail it).
    :param dead_letter_store: the dead-letter store of ``sink_pipeline`` (``on_bad_record="dead_letter"``): a
        differing key of one of its letters is reported as ``dead_lettered``, named, not as a mismatch
        (:mod:`~exactly_once_provider.reconcile.letters`); default the sink's default store
        (``<sink_table>_dead_letters`` / ``<sink_path>_dead_letters``), read when ``sink_pipeline`` is set.
    :param store_result: insert the result row into PostgreSQL (``postgres_conn_id``).
    :param fanout: sub-segments per bisection step.
    :param max_segments: segments of the first, full-table pass.
    :param leaf_width: key width compared key by key.
    :param mysql_conn_id: the source ``mysql`` connection.
    :param postgres_conn_id: the ``postgres`` connection (PostgreSQL sink and the result table).
    :param spark_conn_id: the ``spark`` connection (Delta sink; see
        :class:`~exactly_once_provider.operators.spark_submit.PackagedSparkJobOperator` for the other Spark
        arguments).
    :param kafka_config_id: the ``kafka`` connection (CDC).
    :param offsets_topic: the offsets ledger topic (CDC).
    :param aws_conn_id: the standard ``aws`` connection of a Delta sink (or an Iceberg table) on ``s3://``
        (credentials, ``endpoint_url``).
    :param iceberg_conn_id: ``iceberg``: the ``postgres`` connection of the database holding the SQL catalog.
    :param iceberg_catalog: ``iceberg``: the catalog's name.
    :param spark_conf: extra Spark settings (e.g. ``spark.jars`` with the Delta connector).
    """

    template_fields: Sequence[str] = (
        "name",
        "table",
        "tables",
        "full_scope_tables",
        "sink_path",
        "sink_table",
        "source_filter",
        "sink_filter",
        "base_path",
        "capture_pipeline",
        "sink_pipeline",
        "scope",
        "fail_on_mismatch",
        "postgres_conn_id",  # templated, and serialized with the DAG: the status page finds the results there
    )
    ui_color = "#e8eef4"
    operator_extra_links = (PipelineStatusLink(),)
    job_name = "reconcile"
    job_module = "exactly_once_provider.reconcile.__main__"

    def __init__(
        self,
        *,
        name: str | None = None,
        table: str | None = None,
        sink: str,
        tables: Sequence[Mapping[str, Any]] | None = None,
        full_scope_tables: Sequence[str] | str | None = None,
        sink_path: str | None = None,
        sink_table: str | None = None,
        key_column: str | Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
        source_filter: str | None = None,
        sink_filter: str | None = None,
        sink_key_column: str | None = None,
        sink_json_column: str | None = None,
        sink_json_path: str | None = None,
        sink_key_json_paths: Sequence[str] | None = None,
        sink_deleted_column: str | None = None,
        sink_binary_encoding: str = "hex",
        base_path: str | None = None,
        sink_version_column: str | None = None,
        capture_pipeline: str | None = None,
        capture_source_partition: str = "binlog",
        topics: Sequence[str] | None = None,
        sink_pipeline: str | None = None,
        full_load_path: str | None = None,
        scope: str = "full",
        delta_reader: str = "auto",
        fail_on_mismatch: bool | str = True,
        dead_letter_store: str | None = None,
        store_result: bool = True,
        fanout: int = 16,
        max_segments: int = 256,
        leaf_width: int = 16,
        mysql_conn_id: str = "mysql_default",
        postgres_conn_id: str = "postgres_default",
        spark_conn_id: str = "spark_default",
        kafka_config_id: str = "kafka_default",
        offsets_topic: str = "eo-offsets",
        aws_conn_id: str = "aws_default",
        iceberg_conn_id: str = "postgres_default",
        iceberg_catalog: str = "eo",
        spark_conf: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("durable", False)  # the report exists only in this try's result file; a rerun only reads
        super().__init__(spark_conn_id=spark_conn_id, conf=spark_conf, **kwargs)
        self.name, self.table, self.sink, self.sink_path, self.sink_table = name, table, sink, sink_path, sink_table
        self.key_column, self.columns, self.source_filter, self.sink_filter = (
            key_column,
            columns,
            source_filter,
            sink_filter,
        )
        self.sink_key_column, self.sink_json_column, self.sink_json_path = (
            sink_key_column,
            sink_json_column,
            sink_json_path,
        )
        self.sink_key_json_paths, self.sink_deleted_column, self.base_path = (
            sink_key_json_paths,
            sink_deleted_column,
            base_path,
        )
        self.sink_binary_encoding, self.sink_version_column = sink_binary_encoding, sink_version_column
        self.capture_pipeline, self.capture_source_partition = capture_pipeline, capture_source_partition
        self.topics, self.sink_pipeline, self.full_load_path = topics, sink_pipeline, full_load_path
        self.scope, self.fail_on_mismatch, self.store_result = scope, fail_on_mismatch, store_result
        self.delta_reader = delta_reader
        self.dead_letter_store = dead_letter_store
        self.fanout, self.max_segments, self.leaf_width = fanout, max_segments, leaf_width
        self.mysql_conn_id, self.postgres_conn_id, self.spark_conn_id = mysql_conn_id, postgres_conn_id, spark_conn_id
        self.kafka_config_id, self.offsets_topic, self.spark_conf = kafka_config_id, offsets_topic, spark_conf or {}
        self.aws_conn_id, self.iceberg_conn_id, self.iceberg_catalog = aws_conn_id, iceberg_conn_id, iceberg_catalog
        self.tables, self.full_scope_tables = tables, full_scope_tables
        self._views: list[ReconcileOperator] | None = None

    @property
    def status_pipeline(self) -> str | None:
        """The pipeline whose flow card shows this reconciliation (its results are stored under ``name``; several
        tables: the capture's flow, which holds them all)."""
        return self.name if self.tables is None else self.capture_pipeline

    # ------------------------------------------------------------------------------------------ checks
    def _sink_spec(self) -> sides.SinkSpec:
        location = self._sink_location()
        split = lambda p: tuple(part for part in (p or "").split(".") if part)
        spec = sides.SinkSpec(
            kind=self.sink,
            location=location or "",
            key_column=self.sink_key_column,
            json_column=self.sink_json_column,
            json_path=split(self.sink_json_path),
            deleted_column=self.sink_deleted_column,
            filter=self.sink_filter,
            base_path=self.base_path,
            key_json_paths=tuple(split(p) for p in self.sink_key_json_paths or ()),
            binary_encoding=self.sink_binary_encoding,
            version_column=self.sink_version_column,
        )
        spec.validate()
        if self.scope not in SCOPES:
            raise ValueError(f"scope={self.scope!r}: use one of {SCOPES}.")
        if self.delta_reader not in DELTA_READERS:
            raise ValueError(f"delta_reader={self.delta_reader!r}: use one of {DELTA_READERS}.")
        if self.delta_reader == "delta-rs" and (spec.kind != "delta" or spec.json_column or spec.filter):
            raise ValueError(
                "delta_reader='delta-rs' reads a plain Delta table (the current table, a full load): "
                "not a PostgreSQL sink, a JSON-record sink (sink_json_column) or a sink_filter (Spark "
                "SQL); use delta_reader='spark'."
            )
        if self.scope == "changed" and not self.capture_pipeline:
            raise ValueError(
                "scope='changed' reads the change records the sink applied: it needs capture_pipeline, "
                "topics and sink_pipeline (a CDC pipeline)."
            )
        if self.capture_pipeline and not (self.topics and self.sink_pipeline):
            raise ValueError(
                "capture_pipeline (CDC common position) also needs topics and sink_pipeline: the "
                "sink must have applied everything the capture committed before comparing."
            )
        return spec

    # ------------------------------------------------------------------------------------------ run
    def _request(self) -> dict[str, Any]:
        """Check the arguments and read what the comparison needs from the source's catalog (in this task)."""
        spec = self._sink_spec()
        source_hook = MySqlSourceHook(self.mysql_conn_id)
        schema, _, table = self.table.rpartition(".")
        schema = schema or source_hook.get_connection(self.mysql_conn_id).schema
        if not schema:
            raise ValueError(f"table={self.table!r} has no schema and connection {self.mysql_conn_id!r} has none.")
        with source_hook.cursor() as cur:
            key, columns = catalog.key_and_columns(cur, schema, table, self.key_column, self.columns)
        columns, pending = self._sink_columns(spec, key, columns)
        self._sink_offsets: dict | None = None
        captured = self._captured_position(table) if self.capture_pipeline or self.full_load_path else None
        return {
            "spec": spec,
            "source_hook": source_hook,
            "schema": schema,
            "table": table,
            "key": key,
            "columns": columns,
            "captured": captured,
            "started_at": datetime.now(UTC),
            "sink_offsets": self._sink_offsets,
            "scope": self._scope_ranges(key),
            "pending_columns": pending,
        }

    def _sink_columns(self, spec: sides.SinkSpec, key: Key, columns: list[Column]) -> tuple[list[Column], list[str]]:
        """Return the compared columns the sink's table has, and those it does not have yet (catalog.split_pending)."""
        columns, pending = catalog.split_pending(
            spec, key, columns, lambda: self._held_columns(spec), bool(self.columns)
        )
        if pending:
            self.log.warning(
                "Columns %s of %s are not in the sink %s yet (an ADD COLUMN its apply has not reached):"
                " compared without them, reported as pending; the next reconciliation compares the "
                "whole table.",
                pending,
                self.table,
                spec.location,
            )
        return columns, pending

    def _held_columns(self, spec: sides.SinkSpec) -> set[str] | None:
        """Return the column names of the sink's table (None: no table yet)."""
        if spec.kind == "iceberg":
            table = self._iceberg_table()
            return None if table is None else {f.name for f in table.schema().fields}
        if spec.kind != "postgres":
            return catalog.sink_column_names(spec, table=self._delta_table(spec.location))
        conn = self._postgres()
        try:
            return catalog.sink_column_names(spec, pg_conn=conn)
        finally:
            conn.close()

    def _scope_ranges(self, key: Key) -> engine.Ranges | None:
        """Return the key ranges of a ``changed`` reconciliation, or None to compare the whole table."""
        if self.scope != "changed":
            return None
        store = self._postgres()
        try:
            return change_scope.changed_scope(store, self.name, self._kafka(), self._sink_offsets or {}, key)
        finally:
            store.close()

    def _reads_with_delta_rs(self, spec: sides.SinkSpec, ranges: engine.Ranges | None) -> bool:
        if self.delta_reader != "auto":
            return self.delta_reader == "delta-rs"
        if spec.json_column or spec.filter:
            return False
        return ranges is not None or self._delta_rows(spec.location) <= DELTA_RS_MAX_ROWS

    def _delta_rows(self, location: str) -> float:
        """Return the rows of the Delta table's newest version (:func:`~exactly_once_provider.reconcile.catalog.delta_rows`)."""
        return catalog.delta_rows(self._delta_table(location))

    def _delta_table(self, location: str) -> Any:
        """Return a Delta sink's location, or its storage on S3 (with ``aws_conn_id``'s settings)."""
        s3 = self._s3_settings()
        return open_storage(location, s3) if s3 is not None else location

    def _comparison(self, r: dict[str, Any]) -> run.Comparison:
        return run.Comparison(
            r["source_hook"],
            r["schema"],
            r["table"],
            r["key"],
            r["columns"],
            self.source_filter,
            r["captured"],
            self.fanout,
            self.max_segments,
            self.leaf_width,
            r["scope"],
        )

    # ------------------------------------------------------------------------------------------ several tables
    def table_views(self) -> list[ReconcileOperator]:
        """Return one one-table view of this operator per entry of ``tables`` (itself without ``tables``)."""
        if self.tables is None:
            if not (self.name and self.table):
                raise ValueError("Name the reconciliation and its table (name=, table=), or several with tables=[...].")
            return [self]
        if self.table is not None or isinstance(self.tables, (str, Mapping)) or not self.tables:
            raise ValueError("Pass table= (with name=) or tables=[{name, table, ...}, ...], not both.")
        if self._views is None:
            views = []
            for entry in self.tables:
                unknown = sorted(set(entry) - PER_TABLE)
                if unknown or not entry.get("name") or not entry.get("table"):
                    raise ValueError(
                        f"tables: {dict(entry)!r}: each entry names its name and table, and only arguments of "
                        f"one table ({sorted(PER_TABLE)}); not {unknown}."
                    )
                view = copy.copy(self)
                view.tables, view._views, view._s3, view.openlineage_result = None, None, None, None
                for key, value in entry.items():
                    setattr(view, key, value)
                views.append(view)
            names = [v.name for v in views]
            if len(set(names)) != len(names):
                raise ValueError(f"tables: the names {names} must differ (each table's result is stored by its name).")
            self._views = views
        return self._views

    def _in_full_scope(self) -> bool:
        """Return whether ``full_scope_tables`` names this table (qualified or bare)."""
        value = self.full_scope_tables
        if isinstance(value, str):
            value = json.loads(value) if value.strip() else []
        named = set(value or ())
        return self.table in named or self.table.rpartition(".")[2] in named

    def _execute_tables(self, context: Any) -> dict:
        """Compare each table of ``tables`` in turn; fail after the last one if any differs or failed."""
        views = self.table_views()
        results_by_name: dict[str, dict] = {}
        failed: dict[str, str] = {}
        for number, view in enumerate(views, 1):
            started = time.monotonic()
            self.log.info("reconciliation %d of %d: %s (%s)", number, len(views), view.name, view.table)
            try:
                results_by_name[view.name] = view.execute_one(context)
            except Exception as err:  # every table is compared; the task fails below, naming each failure
                failed[view.name] = f"{type(err).__name__}: {err}"
                self.log.error("reconciliation %s failed: %s", view.name, failed[view.name])
            view.seconds = round(time.monotonic() - started, 1)
        self.openlineage_result = {"tables": results_by_name}
        self.log.info("\n%s", _tables_summary(views, results_by_name, failed))
        if failed:
            error = ReconciliationMismatch if all("ReconciliationMismatch" in e for e in failed.values()) else None
            message = f"{len(failed)} of {len(views)} tables failed their reconciliation: " + "; ".join(
                f"{name}: {why[:500]}" for name, why in failed.items()
            )
            raise (error or AirflowException)(message)
        return {"tables": results_by_name}

    @fail_task_on_pipeline_error()
    def execute(self, context: Any) -> dict:
        if self.tables is not None:
            return self._execute_tables(context)
        self.table_views()  # name and table are given
        return self.execute_one(context)

    def execute_one(self, context: Any) -> dict:
        """Compare one table (this operator's ``table``, or one view's of ``tables``)."""
        if self.scope != "full" and self.full_scope_tables and self._in_full_scope():
            self.log.info("%s is compared in full (full_scope_tables: e.g. loaded in this run)", self.table)
            self.scope = "full"
        spec = self._sink_spec()
        if self._s3_settings() is not None:  # every read of the sink's log in this task goes through them
            from exactly_once_provider.storage.s3 import register_settings

            register_settings(self._s3_settings())
        if spec.kind == "delta":
            self._delta_request = r = self._request()
            if not self._reads_with_delta_rs(spec, r["scope"]):
                self.log.info("Reading the Delta sink in a Spark application (delta_reader=%s)", self.delta_reader)
                return super().execute(context)  # the Spark application: job_params -> driver -> job_result
            return self._compare_with_delta_rs(context, r)
        r = self._request()
        if spec.kind == "iceberg":
            return self._compare_with_iceberg(context, r)
        pg_conn = self._postgres()
        try:
            report, common = run.compare_with_postgres(self._comparison(r), spec, pg_conn)
            return self._finish(context, r, report, common.to_json() if common else None, pg_conn)
        finally:
            pg_conn.close()

    def _compare_with_delta_rs(self, context: Any, r: dict[str, Any]) -> dict:
        """Compare a Delta sink read in this task with delta-rs (no Spark application)."""
        spec: sides.SinkSpec = r["spec"]
        s3 = self._s3_settings()
        options = s3.delta_rs_options() if s3 is not None else None
        report, common = run.compare_with_delta_rs(self._comparison(r), spec, self._delta_table(spec.location), options)
        return self._finish(context, r, report, common.to_json() if common else None)

    def _compare_with_iceberg(self, context: Any, r: dict[str, Any]) -> dict:
        """Compare an Iceberg sink read in this task with pyiceberg (no Spark application)."""
        spec: sides.SinkSpec = r["spec"]
        table = self._iceberg_table()
        if table is None:
            raise ValueError(f"The Iceberg table {spec.location} is not in catalog {self.iceberg_catalog!r}.")
        report, common = run.compare_with_iceberg(self._comparison(r), spec, table)
        return self._finish(context, r, report, common.to_json() if common else None)

    def _iceberg_table(self) -> Any:
        """Return the Iceberg sink's pyiceberg table, from the SQL catalog of ``iceberg_conn_id`` (None: not there)."""
        from pyiceberg.exceptions import NoSuchTableError

        from exactly_once_provider.sinks.iceberg import catalog_settings, open_catalog

        catalog = open_catalog(catalog_settings(self.iceberg_conn_id, self.iceberg_catalog), self._s3_settings())
        try:
            return catalog.load_table(self.sink_table)
        except NoSuchTableError:
            return None

    def _sink_location(self) -> str | None:
        """Return what names the sink to its reader: the Delta table's path, or the PostgreSQL / Iceberg table."""
        return self.sink_path if self.sink == "delta" else self.sink_table

    def job_params(self, context: Any) -> dict[str, Any]:
        r = getattr(self, "_delta_request", None) or self._request()
        self._delta_request = r
        captured: BinlogPosition | None = r["captured"]
        return {
            "sink": asdict(r["spec"]),
            "schema": r["schema"],
            "table": r["table"],
            "key": [c.to_json() for c in r["key"].columns],
            "columns": [c.to_json() for c in r["columns"]],
            "source_filter": self.source_filter,
            "captured": str(captured) if captured is not None else None,
            "fanout": self.fanout,
            "max_segments": self.max_segments,
            "leaf_width": self.leaf_width,
            "mysql_conn_id": self.mysql_conn_id,
            "scope": r["scope"],
            # A JSON-record sink (a settlement window) with the default column list: columns none of its
            # records hold yet (added at the source after they were written) are found by the job.
            "find_pending": bool(r["spec"].json_column and not self.columns),
        }

    def _s3_settings(self):
        """Return the S3 settings of ``aws_conn_id`` for a Delta sink or an Iceberg table on S3 (read once per run), else
        None."""
        if self.sink not in ("delta", "iceberg") or not self.sink_path or not is_s3(self.sink_path):
            return None
        if getattr(self, "_s3", None) is None:
            from exactly_once_provider.storage.s3 import S3Settings

            self._s3 = S3Settings.from_connection(self.aws_conn_id)
        return self._s3

    def job_secrets(self) -> dict[str, Any]:
        # Resolved here, through the hook; the driver rebuilds the source from the secrets file (source_from_secrets).
        secrets: dict[str, Any] = source_secrets(MySqlSourceHook(mysql_conn_id=self.mysql_conn_id))
        if self._s3_settings() is not None:  # the driver's storage and s3a settings (never a command line)
            secrets["s3"] = self._s3_settings().to_json()
        return secrets

    def job_result(self, result: Any, context: Any) -> dict:
        if result is None:
            raise AirflowException(f"The reconciliation job of {self.name} wrote no result; see its driver's log.")
        r = self._delta_request
        held_by_none = [c for c in result.get("pending_columns") or () if c not in (r.get("pending_columns") or ())]
        if held_by_none:
            self.log.warning(
                "Columns %s of %s are in none of the sink's records%s (added at the source after they "
                "were written): compared without them, reported as pending. A settlement window gets "
                "them when it is re-extracted (reextract=true).",
                held_by_none,
                self.table,
                f" matching {r['spec'].filter}" if r["spec"].filter else "",
            )
            r = {**r, "pending_columns": [*(r.get("pending_columns") or ()), *held_by_none]}
        return self._finish(context, r, report_from_json(result["report"]), result["position"])

    def _finish(
        self, context: Any, r: dict[str, Any], report: engine.Report, common: dict | None, pg_conn: Any = None
    ) -> dict:
        """Log the report, store it, return it for XCom; raise on a real mismatch when asked to."""
        spec, schema, table = r["spec"], r["schema"], r["table"]
        fail = str(self.fail_on_mismatch).strip().lower() in ("true", "1", "yes")
        pending = r.get("pending_columns") or []
        common = position.position_record(common, r.get("sink_offsets"), pending, r.get("scope"))
        dead_lettered = letters.relabel(report, self._dead_lettered(spec, r["key"], pg_conn))
        finished_at = datetime.now(UTC)
        self.log.info(
            "\n%s",
            engine.summary_table(
                report, f"reconciliation {self.name} ({schema}.{table} vs {spec.kind} {spec.location})"
            ),
        )
        for q in report.queries:
            self.log.info(
                "query %-6s %-8s full_scan=%s ranges=%d rows=%d %.2fs",
                q.side,
                q.kind,
                q.full_scan,
                q.ranges,
                q.rows,
                q.seconds,
            )
        result_id = None
        if self.store_result:
            store = pg_conn if pg_conn is not None else self._postgres()
            try:
                ti = context.get("ti")
                result_id = results.store_result(
                    store,
                    self.name,
                    report,
                    r["started_at"],
                    finished_at,
                    common,
                    {
                        "dag_id": getattr(ti, "dag_id", None),
                        "run_id": getattr(ti, "run_id", None),
                        "task_id": getattr(ti, "task_id", None),
                        "try_number": getattr(ti, "try_number", None),
                    },
                )
            finally:
                if store is not pg_conn:
                    store.close()
        if dead_lettered:
            self.log.info(
                "%s apart from %d dead-lettered key(s), in the dead-letter store of %s: %s",
                "Clean" if report.clean else "Mismatches too",
                len(dead_lettered),
                self.sink_pipeline,
                ", ".join(dead_lettered[:100]),
            )
        summary = {
            "name": self.name,
            "result_id": result_id,
            **report.summary(),
            "dead_lettered_keys": dead_lettered[:100],
            "position": common,
            "pending_columns": pending,
            "differences": [d.__dict__ for d in report.differences[:100]],
        }
        self.openlineage_result = summary
        if not report.clean and fail:
            keys = ", ".join(f"{d.key} ({d.kind})" for d in report.differences if d.kind in engine.MISMATCH_KINDS)
            raise ReconciliationMismatch(
                f"Sink differs from {schema}.{table}: {report.mismatches} key(s): {keys[:2000]}. The result is "
                f"stored as {results.RESULT_TABLE} id {result_id}; rerun the load (or set fail_on_mismatch=False)."
            )
        return summary

    def openlineage_datasets(self, result: dict | None) -> tuple[list, list]:
        """The source table and the sink in (the full load too for CDC); the stored result row out."""
        if self.tables is not None:  # each table's own datasets
            inputs, outputs = [], []
            for view in self.table_views():
                found = view.openlineage_datasets((result or {}).get("tables", {}).get(view.name))
                inputs.extend(found[0])
                outputs.extend(found[1])
            return inputs, outputs
        inputs = [facets.input_dataset(lineage.mysql_table_of(self.mysql_conn_id, self.table))]
        if self.sink == "postgres":
            inputs.append(facets.input_dataset(lineage.postgres_table_of(self.postgres_conn_id, self.sink_table)))
        elif self.sink == "iceberg":  # named by its location, when given (the catalog's is not read here)
            inputs.extend([facets.input_dataset(lineage.iceberg_table(self.sink_path))] if self.sink_path else [])
        else:
            inputs.append(facets.input_dataset(lineage.storage_path(self.sink_path)))
        if self.base_path:
            inputs.append(facets.input_dataset(lineage.storage_path(self.base_path)))
        if not self.store_result:
            return inputs, []
        results_table = lineage.postgres_table_of(self.postgres_conn_id, results.RESULT_TABLE)
        if result is None:
            return inputs, [facets.output_dataset(results_table)]
        position = result.get("position")
        commit = facets.CommitFacet(
            pipeline=self.name, position=None if position is None else json.dumps(position, sort_keys=True, default=str)
        )
        return inputs, [facets.output_dataset(results_table, rows=1 if result["result_id"] else 0, commit=commit)]

    def _dead_lettered(self, spec: sides.SinkSpec, key: Key, pg_conn: Any = None) -> dict[int, str]:
        """Return the keys of ``sink_pipeline``'s dead letters (bisected integer -> label); {} without a pipeline."""
        if not self.sink_pipeline or spec.kind == "iceberg":  # the Iceberg sink dead-letters nothing yet
            return {}
        store = self.dead_letter_store or dead_letters.default_store(spec.kind, spec.location)
        if spec.kind == "postgres":
            conn = pg_conn if pg_conn is not None else self._postgres()
            try:
                values = letters.store_values("postgres", store, self.sink_pipeline, pg_conn=conn)
            finally:
                if conn is not pg_conn:
                    conn.close()
        else:
            s3 = self._s3_settings()
            options = s3.delta_rs_options() if s3 is not None else None
            values = letters.store_values("delta", store, self.sink_pipeline, storage_options=options)
        return letters.letter_keys(values, key, spec)

    def _kafka(self) -> dict[str, Any]:
        """Return the ``kafka`` connection's settings, checked on its brokers once per task (tables share them)."""
        if getattr(self, "_kafka_checked", None) is None:
            self._kafka_checked = checked_kafka_config(self.kafka_config_id)
        return self._kafka_checked

    def _postgres(self):
        return postgres_connection(self.postgres_conn_id)

    def _replication_settings(self, hook: MySqlSourceHook) -> dict[str, Any]:
        return hook.connection_settings().replication_settings()

    def _captured_position(self, table: str):
        """Return ``P``: the capture's committed position, once the sink applied all of it (position.captured_position)."""
        capture = None
        if self.capture_pipeline:
            capture = (self.capture_pipeline, self.capture_source_partition, self.offsets_topic)
        connect = None
        if capture and self.sink in ("postgres", "iceberg"):  # iceberg: the SQL catalog's database
            connect = connect_kwargs(self.iceberg_conn_id if self.sink == "iceberg" else self.postgres_conn_id)
        captured, self._sink_offsets = position.captured_position(
            self._kafka() if capture else {},
            capture,
            list(self.topics or ()),
            (self.sink, self._sink_location(), self.sink_pipeline, connect, self._s3_settings(), self.iceberg_catalog),
            self.full_load_path or self.base_path,
        )
        return captured


def _tables_summary(views: list[ReconcileOperator], done: dict[str, dict], failed: dict[str, str]) -> str:
    """Return one line per table of a several-table reconciliation: what a user looks at first."""
    header = f"{'name':<36} {'result':<9} {'scope':<8} {'source rows':>12} {'mismatches':>10} {'in flight':>9} {'s':>6}"
    lines = [header, "-" * len(header)]
    for view in views:
        found = done.get(view.name) or view.openlineage_result  # a mismatch: its stored summary
        if found is None:
            result, scope, rows, mismatches, in_flight = "FAILED", "", "", "", ""
        else:
            result = "CLEAN" if found["clean"] else "MISMATCH"
            scope = ((found.get("position") or {}).get("scope") or {}).get("kind", "")
            rows, in_flight = found["source_rows"], found["in_flight"]
            mismatches = sum(found[kind] for kind in engine.MISMATCH_KINDS)
        lines.append(
            f"{view.name[:36]:<36} {result:<9} {scope:<8} {rows:>12} {mismatches:>10} {in_flight:>9} "
            f"{getattr(view, 'seconds', ''):>6}"
        )
    return "\n".join(lines)
