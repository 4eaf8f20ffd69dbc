"""Operator: extract one watermark window of a MySQL/MariaDB table and publish it to Kafka as one batch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import BaseOperator

from exactly_once_provider import lineage
from exactly_once_provider import lineage_facets as facets
from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.kafka.offsets import DEFAULT_OFFSETS_TOPIC
from exactly_once_provider.kafka.windows import (
    BATCH_HEADER,
    WatermarkState,
    WindowRecord,
    batch_header,
    locate_batch,
    published_now,
)
from exactly_once_provider.kafka.writer import Message
from exactly_once_provider.operators.failures import fail_task_on_pipeline_error
from exactly_once_provider.plugins.links import PipelineStatusLink
from exactly_once_provider.source.watermark import (
    checksum,
    format_cursor,
    parse_cursor,
    preflight,
    read_window,
    row_message,
)


class WatermarkExtractOperator(facets.OpenLineageMixin, BaseOperator):
    """
    Publish the next safe window ``[lower, upper)`` of a table to Kafka as ONE transaction framed as a batch.

    ``lower`` is the last committed upper bound, read from the offsets ledger; ``upper`` is the minimum of
    the data interval end, the database clock minus ``safety_lag`` and the start of the oldest open
    transaction (see :mod:`exactly_once_provider.source.watermark`). The same transaction writes the
    window (bounds, row count, checksum, batch id/version) into the ledger (:mod:`exactly_once_provider.kafka.windows`).

    A rerun of a batch already committed publishes nothing and returns the recorded window and its Kafka
    offsets. ``reextract=True`` re-reads the recorded bounds and publishes them as the next version of the
    batch, which downstream uses instead of the older one; the next lower bound does not move.

    :param table: ``table`` or ``schema.table``.
    :param cursor_column: the cursor column.
    :param cursor_kind: ``"timestamp"`` (TIMESTAMP/DATETIME) or ``"id"`` (monotonically assigned integer).
    :param topic: the data topic.
    :param pipeline: the pipeline name (with ``source_partition`` it names the transactional id and ledger key).
    :param source_partition: default: the ``table`` argument (which must then be a valid name).
    :param batch_id: the window's batch identity; default: the data interval end (ISO-8601, UTC).
    :param interval_end: the end of the settlement interval (aware datetime or ISO-8601); default: the data
        interval end of the run, if any. Ignored for id cursors.
    :param reextract: re-read the recorded bounds of ``batch_id`` and publish them as a new version.
    :param safety_lag: seconds the window stays behind the database clock.
    :param deleted_column: a soft-delete flag column; rows with a true flag are published as deletes.
    :param datetime_time_zone: the zone DATETIME cursor values are written in (default: the server's zone).
    :param open_transaction_timeout: seconds to wait for older open transactions to end (id cursors, and a
        closed ``interval_end``: its rows are never moved to the next interval).
    :param max_recorded_windows: how many windows the ledger remembers for reruns.
    :param mysql_conn_id: the source ``mysql`` connection.
    :param kafka_config_id: the ``kafka`` connection.
    :param offsets_topic: the compacted offsets ledger topic.
    :param producer_config: extra producer settings.
    """

    template_fields: Sequence[str] = (
        "table",
        "topic",
        "pipeline",
        "source_partition",
        "batch_id",
        "interval_end",
        "reextract",
        "safety_lag",
        "mysql_conn_id",
        "kafka_config_id",
        "offsets_topic",
    )
    ui_color = "#f4eee8"
    operator_extra_links = (PipelineStatusLink(),)

    def __init__(
        self,
        *,
        table: str,
        cursor_column: str,
        cursor_kind: str,
        topic: str,
        pipeline: str,
        source_partition: str | None = None,
        batch_id: str | None = None,
        interval_end: datetime | str | None = None,
        reextract: bool | str = False,
        safety_lag: float | str = 5.0,
        deleted_column: str | None = None,
        datetime_time_zone: str | None = None,
        open_transaction_timeout: float = 300,
        max_recorded_windows: int = 500,
        mysql_conn_id: str = "mysql_default",
        kafka_config_id: str = "kafka_default",
        offsets_topic: str = DEFAULT_OFFSETS_TOPIC,
        producer_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.cursor_column = cursor_column
        self.cursor_kind = cursor_kind
        self.topic = topic
        self.pipeline = pipeline
        self.source_partition = source_partition
        self.batch_id = batch_id
        self.interval_end = interval_end
        self.reextract = reextract
        self.safety_lag = safety_lag
        self.deleted_column = deleted_column
        self.datetime_time_zone = datetime_time_zone
        self.open_transaction_timeout = open_transaction_timeout
        self.max_recorded_windows = max_recorded_windows
        self.mysql_conn_id = mysql_conn_id
        self.kafka_config_id = kafka_config_id
        self.offsets_topic = offsets_topic
        self.producer_config = producer_config

    @fail_task_on_pipeline_error()
    def execute(self, context: Any) -> dict[str, Any]:
        reextract = _as_bool("reextract", self.reextract)
        safety_lag = float(self.safety_lag)
        if safety_lag < 0:
            raise ValueError(f"safety_lag={self.safety_lag!r}: use a number of seconds >= 0.")
        interval_end = _as_utc("interval_end", self.interval_end or context.get("data_interval_end"))
        batch_id = self.batch_id or (interval_end.isoformat() if interval_end else None)
        if not batch_id:
            raise ValueError(
                "Name the window: pass batch_id, or run with a data interval "
                "(CronDataIntervalTimetable) so the interval end names it."
            )
        source_partition = self.source_partition or self.table
        conn = MySqlSourceHook(self.mysql_conn_id).get_conn()
        try:
            spec = preflight(
                conn, self.table, self.cursor_column, self.cursor_kind, self.deleted_column, self.datetime_time_zone
            )
            for warning in spec.warnings:
                self.log.warning("Preflight: %s", warning)
            hook = TransactionalProducerHook(
                self.kafka_config_id,
                pipeline=self.pipeline,
                source_partition=source_partition,
                delivery_mode="exactly_once",
                offsets_topic=self.offsets_topic,
                producer_config=self.producer_config,
                batch_markers=True,
            )
            writer = hook.open_writer()
            try:
                state = WatermarkState.from_ledger(writer.last_committed, self.cursor_kind)
                recorded = state.history.get(batch_id)
                if recorded is not None and not reextract:
                    self.log.info(
                        "Window %s version %d is already committed: [%s, %s), %d rows, %s. Publishing "
                        "nothing; set reextract to publish it again.",
                        batch_id,
                        recorded.batch_version,
                        recorded.lower,
                        recorded.upper,
                        recorded.rows,
                        recorded.checksum,
                    )
                    return self._result(hook, source_partition, recorded, skipped=True)
                if recorded is None and reextract:
                    raise ValueError(
                        f"reextract is set but window {batch_id!r} was never committed (or is older "
                        f"than the {self.max_recorded_windows} windows the ledger keeps)."
                    )
                if recorded is None:
                    self._refuse_unrecorded_past_interval(state, batch_id, interval_end)
                    lower = parse_cursor(state.next_lower, self.cursor_kind)
                    window = read_window(
                        conn,
                        spec,
                        lower,
                        interval_end=_in_session_zone(conn, interval_end, spec.session_time_zone),
                        safety_lag=safety_lag,
                        open_transaction_timeout=self.open_transaction_timeout,
                        log=self.log,
                    )
                    version = 1
                else:
                    window = read_window(
                        conn,
                        spec,
                        parse_cursor(recorded.lower, self.cursor_kind),
                        fixed_upper=parse_cursor(recorded.upper, self.cursor_kind),
                        log=self.log,
                    )
                    version = recorded.batch_version + 1
                header = batch_header(self.pipeline, source_partition, batch_id, version)
                messages = []
                for row in window.rows:
                    key, value = row_message(spec, row)
                    messages.append(Message(value, key, {BATCH_HEADER: header}))
                record = WindowRecord(
                    batch_id=batch_id,
                    batch_version=version,
                    lower=format_cursor(window.lower),
                    upper=format_cursor(window.upper),
                    upper_reason=window.upper_reason,
                    rows=len(messages),
                    checksum=checksum([m.value for m in messages]),
                    interval_end=interval_end.isoformat() if interval_end else None,
                    published_at=published_now(),
                )
                new_state = state.with_window(record, advance=recorded is None, max_windows=self.max_recorded_windows)
                started = time.monotonic()
                writer.write_batch(
                    self.topic, messages, new_state.to_offset(record), batch_id=batch_id, batch_version=version
                )
                self.log.info(
                    "Window %s v%d committed: [%s, %s) upper from %s (%s), %d rows in %.2fs, %s",
                    batch_id,
                    version,
                    record.lower,
                    record.upper,
                    record.upper_reason,
                    window.guard,
                    record.rows,
                    time.monotonic() - started,
                    record.checksum,
                )
                return self._result(hook, source_partition, record, skipped=False)
            finally:
                writer.close()
        finally:
            conn.close()

    def _refuse_unrecorded_past_interval(
        self, state: WatermarkState, batch_id: str, interval_end: datetime | None
    ) -> None:
        """A past interval missing from the ledger was forgotten (history trimmed): never extract it anew."""
        if interval_end is None:
            return
        later = [
            w.batch_id
            for w in state.history.values()
            if w.interval_end and datetime.fromisoformat(w.interval_end) > interval_end
        ]
        if later:
            raise ValueError(
                f"Window {batch_id!r} ends before the committed window {later[-1]!r} but is not in the ledger's "
                f"last {self.max_recorded_windows} windows, so its bounds are unknown. Raise max_recorded_windows "
                "for future runs; this interval's data was published in the windows around it."
            )

    def _result(
        self, hook: TransactionalProducerHook, source_partition: str, record: WindowRecord, skipped: bool
    ) -> dict[str, Any]:
        offsets = locate_batch(
            hook.client_config(),
            self.topic,
            self.pipeline,
            source_partition,
            record.batch_id,
            record.batch_version,
            record.published_at,
        )
        self.openlineage_result = {
            "pipeline": self.pipeline,
            "source_partition": source_partition,
            "topic": self.topic,
            "skipped": skipped,
            "kafka_offsets": offsets,
            **record.__dict__,
        }
        return self.openlineage_result

    def openlineage_datasets(self, result: dict | None) -> tuple[list, list]:
        """The table in; the topic out, with the window (bounds, version) committed with its rows."""
        source = lineage.mysql_table_of(self.mysql_conn_id, self.table)

        def read() -> list:
            with MySqlSourceHook(self.mysql_conn_id).cursor() as cur:
                return facets.mysql_fields(cur, source.name)

        columns = self.lineage_fields(source.name, read)
        topic = lineage.kafka_topic_of(self.kafka_config_id, self.topic)
        fields = facets.record_fields(facets.WINDOW_RECORD_FIELDS, "row", columns) if columns else None
        if result is None:
            return [facets.input_dataset(source, columns)], [facets.output_dataset(topic, fields)]
        window = {k: result[k] for k in ("batch_id", "batch_version", "lower", "upper", "checksum")}
        commit = facets.CommitFacet(pipeline=self.pipeline, window=window, kafkaOffsets=result["kafka_offsets"])
        rows = 0 if result["skipped"] else result["rows"]  # a rerun of a committed window publishes nothing
        return [facets.input_dataset(source, columns)], [facets.output_dataset(topic, fields, rows=rows, commit=commit)]


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "", "none"):
        return False
    raise ValueError(f"{name}={value!r}: use true or false.")


def _as_utc(name: str, value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{name}={value!r}: use an ISO-8601 date-time with a zone.") from None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ValueError(f"{name}={value!r}: use a time-zone-aware date-time (it is compared on the DB clock).")
    return datetime.fromtimestamp(value.timestamp(), tz=UTC)


def _in_session_zone(conn: Any, value: datetime | None, zone: str) -> datetime | None:
    """Return an aware instant as the naive wall-clock time of ``zone``, converted by the server."""
    if value is None:
        return None
    cur = conn.cursor()
    cur.execute("SET time_zone = %s", (zone,))
    cur.execute("SELECT FROM_UNIXTIME(%s)", (f"{value.timestamp():.6f}",))
    return cur.fetchone()[0]
