"""Operator: consistent full load of a MySQL/MariaDB table into a Delta table, with handoff positions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from airflow.sdk import BaseHook

from exactly_once_provider import lineage
from exactly_once_provider import lineage_facets as facets
from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.full_load.job import FullLoadRequest
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.kafka.offsets import DEFAULT_OFFSETS_TOPIC
from exactly_once_provider.operators.spark_submit import PackagedSparkJobOperator
from exactly_once_provider.spark_jobs.packages import S3A_PACKAGES, SPARK_PACKAGES


class MySqlFullLoadOperator(facets.OpenLineageMixin, PackagedSparkJobOperator):
    """
    Load a table in chunks, each in its own consistent snapshot, and publish it as one Delta commit.

    Runs as a Spark application through the Spark connection (``local[*]``, client or cluster deploy mode); the
    MySQL connection reaches the driver in a file only its owner can read, never on a command line. The commit
    carries every chunk's binlog position (read them with
    :func:`exactly_once_provider.full_load.handoff.read_handoff`); XCom only mirrors them for display. A
    failed or killed run resumes at the unfinished chunks when retried.

    :param table: source table name.
    :param sink_path: the Delta table to publish into (replaced atomically): a local path or ``s3://bucket/prefix``
        (written through ``s3a``; checked before the job starts: reachable, credentials, bucket, conditional writes).
    :param schema: source database; defaults to the connection's schema.
    :param staging_path: staged chunks + manifest: a local (for a cluster: shared) directory or
        ``s3://bucket/prefix`` (the executors write the chunk objects themselves); default
        ``<sink_path>._eo_full_load``, next to the table on the same store.
    :param chunk_rows: target rows per chunk (one Spark partition).
    :param chunks_per_job: chunks per Spark job; progress is saved after each job.
    :param chunk_key: columns of a unique NOT NULL index, when the table's primary key is not wanted.
    :param fetch_rows: rows per Arrow batch read from the source.
    :param reader: ``native`` (MariaDB rows straight into Arrow, connectorx) or ``rows`` (through mysqlclient;
        slower, and what a MySQL source always uses). Both load the same values.
    :param full_reload: start a new snapshot even if a load is in progress or published.
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
        "sink_path",
        "schema",
        "staging_path",
        "chunk_key",
        "full_reload",
        "capture_pipeline",
        "capture_source_partition",
    )
    job_name = "full_load"
    job_module = "exactly_once_provider.full_load.__main__"

    def __init__(
        self,
        *,
        table: str,
        sink_path: str,
        schema: str | None = None,
        staging_path: str | None = None,
        chunk_rows: int = 100_000,
        chunks_per_job: int = 2,
        chunk_key: Sequence[str] | None = None,
        fetch_rows: int = 10_000,
        reader: str = "native",
        full_reload: bool | str = False,
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
        self.table, self.sink_path, self.schema, self.staging_path = table, sink_path, schema, staging_path
        self.chunk_rows, self.chunks_per_job, self.chunk_key = chunk_rows, chunks_per_job, chunk_key
        self.fetch_rows, self.reader, self.full_reload = fetch_rows, reader, full_reload
        self.expected_rows_per_second = expected_rows_per_second
        self.mysql_conn_id, self.spark_conf = mysql_conn_id, spark_conf or {}
        self.aws_conn_id, self._s3 = aws_conn_id, None
        self.capture_pipeline, self.capture_source_partition = capture_pipeline, capture_source_partition
        self.kafka_config_id, self.offsets_topic = kafka_config_id, offsets_topic

    def job_params(self, context: Any) -> dict[str, Any]:
        if not self.table or not self.sink_path:
            raise ValueError("table and sink_path must be non-empty.")
        if isinstance(self.full_reload, str):
            if self.full_reload.lower() not in ("true", "false"):
                raise ValueError(f"full_reload must be true or false, got {self.full_reload!r}.")
            self.full_reload = self.full_reload.lower() == "true"
        schema = self.schema or BaseHook.get_connection(self.mysql_conn_id).schema
        if not schema:
            raise ValueError(f"No schema given and connection {self.mysql_conn_id!r} has none; pass schema=.")
        request = FullLoadRequest(
            schema=schema,
            table=self.table,
            sink_path=self.sink_path,
            staging_path=self.staging_path,
            chunk_rows=self.chunk_rows,
            chunks_per_job=self.chunks_per_job,
            chunk_key=tuple(self.chunk_key) if self.chunk_key else None,
            fetch_rows=self.fetch_rows,
            reader=self.reader,
            full_reload=bool(self.full_reload),
            expected_rows_per_second=self.expected_rows_per_second,
            **self._version_base(),
        ).validate()
        return {**asdict(request), "mysql_conn_id": self.mysql_conn_id}

    def _version_base(self) -> dict[str, Any]:
        """Return the capture's version base on the server the connection names, and that server's id."""
        if not self.capture_pipeline:
            return {}
        if not self.capture_source_partition:
            raise ValueError("capture_pipeline needs capture_source_partition (the capture's ledger partition).")
        from exactly_once_provider.capture.resume import full_load_version_base
        from exactly_once_provider.connections import checked_kafka_config
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

            self._s3 = settings_for(self.aws_conn_id, self.sink_path, self._staging_location())
            if self._s3 is not None:
                register_settings(self._s3)
        return self._s3

    def _staging_location(self) -> str:
        return FullLoadRequest(
            schema="-", table=self.table, sink_path=self.sink_path, staging_path=self.staging_path
        ).staging_location

    def _table(self):
        """The Delta table's location, or on S3 the storage rooted at it (lineage reads its log)."""
        from exactly_once_provider.storage import open_storage

        return open_storage(self.sink_path, self._s3_settings()) if self._s3_settings() else self.sink_path

    def job_secrets(self) -> dict[str, Any]:
        conn = BaseHook.get_connection(self.mysql_conn_id)
        # The driver's MySqlSourceHook finds it under the same id, read as Airflow reads AIRFLOW_CONN_* JSON.
        secrets: dict[str, Any] = {"env": {f"AIRFLOW_CONN_{self.mysql_conn_id.upper()}": conn.as_json()}}
        if self._s3_settings() is not None:  # the driver's storage and s3a settings (never a command line)
            secrets["s3"] = self._s3_settings().to_json()
        return secrets

    def default_packages(self) -> tuple[str, ...]:
        return SPARK_PACKAGES + (S3A_PACKAGES if self._s3_settings() is not None else ())

    def before_submit(self) -> None:
        from exactly_once_provider.storage.preflight import preflight_locations

        # before anything is written: the staging area too (it may be another bucket when staging_path is given)
        for checked in preflight_locations([self.sink_path, self._staging_location()], self._s3_settings()):
            self.log.info("storage %s", checked)

    def job_result(self, result: Any, context: Any) -> dict:
        if result is None:  # this try reconnected to a driver that had finished or still ran: the sink knows
            self._s3_settings()
            h = read_handoff(self.sink_path)
            result = {
                "load_id": h.load_id,
                "schema": h.schema,
                "table": h.table,
                "rows": h.rows,
                "table_version": h.table_version,
                "min_position": str(h.min_position),
                "max_position": str(h.max_position),
                "already_published": True,
                "chunks_read": 0,
                "chunks_resumed": len(h.chunks),
                "seconds": 0.0,
                "chunks": [{"index": c.chunk.index, "rows": c.rows, "position": str(c.position)} for c in h.chunks],
            }
        self.log.info("%-6s %-12s %-24s", "chunk", "rows", "snapshot position")
        for entry in result["chunks"]:
            self.log.info("%-6d %-12d %-24s", entry["index"], entry["rows"], entry["position"])
        self.log.info(
            "published %s.%s: %d rows as Delta version %d (%s); read %d chunks, resumed %d, %.1fs",
            result["schema"],
            result["table"],
            result["rows"],
            result["table_version"],
            "already published" if result["already_published"] else "new commit",
            result["chunks_read"],
            result["chunks_resumed"],
            result["seconds"],
        )
        self.openlineage_result = {
            "load_id": result["load_id"],
            "rows": result["rows"],
            "table_version": result["table_version"],
            "sink_path": self.sink_path,
            "min_position": result["min_position"],
            "max_position": result["max_position"],
            "chunks": result["chunks"],
            "already_published": result["already_published"],
        }
        return self.openlineage_result

    def openlineage_datasets(self, result: dict | None) -> tuple[list, list]:
        """The source table in; the published Delta table out, with the snapshot positions it carries."""
        table = f"{self.schema}.{self.table}" if self.schema else self.table
        source = lineage.mysql_table_of(self.mysql_conn_id, table)

        def source_fields() -> list:
            with MySqlSourceHook(self.mysql_conn_id).cursor() as cur:
                return facets.mysql_fields(cur, source.name)

        sink = lineage.storage_path(self.sink_path)
        fields = self.lineage_fields(sink.name, lambda: facets.delta_fields(self._table()))
        if result is None:
            return [facets.input_dataset(source, self.lineage_fields(source.name, source_fields))], [
                facets.output_dataset(sink, fields)
            ]
        rows, size, files = 0, 0, 0  # a rerun of a published load writes nothing
        if not result["already_published"]:
            rows = result["rows"]
            size, files = facets.delta_commit_size(self._table(), result["table_version"] - 1, result["table_version"])
        commit = facets.CommitFacet(position=result["min_position"], sinkVersion=result["table_version"])
        return [facets.input_dataset(source, self.lineage_fields(source.name, source_fields))], [
            facets.output_dataset(sink, fields, rows=rows, size=size, files=files, commit=commit)
        ]
