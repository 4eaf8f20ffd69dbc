"""Backpressure: a deferrable sensor on consumer lag, and a guard on the source's binlog retention."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, BaseSensorOperator
from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.capture.resume import committed_position_on
from exactly_once_provider.connections import connect_kwargs
from exactly_once_provider.hooks.kafka_client import checked_kafka_config
from exactly_once_provider.hooks.mysql_binlog import MySqlBinlogHook
from exactly_once_provider.kafka.offsets import DEFAULT_OFFSETS_TOPIC, read_committed_offset
from exactly_once_provider.operators.failures import fail_task_on_pipeline_error
from exactly_once_provider.source.binlog import GtidNotInBinlogError, replica_server_id
from exactly_once_provider.source.retention import headroom
from exactly_once_provider.storage import is_s3
from exactly_once_provider.storage.s3 import S3Settings
from exactly_once_provider.triggers.consumer_lag import ConsumerLagTrigger, measure_lag, sink_locations


class ConsumerLagSensor(BaseSensorOperator):
    """
    Wait until a pipeline's reader is at most ``max_lag`` records behind its topics (backpressure).

    Put it before a step that adds data (the next capture increment, an extract) so a slow sink holds the
    producer back instead of letting Kafka and the binlog backlog grow. The reader's position comes from where
    it is committed: the sink (``sink`` + ``sink_location`` + ``sink_pipeline``: the Spark job's Delta marker,
    PostgreSQL offsets table or files manifest) or a ``consumer_group``. With ``deferrable=True`` (default)
    the wait runs in the triggerer (:class:`~exactly_once_provider.triggers.consumer_lag.ConsumerLagTrigger`)
    and holds no worker slot.

    :param topics: the topics the reader consumes.
    :param max_lag: the highest acceptable lag (records, transaction markers included).
    :param sink: ``delta``, ``postgres``, ``files`` or ``iceberg``; None with ``consumer_group``.
    :param sink_location: the sink's path (delta/files) or table (postgres); or a list of them when one reader
        commits each table's offsets in its own sink (one streaming query over several tables: the lag is the
        sum over the tables).
    :param sink_pipeline: the Spark job's pipeline name.
    :param consumer_group: a consumer group instead of a sink.
    :param kafka_config_id: the ``kafka`` connection.
    :param postgres_conn_id: the ``postgres`` connection (``postgres`` sink; ``iceberg``: its SQL catalog's database).
    :param aws_conn_id: the ``aws`` connection of a files or Delta sink on ``s3://`` (default ``aws_default``), or of
        an Iceberg table on ``s3://`` (name it: the table's location is the catalog's, not known here).
    :param iceberg_catalog: ``iceberg``: the SQL catalog's name (default ``eo``).
    :param missing_topics_ok: a topic the producer has not created yet has no lag (first run of a pipeline).
    :param deferrable: wait in the triggerer.
    """

    template_fields: Sequence[str] = ("topics", "max_lag", "sink_location", "sink_pipeline", "consumer_group")

    def __init__(
        self,
        *,
        topics: str | Sequence[str],
        max_lag: int | str,
        sink: str | None = None,
        sink_location: str | Sequence[str] | None = None,
        sink_pipeline: str | None = None,
        consumer_group: str | None = None,
        kafka_config_id: str = "kafka_default",
        postgres_conn_id: str = "postgres_default",
        missing_topics_ok: bool = False,
        deferrable: bool = True,
        aws_conn_id: str | None = None,
        iceberg_catalog: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 10)
        super().__init__(**kwargs)
        self.topics, self.max_lag, self.sink, self.sink_location = topics, max_lag, sink, sink_location
        self.sink_pipeline, self.consumer_group, self.kafka_config_id = sink_pipeline, consumer_group, kafka_config_id
        self.postgres_conn_id, self.deferrable, self.missing_topics_ok = postgres_conn_id, deferrable, missing_topics_ok
        self.aws_conn_id, self.iceberg_catalog = aws_conn_id, iceberg_catalog

    def _checked(self) -> tuple[list[str], int]:
        topics = [self.topics] if isinstance(self.topics, str) else list(self.topics)
        topics = [t.strip() for item in topics for t in item.split(",") if t.strip()]
        if not topics:
            raise ValueError("topics is empty: name the topics the reader consumes.")
        try:
            max_lag = int(self.max_lag)
        except (TypeError, ValueError):
            raise ValueError(f"max_lag={self.max_lag!r}: use a whole number of records >= 0.") from None
        if max_lag < 0:
            raise ValueError(f"max_lag={max_lag}: use a whole number of records >= 0.")
        if bool(self.consumer_group) == bool(self.sink):
            raise ValueError("Pass either sink (+ sink_location, sink_pipeline) or consumer_group, not both/neither.")
        if self.sink and not (self.sink_location and self.sink_pipeline):
            raise ValueError(f"sink={self.sink!r} needs sink_location and sink_pipeline.")
        return topics, max_lag

    def _measure(self, topics: list[str]):
        connect = s3 = None
        if self.sink in ("postgres", "iceberg"):  # iceberg: its SQL catalog's database
            connect = connect_kwargs(self.postgres_conn_id)
        if self.sink == "iceberg" and self.aws_conn_id:
            s3 = S3Settings.from_connection(self.aws_conn_id)
        elif self.sink in ("files", "delta") and any(is_s3(loc) for loc in sink_locations(self.sink_location)):
            s3 = S3Settings.from_connection(self.aws_conn_id or "aws_default")
        return measure_lag(
            checked_kafka_config(self.kafka_config_id),
            topics,
            self.sink,
            self.sink_location,
            self.sink_pipeline,
            self.consumer_group,
            connect,
            self.missing_topics_ok,
            s3,
            self.iceberg_catalog,
        )

    @fail_task_on_pipeline_error()
    def poke(self, context: Any) -> bool:
        topics, max_lag = self._checked()
        lag = self._measure(topics)
        self.log.info("consumer lag %d (limit %d): %s", lag.total, max_lag, lag.describe())
        return lag.total <= max_lag

    @fail_task_on_pipeline_error()
    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        topics, max_lag = self._checked()
        if self.poke(context):
            return None
        self.defer(
            trigger=ConsumerLagTrigger(
                self.kafka_config_id,
                topics,
                max_lag,
                self.sink,
                self.sink_location,
                self.sink_pipeline,
                self.consumer_group,
                self.postgres_conn_id,
                float(self.poke_interval),
                self.missing_topics_ok,
                self.aws_conn_id,
                self.iceberg_catalog,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    @fail_task_on_pipeline_error()
    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "ok":
            raise AirflowException(f"Consumer lag trigger failed: {event}")
        self.log.info("consumer lag %s after %ss: %s", event["lag"], event["waited_seconds"], event["detail"])
        return event


class BinlogRetentionGuardOperator(BaseOperator):
    """
    Warn before the capture falls behind what the source server still keeps; fail once it has.

    Compares the capture's committed binlog position (its offsets-ledger record) with ``SHOW BINARY LOGS``
    (:mod:`exactly_once_provider.source.retention`) of the server ``mysql_conn_id`` names: the server the capture
    reads. After a failover, before the capture has resumed there, the position is found on it by GTID (and a
    server lacking delivered transactions fails the task like the capture would; docs/failover.md). A purged position fails the task and asks for a ``full_reload``
    run; low headroom logs a warning (or fails with ``fail_on_warning``).

    :param capture_pipeline: the capture's pipeline name in the offsets ledger.
    :param capture_source_partition: its source partition (e.g. ``schema.table``).
    :param warn_files: warn when fewer retained files than this are older than the committed one.
    :param warn_bytes: warn when the capture is more binlog bytes than this behind the server's end.
    :param fail_on_warning: fail instead of warning.
    :param mysql_conn_id: the source ``mysql`` connection.
    :param kafka_config_id: the ``kafka`` connection.
    :param offsets_topic: the offsets ledger topic.
    """

    template_fields: Sequence[str] = ("capture_pipeline", "capture_source_partition")

    def __init__(
        self,
        *,
        capture_pipeline: str,
        capture_source_partition: str,
        warn_files: int = 1,
        warn_bytes: int = 1 << 30,
        fail_on_warning: bool = False,
        mysql_conn_id: str = "mysql_default",
        kafka_config_id: str = "kafka_default",
        offsets_topic: str = DEFAULT_OFFSETS_TOPIC,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.capture_pipeline, self.capture_source_partition = capture_pipeline, capture_source_partition
        self.warn_files, self.warn_bytes, self.fail_on_warning = warn_files, warn_bytes, fail_on_warning
        self.mysql_conn_id, self.kafka_config_id, self.offsets_topic = mysql_conn_id, kafka_config_id, offsets_topic

    @fail_task_on_pipeline_error()
    def execute(self, context: Any) -> dict[str, Any] | None:
        committed = read_committed_offset(
            checked_kafka_config(self.kafka_config_id),
            self.capture_pipeline,
            self.capture_source_partition,
            self.offsets_topic,
        )
        if committed is None:
            self.log.info(
                "Capture %s/%s has not committed yet: nothing to guard.",
                self.capture_pipeline,
                self.capture_source_partition,
            )
            return None
        hook = MySqlBinlogHook(mysql_conn_id=self.mysql_conn_id)
        # The server the connection names, which after a failover is not the one the ledger's position is on.
        try:
            position, how = committed_position_on(
                hook,
                committed.offset,
                replica_server_id(f"{self.capture_pipeline}/{self.capture_source_partition}/retention-guard"),
            )
        except GtidNotInBinlogError as err:
            raise AirflowException(
                f"{err}. The capture cannot resume on this server: its binlog no longer holds "
                "the capture's GTID position. Trigger the DAG with full_reload=true."
            ) from None
        self.log.info("Binlog retention of the capture's position: %s", how)
        found = headroom(position, hook.binary_log_sizes())
        if found.purged:
            raise AirflowException(
                f"The capture's committed binlog position {found.position} was purged (the server keeps "
                f"{found.oldest_file}..{found.newest_file}): the stream cannot resume. Trigger the DAG with "
                "full_reload=true for a new snapshot, and raise binlog_expire_logs_seconds."
            )
        warnings = found.warnings(self.warn_files, self.warn_bytes)
        for warning in warnings:
            self.log.warning("Binlog retention: %s", warning)
        if warnings and self.fail_on_warning:
            raise AirflowException("Binlog retention: " + "; ".join(warnings))
        self.log.info(
            "Binlog retention: committed %s, %d older file(s) retained, %d bytes behind the end (%s)",
            found.position,
            found.files_before_purge,
            found.bytes_behind,
            found.newest_file,
        )
        return found.to_json()
