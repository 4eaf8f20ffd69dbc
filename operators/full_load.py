"""Operator: consistent full load of MySQL/MariaDB tables into Delta tables, with handoff positions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from airflow.sdk import BaseHook

from exactly_once_provider import lineage
from exactly_once_provider import lineage_facets as facets
from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.full_load.job import FullLoadRequest, result_json
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.kafka.offsets import DEFAULT_OFFSETS_TOPIC
from exactly_once_provider.operators.failures import fail_task_on_pipeline_error
from exactly_once_provider.operators.spark_submit import PackagedSparkJobOperator
from exactly_once_provider.source.server import source_secrets
from exactly_once_provider.source.table_patterns import split_name
from exactly_once_provider.spark_jobs.packages import S3A_PACKAGES, SPARK_PACKAGES

TABLE = "{table}"  # in sink_path and staging_path of a load of several tables


class MySqlFullLoadOperator(facets.OpenLineageMixin, PackagedSparkJobOperator):
    """
    Load a table in chunks, each in its own consistent snapshot, and publish it as one Delta commit.

    Several tables (``tables=[...]``, locations with a ``{table}`` placeholder) load in ONE Spark application:
    the chunks of all of them are read together (small tables share a Spark job), and each table is published in
    its own commit, with its own positions, as soon as its chunks are staged. A table that already holds a full
    load is left as it is (``full_reload`` loads every table again, ``reload_tables`` the tables it names; once
    per DAG run: a retry of that run resumes the snapshots it started and does not read a table it published
    again).

    Runs as a Spark application through the Spark connection (``local[*]``, client or cluster deploy mode); the
    MySQL connection reaches the driver in a file only its owner can read, never on a command line. The commit
    carries every chunk's binlog position (read them with
    :func:`exactly_once_provider.full_load.handoff.read_handoff`); XCom only mirrors them for display. A
    failed or killed run resumes at the unfinished chunks when retried.

    :param table: source table name (or ``tables``).
    :param tables: several source tables of ``schema``, loaded in one application (``other.table`` for a table of
        another schema of the server; ``{table}`` in the locations is then ``other.table``).
    :param sink_path: the Delta table to publish into (replaced atomically): a local path or ``s3://bucket/prefix``
        (written through ``s3a``; checked before the job starts: reachable, credentials, bucket, conditional writes);
        with ``tables``, with a ``{table}`` placeholder.
    :param schema: source database; defaults to the connection's schema.
    :param staging_path: staged chunks + manifest: a local (for a cluster: shared) directory or
        ``s3://bucket/prefix`` (the executors write the chunk objects themselves); default
        ``<sink_path>._eo_full_load``, next to the table on the same store (with ``tables``: a ``{table}`` placeholder).
    :param chunk_rows: target rows per chunk (one Spark partition); default: sized from each table's row
        estimate and the application's cores (one wave of chunks up to 2.5M rows each, more waves beyond).
    :param chunks_per_job: chunks per Spark job (progress is saved after each); default: the cores.
    :param chunk_key: columns of a unique NOT NULL index, when the table's primary key is not wanted.
    :param fetch_rows: rows per Arrow batch read from the source.
    :param reader: ``native`` (MariaDB rows straight into Arrow, connectorx) or ``rows`` (through mysqlclient;
        slower, and what a MySQL source always uses). Both load the same values.
    :param full_reload: start a new snapshot even if a load is in progress or published.
    :param reload_tables: tables to load again in a new snapshot each, the others left as they are (a per-table
        re-snapshot: a list, or its JSON text as a template renders it, e.g. ``{{ params.resnapshot | tojson }}``).
    :param capture_pipeline: the pipeline of the binlog capture that continues from this load (its offsets-ledger
        name). Its ledger gives the version base the rows' versions take, so they compare with the capture's
        changes after a failover of the source (docs/failover.md). Without it the base is 0: a load taken after
        a failover is then refused by the capture's handoff check.
    :param capture_source_partition: the capture's source partition in the ledger.
    :param kafka_config_id: the ``kafka`` connection of the ledger.
    :param offsets_topic: the offsets ledger topic.
    :param expected_rows_per_second: planned speed for the binlog retention check.
    :param mysql_conn_id: the source connection (standard ``mysql`` type).
    :param aws_conn_id: the standard ``aws`` connection of a ``sink_path`` or ``staging_path`` on S3 (credentials,
        ``endpoint_url`` in its extra); they reach the driver in the same owner-only file as the MySQL connection,
        and the executors inside the pickled task, never on a command line.
    :param spark_conn_id: a ``spark`` connection whose host is the master (``local[2]``, ``spark://h``); its
        Extra ``deploy-mode: cluster`` runs the driver on a worker (see
        :class:`~exactly_once_provider.operators.spark_submit.PackagedSparkJobOperator` for the other Spark
        arguments: ``packages``, ``jars``, ``deploy_mode``, ``driver_memory``, ``env_vars``).
    :param spark_conf: extra Spark settings, e.g. ``{"spark.jars": ...}`` for the Delta connector.
    """

    template_fields: Sequence[str] = (
        "table",
        "tables",
        "sink_path",
        "schema",
        "staging_path",
        "chunk_key",
        "full_reload",
        "reload_tables",
        "capture_pipeline",
        "capture_source_partition",
    )
    job_name = "full_load"
    job_module = "exactly_once_provider.full_load.__main__"

    def __init__(
        self,
        *,
        table: str | None = None,
        tables: Sequence[str] | None = None,
        sink_path: str,
        schema: str | None = None,
        staging_path: str | None = None,
        chunk_rows: int | None = None,
        chunks_per_job: int | None = None,
        chunk_key: Sequence[str] | None = None,
        fetch_rows: int = 10_000,
        reader: str = "native",
        full_reload: bool | str = False,
        reload_tables: Sequence[str] | str | None = None,
        expected_rows_per_second: float = 20_000,
        mysql_conn_id: str = MySqlSourceHook.default_conn_name,
        spark_conn_id: str = "spark_default",
        spark_conf: dict[str, str] | None = None,
        aws_conn_id: str = "aws_default",
        capture_pipeline: str | None = None,
        capture_source_partition: str | None = None,
        kafka_config_id: str = "kafka_default",
        offsets_topic: str = DEFAULT_OFFSETS_TOPIC,
        **kwargs: Any,
    ) -> None:
        super().__init__(spark_conn_id=spark_conn_id, conf=spark_conf, **kwargs)
        self.table, self.tables, self.sink_path = table, tables, sink_path
        self.schema, self.staging_path = schema, staging_path
        self.chunk_rows, self.chunks_per_job, self.chunk_key = chunk_rows, chunks_per_job, chunk_key
        self.fetch_rows, self.reader, self.full_reload = fetch_rows, reader, full_reload
        self.reload_tables = reload_tables
        self.expected_rows_per_second = expected_rows_per_second
        self.mysql_conn_id, self.spark_conf = mysql_conn_id, spark_conf or {}
        self.aws_conn_id, self._s3 = aws_conn_id, None
        self.capture_pipeline, self.capture_source_partition = capture_pipeline, capture_source_partition
        self.kafka_config_id, self.offsets_topic = kafka_config_id, offsets_topic

    def _names(self) -> list[str]:
        """Return the tables to load; raise ValueError when ``table``/``tables`` and the locations disagree."""
        if (self.table is None) == (self.tables is None) or isinstance(self.tables, str):
            raise ValueError("Name the source table with table='orders', or several with tables=['orders', ...].")
        if self.tables is None:
            return [self.table]
        names = list(self.tables)
        if not names or len(set(names)) != len(names) or not all(names):
            raise ValueError(f"tables={names!r} must name at least one table, each once.")
        for name, value in (("sink_path", self.sink_path), ("staging_path", self.staging_path)):
            if value is not None and TABLE not in value:
                raise ValueError(f"tables={names!r}: {name} must name each table's location with {TABLE}.")
        return names

    def _reload(self) -> set[str]:
        """Return the tables ``reload_tables`` names; raise ValueError for a name the load does not have."""
        value = self.reload_tables
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else []
            except ValueError:
                raise ValueError(
                    f"reload_tables must be a list of table names or its JSON text, got {value!r}."
                ) from None
        if value is None:
            return set()
        if not isinstance(value, (list, tuple, set)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"reload_tables must be a list of table names, got {value!r}.")
        unknown = sorted(set(value) - set(self._names()))
        if unknown:
            raise ValueError(f"reload_tables names {unknown}, which this load does not have: {self._names()}.")
        return set(value)

    def _location(self, value: str | None, name: str) -> str | None:
        return value.replace(TABLE, name) if value is not None and self.tables is not None else value

    def job_params(self, context: Any) -> dict[str, Any]:
        names = self._names()
        if not all(names) or not self.sink_path:
            raise ValueError("table and sink_path must be non-empty.")
        if isinstance(self.full_reload, str):
            if self.full_reload.lower() not in ("true", "false"):
                raise ValueError(f"full_reload must be true or false, got {self.full_reload!r}.")
            self.full_reload = self.full_reload.lower() == "true"
        schema = self.schema or BaseHook.get_connection(self.mysql_conn_id).schema
        if not schema:
            raise ValueError(f"No schema given and connection {self.mysql_conn_id!r} has none; pass schema=.")
        self.schema = schema
        reload = self._reload()
        base = self._version_base()
        requests = [
            FullLoadRequest(
                schema=split_name(name, schema)[0],
                table=split_name(name, schema)[1],
                sink_path=self._location(self.sink_path, name),
                staging_path=self._location(self.staging_path, name),
                chunk_rows=self.chunk_rows,
                chunks_per_job=self.chunks_per_job,
                chunk_key=tuple(self.chunk_key) if self.chunk_key else None,
                fetch_rows=self.fetch_rows,
                reader=self.reader,
                full_reload=bool(self.full_reload) or name in reload,
                expected_rows_per_second=self.expected_rows_per_second,
                skip_loaded=self.tables is not None,
                run_id=_run_identity(context),
                **base,
            ).validate()
            for name in names
        ]
        if self.tables is None:
            return {**asdict(requests[0]), "mysql_conn_id": self.mysql_conn_id}
        self.log.info("loading %d tables of %s in one application: %s", len(names), schema, ", ".join(names))
        return {"requests": [asdict(r) for r in requests], "mysql_conn_id": self.mysql_conn_id}

    @fail_task_on_pipeline_error()
    def execute(self, context: Any) -> Any:
        """Load the tables; with ``tables``, start no Spark application when every one is left as it is."""
        if self.tables is not None and str(self.full_reload).lower() != "true" and not self._reload():
            from exactly_once_provider.full_load.job import left_as_is

            names, run_id = self._names(), _run_identity(context)
            self._s3_settings()  # the tables' logs and staging manifests are read through them
            requests = [
                FullLoadRequest(
                    schema=split_name(n, self.schema or "-")[0],
                    table=split_name(n, self.schema or "-")[1],
                    sink_path=self._location(self.sink_path, n),
                    staging_path=self._location(self.staging_path, n),
                    skip_loaded=True,
                    run_id=run_id,
                )
                for n in names
            ]
            if all(left_as_is(r, r.staging().load()) for r in requests):
                self.log.info("every table of %s holds a full load already: nothing to load", ", ".join(names))
                self.openlineage_result = {"tables": {}, "skipped": names}
                return self.openlineage_result
        return super().execute(context)

    def _version_base(self) -> dict[str, Any]:
        """Return the capture's version base on the server the connection names, and that server's id."""
        if not self.capture_pipeline:
            return {}
        if not self.capture_source_partition:
            raise ValueError("capture_pipeline needs capture_source_partition (the capture's ledger partition).")
        from exactly_once_provider.capture.resume import full_load_version_base
        from exactly_once_provider.hooks.kafka_client import checked_kafka_config
        from exactly_once_provider.hooks.mysql_binlog import MySqlBinlogHook
        from exactly_once_provider.kafka.offsets import read_committed_offset

        try:
            committed = read_committed_offset(
                checked_kafka_config(self.kafka_config_id),
                self.capture_pipeline,
                self.capture_source_partition,
                self.offsets_topic,
            )
        except ValueError as err:
            if "does not exist" not in str(err):
                raise
            committed = None  # no capture ever committed into this ledger (it creates the topic): base 0
        base, server_id = full_load_version_base(MySqlBinlogHook(mysql_conn_id=self.mysql_conn_id), committed)
        self.log.info(
            "Rows take version base %d (capture %s/%s on server_id %d)",
            base,
            self.capture_pipeline,
            self.capture_source_partition,
            server_id,
        )
        return {"version_base": base, "server_id": server_id}

    def _s3_settings(self):
        """Return the S3 settings of ``aws_conn_id`` for a sink or staging area on S3 (read once per run), else None.

        Registered for this task's process too: the handoff and the table's log are read here through them.
        """
        if self._s3 is None:
            from exactly_once_provider.storage.s3 import register_settings, settings_for

            self._s3 = settings_for(self.aws_conn_id, *self._locations())
            if self._s3 is not None:
                register_settings(self._s3)
        return self._s3

    def _staging_location(self, name: str) -> str:
        return FullLoadRequest(
            schema="-",
            table=name,
            sink_path=self._location(self.sink_path, name),
            staging_path=self._location(self.staging_path, name),
        ).staging_location

    def _locations(self) -> list[str]:
        """Every table's sink and staging location."""
        return [p for n in self._names() for p in (self._location(self.sink_path, n), self._staging_location(n))]

    def _table(self, name: str):
        """A Delta table's location, or on S3 the storage rooted at it (lineage reads its log)."""
        from exactly_once_provider.storage import open_storage

        path = self._location(self.sink_path, name)
        return open_storage(path, self._s3_settings()) if self._s3_settings() else path

    def job_secrets(self) -> dict[str, Any]:
        # Resolved here, through the hook; the driver rebuilds the source from the secrets file (source_from_secrets).
        secrets: dict[str, Any] = source_secrets(MySqlSourceHook(mysql_conn_id=self.mysql_conn_id))
        if self._s3_settings() is not None:  # the driver's storage and s3a settings (never a command line)
            secrets["s3"] = self._s3_settings().to_json()
        return secrets

    def default_packages(self) -> tuple[str, ...]:
        return SPARK_PACKAGES + (S3A_PACKAGES if self._s3_settings() is not None else ())

    def before_submit(self) -> None:
        from exactly_once_provider.storage.preflight import preflight_locations

        # before anything is written: the staging area too (it may be another bucket when staging_path is given)
        for checked in preflight_locations(self._locations(), self._s3_settings()):
            self.log.info("storage %s", checked)

    def job_result(self, result: Any, context: Any) -> dict:
        names = self._names()
        if result is None:  # this try reconnected to a driver that had finished or still ran: the sinks know
            self._s3_settings()
            loads = [result_json(read_handoff(self._location(self.sink_path, n)), True) for n in names]
        else:
            loads = result["loads"] if self.tables is not None else [result]
        for name, load in zip(names, loads):
            if load is None:
                self.log.info("%s.%s holds a full load already: left as it is", self.schema, name)
                continue
            self.log.info("%-6s %-12s %-24s", "chunk", "rows", "snapshot position")
            for entry in load["chunks"]:
                self.log.info("%-6d %-12d %-24s", entry["index"], entry["rows"], entry["position"])
            self.log.info(
                "published %s.%s: %d rows as Delta version %d (%s); read %d chunks, resumed %d, %.1fs",
                load["schema"],
                load["table"],
                load["rows"],
                load["table_version"],
                "already published" if load["already_published"] else "new commit",
                load["chunks_read"],
                load["chunks_resumed"],
                load["seconds"],
            )
        mirrored = {
            name: {
                "load_id": load["load_id"],
                "rows": load["rows"],
                "table_version": load["table_version"],
                "sink_path": self._location(self.sink_path, name),
                "min_position": load["min_position"],
                "max_position": load["max_position"],
                "chunks": load["chunks"],
                "already_published": load["already_published"],
            }
            for name, load in zip(names, loads)
            if load is not None
        }
        if self.tables is None:
            self.openlineage_result = mirrored[self.table]
        else:  # the tables loaded (or published) by this run; the others were loaded before it
            self.openlineage_result = {"tables": mirrored, "skipped": [n for n in names if n not in mirrored]}
        return self.openlineage_result

    def openlineage_datasets(self, result: dict | None) -> tuple[list, list]:
        """The source tables in; the published Delta tables out, with the snapshot positions they carry."""
        names = self._names()
        loaded = (result or {}).get("tables", {}) if self.tables is not None else {self.table: result}
        inputs, outputs = [], []
        for name in names:
            one = loaded.get(name)
            if result is not None and one is None:
                continue  # left as it was: this run read and wrote nothing of it
            source_input, sink_output = self._lineage_of(name, one if result is not None else None)
            inputs.append(source_input)
            outputs.append(sink_output)
        return inputs, outputs

    def _lineage_of(self, name: str, result: dict | None) -> tuple:
        table = f"{self.schema}.{name}" if self.schema else name
        source = lineage.mysql_table_of(self.mysql_conn_id, table)

        def source_fields() -> list:
            with MySqlSourceHook(self.mysql_conn_id).cursor() as cur:
                return facets.mysql_fields(cur, source.name)

        sink = lineage.storage_path(self._location(self.sink_path, name))
        fields = self.lineage_fields(sink.name, lambda: facets.delta_fields(self._table(name)))
        source_input = facets.input_dataset(source, self.lineage_fields(source.name, source_fields))
        if result is None:
            return source_input, facets.output_dataset(sink, fields)
        rows, size, files = 0, 0, 0  # a rerun of a published load writes nothing
        if not result["already_published"]:
            rows = result["rows"]
            size, files = facets.delta_commit_size(
                self._table(name), result["table_version"] - 1, result["table_version"]
            )
        commit = facets.CommitFacet(position=result["min_position"], sinkVersion=result["table_version"])
        return source_input, facets.output_dataset(sink, fields, rows=rows, size=size, files=files, commit=commit)


def _run_identity(context: Any) -> str | None:
    """Return ``<dag_id>/<run_id>`` of the DAG run executing the task (None outside one)."""
    try:
        return f"{context['ti'].dag_id}/{context['run_id']}"
    except (KeyError, TypeError, AttributeError):
        return None
