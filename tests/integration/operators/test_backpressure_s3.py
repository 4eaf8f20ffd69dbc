"""ConsumerLagSensor on a files sink on S3 (the stack's MinIO): the lag is read from the sink's manifest through
the ``aws`` connection, in the worker (poke) and in the triggerer (its connection resolved there)."""

from __future__ import annotations

import asyncio
import uuid

from exactly_once_provider.operators.backpressure import ConsumerLagSensor
from exactly_once_provider.sinks.base import BatchCommit
from exactly_once_provider.sinks.files import FilesSink
from exactly_once_provider.storage import open_storage
from exactly_once_provider.triggers.consumer_lag import ConsumerLagTrigger
from tests import spark_job_support as jobs
from tests.kafka_support import new_topic
from tests.storage_support import ParquetFrame


def _trigger_event(trigger: ConsumerLagTrigger) -> dict:
    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(first(), 60))


def test_the_lag_of_a_files_sink_on_minio_comes_from_its_manifest(stack, airflow_connections):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=3, per_transaction=10, partitions=2)
    jobs.wait_for_committed_end(bootstrap, topic, 2)
    end = jobs.end_offsets(bootstrap, topic, 2)
    location = f"s3://{stack.MINIO_BUCKETS[0]}/lag/{uuid.uuid4().hex[:8]}"
    sensor = ConsumerLagSensor(
        task_id="lag",
        topics=topic,
        max_lag=0,
        sink="files",
        sink_location=location,
        sink_pipeline="lag-s3",
        deferrable=False,
    )
    assert not sensor.poke({})  # nothing published: the whole topic is lag
    storage = open_storage(location, stack.minio_settings())
    try:
        FilesSink(location, "lag-s3", storage).commit(
            ParquetFrame(storage, list(range(len(committed)))), BatchCommit("lag-s3", "c1", 0, {topic: end})
        )
        assert sensor.poke({})
        trigger = ConsumerLagTrigger(
            "kafka_default",
            [topic],
            0,
            sink="files",
            sink_location=location,
            sink_pipeline="lag-s3",
            aws_conn_id="aws_default",
            poll_interval=0.1,
        )
        assert "aws_default" in str(trigger.serialize()) and stack.MINIO_SECRET_KEY not in str(trigger.serialize())
        event = _trigger_event(trigger)
        assert event["status"] == "ok" and event["lag"] == 0
    finally:
        storage.delete_prefix("")
