"""Example: produce a numbered source to Kafka exactly once; a rerun continues from the committed offset.

The source is a deterministic sequence ``1..records`` (offset = sequence number, key = ``k<n % 10>``), so
the topic can be checked against it. Run it with
``airflow dags test eo_kafka_produce --conf '{"topic": "demo", "records": 5000}'``; run it again and it
produces nothing, because the offsets ledger says everything up to ``records`` is committed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pendulum
from airflow.sdk import Param, dag

from exactly_once_provider.operators.kafka_produce import SourceRecord, TransactionalProduceOperator


# [START howto_source_function]
def numbered_source(resume_after: int | None, records: int | str) -> Iterator[SourceRecord]:
    """Yield records ``resume_after + 1 .. records`` of a numbered source."""
    for n in range((resume_after or 0) + 1, int(records) + 1):
        yield SourceRecord(offset=n, key=f"k{n % 10}", value=f"{n}")


# [END howto_source_function]


@dag(
    dag_id="eo_kafka_produce",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["exactly-once", "example", "kafka"],
    params={
        "topic": Param("eo-example", type="string", description="data topic"),
        "records": Param(5000, type="integer", minimum=0, description="source size"),
        "pipeline": Param("example", type="string", description="pipeline name (transactional id)"),
    },
    doc_md=__doc__,
)
def eo_kafka_produce():
    # [START howto_operator_transactional_produce]
    TransactionalProduceOperator(
        task_id="produce",
        topic="{{ params.topic }}",
        pipeline="{{ params.pipeline }}",
        delivery_mode="exactly_once",
        producer_function=numbered_source,
        producer_function_kwargs={"records": "{{ params.records }}"},
        max_records_per_transaction=1000,
        commit_interval_ms=500,
    )
    # [END howto_operator_transactional_produce]


eo_kafka_produce()
