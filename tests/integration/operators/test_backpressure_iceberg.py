"""ConsumerLagSensor on an Iceberg sink: the lag is read from the newest snapshot's summary through the SQL catalog
in the database of ``postgres_conn_id``, in the worker (poke) and in the triggerer (its connection resolved there)."""

from __future__ import annotations

import uuid

from exactly_once_provider.operators.backpressure import ConsumerLagSensor
from exactly_once_provider.sinks.base import BatchCommit
from exactly_once_provider.sinks.iceberg import IcebergSink, catalog_settings
from exactly_once_provider.triggers.consumer_lag import ConsumerLagTrigger
from tests import spark_job_support as jobs
from tests.integration.operators.test_backpressure_s3 import _trigger_event
from tests.integration.spark_jobs.test_kafka_to_sink_iceberg import drop
from tests.kafka_support import new_topic


class RecordsFrame:
    """Stands in for the Spark job's DataFrame: ``write.mode(m).parquet(path)`` writes the records' append columns."""

    def __init__(self, topic: str, count: int):
        self.topic, self.count, self.write = topic, count, self

    def mode(self, _mode):
        return self

    def parquet(self, path: str):
        import os

        import pyarrow as pa
        import pyarrow.parquet as pq

        os.makedirs(path)
        n = list(range(self.count))
        table = pa.table(
            {
                "kafka_topic": [self.topic] * self.count,
                "kafka_partition": pa.array([i % 2 for i in n], pa.int32()),
                "kafka_offset": pa.array(n, pa.int64()),
                "record_key": [f"k{i}" for i in n],
                "record_value": ["{}"] * self.count,
            }
        )
        pq.write_table(table, os.path.join(path, "part-00000-x.snappy.parquet"))


def test_the_lag_of_an_iceberg_sink_comes_from_its_snapshot_summary(stack, airflow_connections, tmp_path):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=3, per_transaction=10, partitions=2)
    jobs.wait_for_committed_end(bootstrap, topic, 2)
    end = jobs.end_offsets(bootstrap, topic, 2)
    table, pipeline = f"it_lag_{uuid.uuid4().hex[:10]}.records", "lag-iceberg"
    sensor = ConsumerLagSensor(
        task_id="lag",
        topics=topic,
        max_lag=0,
        sink="iceberg",
        sink_location=table,
        sink_pipeline=pipeline,
        postgres_conn_id="postgres_default",
        deferrable=False,
    )
    sink = IcebergSink(table, pipeline, catalog_settings("postgres_default"), str(tmp_path / "records"))
    try:
        assert not sensor.poke({})  # no table yet: the whole topic is lag
        sink.prepare()
        sink.commit(RecordsFrame(topic, len(committed)), BatchCommit(pipeline, "c1", 0, {topic: end}))
        assert sensor.poke({})
        trigger = ConsumerLagTrigger(
            "kafka_default",
            [topic],
            0,
            sink="iceberg",
            sink_location=table,
            sink_pipeline=pipeline,
            postgres_conn_id="postgres_default",
            poll_interval=0.1,
        )
        assert stack.DB_PASSWORD not in str(trigger.serialize())
        event = _trigger_event(trigger)
        assert event["status"] == "ok" and event["lag"] == 0
    finally:
        drop(sink)
