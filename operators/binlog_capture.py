"""Operator: capture MySQL/MariaDB binlog changes into Kafka exactly once, continuing from the full load."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator

from exactly_once_provider import lineage
from exactly_once_provider import lineage_facets as facets
from exactly_once_provider.capture.change_record import DEFAULT_TOPIC_TEMPLATE, topic_for
from exactly_once_provider.capture.loop import MODES, CaptureRequest, run_capture
from exactly_once_provider.connections import check_kafka_access, explain_kafka_denials
from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook
from exactly_once_provider.hooks.mysql_binlog import MySqlBinlogHook
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.kafka.offsets import DEFAULT_OFFSETS_TOPIC, validate_name
from exactly_once_provider.kafka.topics import ensure_topics
from exactly_once_provider.kafka.writer import TransactionPolicy
from exactly_once_provider.operators.failures import fail_task_on_pipeline_error
from exactly_once_provider.plugins.links import PipelineStatusLink
from exactly_once_provider.positions import parse_position
from exactly_once_provider.source.binlog import replica_server_id
from exactly_once_provider.storage.s3 import register_settings, settings_for


class BinlogCaptureOperator(facets.OpenLineageMixin, BaseOperator):
    """
    Capture the binlog changes of tables into one Kafka topic per table, exactly once.

    Each Kafka transaction holds the change records of whole source transactions plus the ledger record of the
    binlog position after the last of them (:mod:`exactly_once_provider.capture.loop`). Every run resumes from that
    ledger record; the first run starts at the smallest snapshot position of the tables' full loads and drops
    the changes their snapshots already hold. The record format is in :mod:`exactly_once_provider.capture.change_record`.

    ``mode="bounded"`` captures up to the binlog end seen at the start, commits and returns (for scheduled
    increments); ``mode="continuous"`` runs until ``max_runtime`` seconds or a stop (task kill / ``on_kill``),
    committing every ``commit_interval_ms``. XCom mirrors the committed position and counts for display.

    After a failover of the source, switch the host of ``mysql_conn_id`` to the new primary: the run checks that
    the server holds every transaction already delivered and resumes there by GTID (MariaDB;
    :mod:`exactly_once_provider.capture.resume`, docs/failover.md).

    :param tables: ``table`` or ``schema.table`` names (schema defaults to the connection's).
    :param pipeline: the pipeline name (transactional id, ledger key, default topic prefix).
    :param full_load_paths: ``{table: Delta path}`` of the tables' full loads (their handoff positions); a path may
        be ``s3://bucket/prefix`` (read with ``aws_conn_id``).
    :param start_position: ``"FILE:POS"`` where a first run starts for tables without a full load.
    :param mode: ``"bounded"`` or ``"continuous"``.
    :param max_runtime: continuous mode: seconds to run before committing and finishing.
    :param topic_template: topic per table; placeholders ``{pipeline}``, ``{schema}``, ``{table}``.
    :param create_topics: create missing topics with ``topic_partitions`` partitions.
    :param topic_partitions: partitions of created topics (records are keyed by primary key).
    :param source_partition: ledger/transactional-id partition name; one capture per source server.
    :param max_records: commit a Kafka transaction once it holds this many records (at a source commit).
    :param commit_interval_ms: commit at least this often (at a source commit).
    :param server_id: the replica server id the reader registers with; default derived from the pipeline.
    :param progress_interval: seconds between progress lines in the task log.
    :param mysql_conn_id: the source ``mysql`` connection (REPLICATION SLAVE, BINLOG MONITOR).
    :param kafka_config_id: the ``kafka`` connection.
    :param offsets_topic: the compacted offsets ledger topic.
    :param producer_config: extra producer settings (``linger.ms``, ``compression.type``...).
    :param aws_conn_id: the standard ``aws`` connection of full loads on S3 (credentials, ``endpoint_url``).
    :param on_drop: a ``DROP TABLE`` or rename of a captured table: ``fail`` (stop before it and ask for a reload)
        or ``stop`` (stop following that table there and go on with the others; a table whose tables come and go,
        e.g. matched by a pattern). See :class:`~exactly_once_provider.capture.loop.CaptureRequest`.
    """

    template_fields: Sequence[str] = (
        "tables",
        "pipeline",
        "full_load_paths",
        "start_position",
        "mode",
        "max_runtime",
        "topic_template",
        "source_partition",
        "mysql_conn_id",
        "kafka_config_id",
        "offsets_topic",
    )
    ui_color = "#e8f0f4"
    operator_extra_links = (PipelineStatusLink(),)

    def __init__(
        self,
        *,
        tables: Sequence[str] | str,
        pipeline: str,
        full_load_paths: Mapping[str, str] | None = None,
        start_position: str | None = None,
        mode: str = "bounded",
        max_runtime: float | str | None = None,
        topic_template: str = DEFAULT_TOPIC_TEMPLATE,
        create_topics: bool = True,
        topic_partitions: int = 1,
        source_partition: str = "binlog",
        max_records: int = 10_000,
        commit_interval_ms: int = 1_000,
        server_id: int | None = None,
        progress_interval: float = 10.0,
        mysql_conn_id: str = MySqlBinlogHook.default_conn_name,
        kafka_config_id: str = "kafka_default",
        offsets_topic: str = DEFAULT_OFFSETS_TOPIC,
        producer_config: dict[str, Any] | None = None,
        aws_conn_id: str = "aws_default",
        on_drop: str = "fail",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.on_drop = on_drop
        self.tables = tables
        self.pipeline = pipeline
        self.full_load_paths = full_load_paths
        self.start_position = start_position
        self.mode = mode
        self.max_runtime = max_runtime
        self.topic_template = topic_template
        self.create_topics = create_topics
        self.topic_partitions = topic_partitions
        self.source_partition = source_partition
        self.max_records = max_records
        self.commit_interval_ms = commit_interval_ms
        self.server_id = server_id
        self.progress_interval = progress_interval
        self.mysql_conn_id = mysql_conn_id
        self.kafka_config_id = kafka_config_id
        self.offsets_topic = offsets_topic
        self.producer_config = producer_config
        self.aws_conn_id = aws_conn_id
        self._stop = threading.Event()

    # The capture loop and the source and Kafka code under it run without Airflow: the task fails with their
    # message (a statement the stream cannot follow, a fenced writer, a lost stream, a diverged source).
    @fail_task_on_pipeline_error()
    def execute(self, context: Any) -> dict[str, Any]:
        return self._capture()

    def _capture(self) -> dict[str, Any]:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: use 'bounded' or 'continuous'.")
        if self.on_drop not in ("fail", "stop"):
            raise ValueError(f"on_drop={self.on_drop!r}: use 'fail' or 'stop'.")
        max_runtime = float(self.max_runtime) if self.max_runtime not in (None, "", "None") else None
        if max_runtime is not None and max_runtime <= 0:
            raise ValueError(f"max_runtime={self.max_runtime!r}: use a positive number of seconds.")
        validate_name("pipeline", self.pipeline)
        policy = TransactionPolicy(self.max_records, self.commit_interval_ms).validate()
        hook = MySqlBinlogHook(mysql_conn_id=self.mysql_conn_id)
        default_schema = hook.get_connection(self.mysql_conn_id).schema or ""
        names = self._table_names(default_schema)
        paths = {self._qualify(t, default_schema): p for t, p in (self.full_load_paths or {}).items()}
        unknown = sorted(f"{s}.{t}" for s, t in paths if (s, t) not in names)
        if unknown:
            raise ValueError(f"full_load_paths names {unknown}, which are not in tables {self.tables!r}.")
        s3 = settings_for(self.aws_conn_id, *paths.values())
        if s3 is not None:  # the handoffs (Delta logs, staging manifests) on S3 are read through them
            register_settings(s3)
        handoffs = {}
        for name, path in paths.items():
            handoff = read_handoff(path)
            if (handoff.schema, handoff.table) != name:
                raise ValueError(
                    f"The full load at {path} is of {handoff.schema}.{handoff.table}, not "
                    f"{name[0]}.{name[1]}: check full_load_paths."
                )
            handoffs[name] = handoff
        keys = {n: handoffs[n].key if n in handoffs else hook.table_key(*n) for n in names}
        topics = {n: topic_for(self.topic_template, self.pipeline, *n) for n in names}
        request = CaptureRequest(
            tables=keys,
            topics=topics,
            handoffs=handoffs,
            start_position=parse_position(self.start_position) if self.start_position else None,
            mode=self.mode,
            max_runtime=max_runtime,
            policy=policy,
            server_id=self.server_id or replica_server_id(f"{self.pipeline}/{self.source_partition}"),
            progress_interval=self.progress_interval,
            chunk_locators=hook.chunk_locators(handoffs),
            on_drop=self.on_drop,
        )
        producer = TransactionalProducerHook(
            self.kafka_config_id,
            pipeline=self.pipeline,
            source_partition=self.source_partition,
            delivery_mode="exactly_once",
            offsets_topic=self.offsets_topic,
            producer_config=self.producer_config,
        )
        if self.create_topics:
            config = producer.client_config()
            admin = check_kafka_access(config, self.kafka_config_id)  # a refused login: said now, not after 30 s
            names = sorted(set(topics.values()))
            with explain_kafka_denials(self.kafka_config_id, config, f"Create and Describe on topics {names!r}"):
                ensure_topics(admin, names, self.topic_partitions)
        writer = producer.open_writer(track_partition_offsets=False)  # the ledger record is the progress shown
        try:
            result = run_capture(hook, writer, request, should_stop=self._stop.is_set, progress_log=self.log)
        finally:
            writer.close()
            for locator in request.chunk_locators.values():
                locator.close()
        stats = result.stats
        self.log.info("%-34s %s", "committed position", result.position)
        self.log.info("%-34s %s", "resumed from", f"{result.resumed_from}{' (first run)' if result.first_run else ''}")
        for label, value in (
            ("source transactions", stats.transactions),
            ("rows produced", stats.rows),
            ("rows dropped (already in full load)", stats.dropped_by_handoff),
            ("Kafka transactions", stats.kafka_transactions),
        ):
            self.log.info("%-34s %d", label, value)
        self.log.info(
            "%-34s %.1f s (%.0f rows/s)",
            "duration",
            stats.seconds,
            stats.rows / stats.seconds if stats.seconds else 0.0,
        )
        self.openlineage_result = {
            "pipeline": self.pipeline,
            "source_partition": self.source_partition,
            "mode": self.mode,
            "committed_position": str(result.position),
            "gtid": result.gtid,
            "resumed_from": str(result.resumed_from),
            "first_run": result.first_run,
            "transactions": stats.transactions,
            "rows": stats.rows,
            "dropped_by_handoff": stats.dropped_by_handoff,
            "kafka_transactions": stats.kafka_transactions,
            "schema_changes": stats.schema_changes,
            "topics": {f"{s}.{t}": topic for (s, t), topic in topics.items()},
            "seconds": round(stats.seconds, 3),
        }
        return self.openlineage_result

    def openlineage_datasets(self, result: dict | None) -> tuple[list, list]:
        """The captured tables in; their change topics out, with the binlog position committed with them.

        Rows per topic are known when one table is captured (the run counts rows, not rows per table).
        """
        default = MySqlBinlogHook(mysql_conn_id=self.mysql_conn_id).get_connection(self.mysql_conn_id).schema or ""
        inputs, outputs = [], []
        for schema, table in self._table_names(default):
            source = lineage.mysql_table_of(self.mysql_conn_id, f"{schema}.{table}")

            def read(schema: str = schema, table: str = table) -> list:
                with MySqlSourceHook(self.mysql_conn_id).cursor() as cur:
                    return facets.mysql_fields(cur, f"{schema}.{table}")

            columns = self.lineage_fields(source.name, read)
            inputs.append(facets.input_dataset(source, columns))
            topic = lineage.kafka_topic_of(
                self.kafka_config_id, topic_for(self.topic_template, self.pipeline, schema, table)
            )
            fields = facets.record_fields(facets.CHANGE_RECORD_FIELDS, "before,after", columns) if columns else None
            if result is None:
                outputs.append(facets.output_dataset(topic, fields))
                continue
            commit = facets.CommitFacet(
                pipeline=self.pipeline, position=result["committed_position"], gtid=result["gtid"]
            )
            rows = result["rows"] if len(result["topics"]) == 1 else None
            outputs.append(facets.output_dataset(topic, fields, rows=rows, commit=commit))
        return inputs, outputs

    def on_kill(self) -> None:
        """Stop at the next transaction boundary; what was read is committed first."""
        self._stop.set()

    def _table_names(self, default: str) -> list[tuple[str, str]]:
        tables = [self.tables] if isinstance(self.tables, str) else list(self.tables or [])
        if not tables:
            raise ValueError("tables is empty: name at least one table to capture.")
        names = [self._qualify(t, default) for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"tables lists a table twice: {tables!r}.")
        return names

    @staticmethod
    def _qualify(name: str, default: str) -> tuple[str, str]:
        schema, _, table = str(name).rpartition(".")
        schema = schema or default
        if not schema or not table:
            raise ValueError(f"Table {name!r}: use 'schema.table', or set the connection's schema.")
        return schema, table
