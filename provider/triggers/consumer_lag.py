"""Trigger: wait in the triggerer until a pipeline's consumer lag is at or below a threshold."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from exactly_once_provider.kafka.lag import Lag, group_offsets, sink_offsets, stable_end_offsets
from exactly_once_provider.triggers.arguments import SerializedByArguments


def sink_locations(value: str | Sequence[str] | None) -> list[str]:
    """Return the sink locations a lag is measured at: one, or each table's of several tables' one reader."""
    return [] if not value else [value] if isinstance(value, str) else list(value)


async def sink_connections(
    sink: str | None, locations: list[str], postgres_conn_id: str | None, aws_conn_id: str | None
) -> tuple[dict | None, Any]:
    """Resolve, in the triggerer, what a sink reader needs: ``(psycopg2 arguments, S3 settings)``, either None.

    Airflow's connection API is synchronous: it is called off the event loop.
    """
    from asgiref.sync import sync_to_async

    from exactly_once_provider.connections import connect_kwargs
    from exactly_once_provider.storage import is_s3
    from exactly_once_provider.storage.s3 import S3Settings

    if sink == "postgres":
        return await sync_to_async(connect_kwargs)(postgres_conn_id or "postgres_default"), None
    if sink == "iceberg":  # the SQL catalog's database; a table on s3:// needs the aws connection named
        connect = await sync_to_async(connect_kwargs)(postgres_conn_id or "postgres_default")
        return connect, await sync_to_async(S3Settings.from_connection)(aws_conn_id) if aws_conn_id else None
    if sink in ("files", "delta") and any(is_s3(location) for location in locations):
        return None, await sync_to_async(S3Settings.from_connection)(aws_conn_id or "aws_default")
    return None, None


def measure_lag(
    client_config: dict[str, Any],
    topics: list[str],
    sink: str | None = None,
    sink_location: str | Sequence[str] | None = None,
    sink_pipeline: str | None = None,
    consumer_group: str | None = None,
    postgres_connect: dict | None = None,
    missing_topics_ok: bool = False,
    s3: Any = None,
    iceberg_catalog: str | None = None,
) -> Lag:
    """Return the lag of a sink (read from the sink's own commits) or of a consumer group.

    :param client_config: the ``kafka`` connection's client settings
        (:func:`~exactly_once_provider.hooks.kafka_client.kafka_client_config`).
    :param topics: the topics the reader consumes.
    :param sink: ``delta``, ``postgres`` or ``files`` (with ``sink_location`` and ``sink_pipeline``).
    :param sink_location: the sink's path or table; or a list of them, one per table, when one reader (one
        streaming query over several tables' topics) commits each table's offsets in its own sink.
    :param sink_pipeline: the Spark job's pipeline name.
    :param consumer_group: a consumer group instead of a sink.
    :param postgres_connect: psycopg2 connection arguments for a ``postgres`` sink.
    :param missing_topics_ok: a topic not created yet (the first run, before the producer) has no lag.
    :param s3: a files or Delta sink on ``s3://``: its :class:`~exactly_once_provider.storage.s3.S3Settings`.
    :param iceberg_catalog: ``iceberg``: the SQL catalog's name in the database of ``postgres_connect``; None: ``eo``.
    """
    end = stable_end_offsets(client_config, topics, missing_ok=missing_topics_ok)
    if not end:
        return Lag({}, {})
    if consumer_group:
        committed = group_offsets(client_config, consumer_group, topics)
    else:
        committed = {}
        for location in sink_locations(sink_location) or [""]:
            offsets = sink_offsets(sink or "", location, sink_pipeline or "", postgres_connect, s3, iceberg_catalog)
            for topic, parts in offsets.items():
                committed.setdefault(topic, {}).update(parts)
    return Lag(end, committed)


class ConsumerLagTrigger(SerializedByArguments, BaseTrigger):
    """Fire once the lag (records in ``topics`` not yet committed by the reader) is ``<= max_lag``.

    Lag counts offsets between the reader's committed position and the stable end (LSO), so transaction
    markers count too: a threshold of a few records per transaction is "caught up".

    :param kafka_config_id: the ``kafka`` connection, read again in the triggerer (its settings, secrets
        included, are never serialised).
    :param topics: the topics.
    :param max_lag: fire when the total lag is at or below this.
    :param sink: ``delta``, ``postgres`` or ``files``; or None with ``consumer_group``.
    :param sink_location: the sink's path or table, or a list of them (see :func:`measure_lag`).
    :param sink_pipeline: the Spark job's pipeline name.
    :param consumer_group: a consumer group instead of a sink.
    :param postgres_conn_id: ``postgres`` sink: the connection, resolved in the triggerer.
    :param aws_conn_id: a files or Delta sink on ``s3://``: the ``aws`` connection, resolved in the triggerer.
    :param iceberg_catalog: ``iceberg``: the SQL catalog's name (default ``eo``).
    :param poll_interval: seconds between measurements.
    :param missing_topics_ok: a topic not created yet has no lag.
    """

    def __init__(
        self,
        kafka_config_id: str,
        topics: list[str],
        max_lag: int,
        sink: str | None = None,
        sink_location: str | Sequence[str] | None = None,
        sink_pipeline: str | None = None,
        consumer_group: str | None = None,
        postgres_conn_id: str | None = None,
        poll_interval: float = 10.0,
        missing_topics_ok: bool = False,
        aws_conn_id: str | None = None,
        iceberg_catalog: str | None = None,
    ) -> None:
        super().__init__()
        self.kafka_config_id, self.topics, self.max_lag = kafka_config_id, list(topics), int(max_lag)
        self.sink, self.sink_location, self.sink_pipeline = sink, sink_location, sink_pipeline
        self.consumer_group, self.postgres_conn_id, self.poll_interval = consumer_group, postgres_conn_id, poll_interval
        self.missing_topics_ok, self.aws_conn_id, self.iceberg_catalog = missing_topics_ok, aws_conn_id, iceberg_catalog

    ARGUMENTS = (
        "kafka_config_id",
        "topics",
        "max_lag",
        "sink",
        "sink_location",
        "sink_pipeline",
        "consumer_group",
        "postgres_conn_id",
        "poll_interval",
        "missing_topics_ok",
        "aws_conn_id",
        "iceberg_catalog",
    )

    async def _connections(self) -> tuple[dict[str, Any], dict | None, Any]:
        """Read the connections in the triggerer (Airflow's connection API is synchronous: off the event loop)."""
        from asgiref.sync import sync_to_async

        from exactly_once_provider.hooks.kafka_client import kafka_client_config

        kafka = await sync_to_async(kafka_client_config)(self.kafka_config_id)
        connect, s3 = await sink_connections(
            self.sink, sink_locations(self.sink_location), self.postgres_conn_id, self.aws_conn_id
        )
        return kafka, connect, s3

    async def run(self) -> AsyncIterator[TriggerEvent]:
        kafka, connect, s3 = await self._connections()
        started = time.monotonic()
        while True:
            lag = await asyncio.to_thread(
                measure_lag,
                kafka,
                self.topics,
                self.sink,
                self.sink_location,
                self.sink_pipeline,
                self.consumer_group,
                connect,
                self.missing_topics_ok,
                s3,
                self.iceberg_catalog,
            )
            if lag.total <= self.max_lag:
                yield TriggerEvent(
                    {
                        "status": "ok",
                        "lag": lag.total,
                        "detail": lag.describe(),
                        "waited_seconds": round(time.monotonic() - started, 1),
                    }
                )
                return
            self.log.info(
                "lag %d > %d (%s); checking again in %ss", lag.total, self.max_lag, lag.describe(), self.poll_interval
            )
            await asyncio.sleep(self.poll_interval)
