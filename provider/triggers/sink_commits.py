"""Event trigger: announce each new commit of a pipeline's sink as an Airflow Asset event.

A continuous stream commits many batches inside one task, so the task's outlets (an event when the task ends)
give a DAG downstream nothing to run on while it streams. This trigger runs in the triggerer as an
:class:`~airflow.sdk.AssetWatcher` of the sink's Asset (:func:`~exactly_once_provider.assets.sink_commits`): it
reads the sink's own commit marker (what the sink committed atomically with the batch's rows, the same reader
the lag sensor uses) and yields an event whenever it moved, with the batch's figures as the event's extra.

What an event says: the newest committed batch (pipeline, checkpoint, batch id, the Kafka offsets the next
batch starts at, rows in the sink) and what changed since the previous event (rows added, Kafka records
passed, the first and last batch ids). Commits made between two polls are announced together, in one event
naming both batch ids: a downstream "refresh when orders changed" needs the newest state, not one run per
micro-batch. With the pipeline's Kafka connection (``kafka_config_id``) an event also says where the source is in
the sink (:func:`~exactly_once_provider.kafka.change_times.source_state`): the binlog position and commit time of
the newest change applied, and the freshness (seconds since the source commit of the oldest change not applied,
0 when caught up), read from the change records around the sink's offsets.

Announced at least once: the last announced commit is kept in the Asset's state store (Airflow 3.3), written
after the event is handed to the triggerer, so a triggerer restart resumes after it. A restart between the two
announces that commit again; the first start with nothing stored announces the newest commit if there is one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from exactly_once_provider.triggers.arguments import SerializedByArguments

STATE_KEY = "exactly_once_last_commit"


def commit_identity(commit: Any) -> list:
    """Return what tells two commits of a sink apart (JSON-storable)."""
    return [commit.checkpoint_id, commit.batch_id, commit.rows_total]


def describe_commit(commit: Any, previous: dict | None, sink: str, location: str) -> dict[str, Any]:
    """Return the Asset event's extra for ``commit``, counted from the ``previous`` event's figures (or None)."""
    offsets = {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(commit.offsets.items())}
    before = (previous or {}).get("offsets") or {}
    records = sum(
        max(0, int(o) - int(before.get(t, {}).get(p, 0))) for t, parts in offsets.items() for p, o in parts.items()
    )
    same_checkpoint = previous is not None and previous.get("checkpoint") == commit.checkpoint_id
    return {
        "sink": sink,
        "location": location,
        "pipeline": commit.pipeline,
        "checkpoint": commit.checkpoint_id,
        "batch_id": commit.batch_id,
        "first_batch_id": previous["batch_id"] + 1 if same_checkpoint else None,
        "offsets": offsets,
        "records": records,
        "rows_total": commit.rows_total,
        "rows_added": commit.rows_total - int((previous or {}).get("rows_total", 0)),
        "seen_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


class SinkCommitTrigger(SerializedByArguments, BaseEventTrigger):
    """Yield an event each time the sink of ``sink_pipeline`` commits a new batch (for an AssetWatcher).

    :param sink: ``delta``, ``postgres``, ``files`` or ``iceberg``.
    :param sink_location: the Delta table / files directory (local or ``s3://``), the PostgreSQL table, or the
        Iceberg table (``namespace.table``).
    :param sink_pipeline: the Spark job's pipeline name.
    :param postgres_conn_id: ``postgres`` sink: the connection, resolved in the triggerer; ``iceberg``: the
        database of its SQL catalog.
    :param aws_conn_id: a files or Delta sink on ``s3://``: the ``aws`` connection, resolved in the triggerer.
    :param poll_interval: seconds between reads of the sink's commit marker.
    :param kafka_config_id: the pipeline's ``kafka`` connection: adds the source position and freshness to each
        event (None: the sink's figures only).
    """

    def __init__(
        self,
        sink: str,
        sink_location: str,
        sink_pipeline: str,
        postgres_conn_id: str | None = None,
        aws_conn_id: str | None = None,
        poll_interval: float = 10.0,
        kafka_config_id: str | None = None,
    ) -> None:
        super().__init__()
        self.kafka_config_id = kafka_config_id
        self.sink, self.sink_location, self.sink_pipeline = sink, sink_location, sink_pipeline
        self.postgres_conn_id, self.aws_conn_id, self.poll_interval = postgres_conn_id, aws_conn_id, poll_interval

    ARGUMENTS = (
        "sink",
        "sink_location",
        "sink_pipeline",
        "postgres_conn_id",
        "aws_conn_id",
        "poll_interval",
        "kafka_config_id",
    )

    async def _stored(self) -> dict | None:
        store = self.asset_state_store
        return None if store is None else await store.aget(STATE_KEY)

    async def _store(self, announced: dict) -> None:
        if self.asset_state_store is not None:
            await self.asset_state_store.aset(STATE_KEY, announced)

    async def _source(self, config: dict, commit: Any) -> dict[str, Any]:
        """Return the event's source figures; a Kafka that cannot be read is named in the event, not fatal."""
        from exactly_once_provider.kafka.change_times import source_state

        try:
            return await asyncio.to_thread(source_state, config, commit.offsets)
        except Exception as err:  # the commit is announced all the same: it happened
            self.log.warning("sink %s: source position not read from Kafka: %s", self.sink_location, err)
            return {"source": None, "freshness_s": None, "source_error": f"{type(err).__name__}: {err}"}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from exactly_once_provider.sinks.base import open_sink
        from exactly_once_provider.triggers.consumer_lag import sink_connections

        connect, s3 = await sink_connections(self.sink, [self.sink_location], self.postgres_conn_id, self.aws_conn_id)
        reader = open_sink(self.sink, self.sink_location, self.sink_pipeline, postgres_connect=connect or {}, s3=s3)
        announced = await self._stored()
        config = None
        if self.kafka_config_id:
            from asgiref.sync import sync_to_async

            from exactly_once_provider.hooks.kafka_client import kafka_client_config

            config = await sync_to_async(kafka_client_config)(self.kafka_config_id)
        while True:
            commit = await asyncio.to_thread(reader.committed)
            if commit is not None and (announced is None or announced.get("identity") != commit_identity(commit)):
                extra = describe_commit(commit, announced, self.sink, self.sink_location)
                if config is not None:
                    extra.update(await self._source(config, commit))
                self.log.info(
                    "sink %s %s: batch %d committed (%d rows added, %d records)",
                    self.sink,
                    self.sink_location,
                    commit.batch_id,
                    extra["rows_added"],
                    extra["records"],
                )
                yield TriggerEvent(extra)
                announced = {**extra, "identity": commit_identity(commit)}
                await self._store(announced)
            await asyncio.sleep(self.poll_interval)
