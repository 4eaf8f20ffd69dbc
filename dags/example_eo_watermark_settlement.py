"""Example: a nightly settlement extract by watermark, one Kafka batch per data interval.

Each run publishes the window ``[last committed upper bound, min(interval end, DB clock - lag, oldest open
transaction))`` of ``params.table`` to ``params.topic`` as one transaction framed as a batch; the window is
recorded in the offsets ledger in the same transaction. Clearing a run publishes nothing new and returns the
recorded batch; triggering it with ``reextract`` re-reads the recorded bounds and publishes a new version.

Try it: ``airflow dags test eo_watermark_settlement 2026-11-20 --conf '{"table": "orders", "reextract": false}'``.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import CronDataIntervalTimetable, Param, dag

from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator


@dag(
    dag_id="eo_watermark_settlement",
    # A cron string alone is a CronTriggerTimetable in Airflow 3 (no data interval); settlements need one.
    schedule=CronDataIntervalTimetable("0 2 * * *", timezone=pendulum.timezone("Asia/Shanghai")),
    start_date=pendulum.datetime(2026, 1, 1, tz="Asia/Shanghai"),
    catchup=False,
    max_active_runs=1,  # windows follow each other: one writer per ledger key
    tags=["exactly-once", "example", "watermark"],
    params={
        "table": Param("orders", type="string", description="source table (schema.table or table)"),
        "cursor_column": Param("updated_at", type="string", description="TIMESTAMP cursor column"),
        "topic": Param("eo-settlement", type="string", description="data topic"),
        "pipeline": Param("settlement", type="string", description="pipeline name (transactional id)"),
        "safety_lag": Param(5, type="number", minimum=0, description="seconds kept behind the DB clock"),
        "reextract": Param(
            False, type="boolean", description="re-read this interval's recorded bounds and publish a new version"
        ),
    },
    doc_md=__doc__,
)
def eo_watermark_settlement():
    # [START howto_operator_watermark_extract]
    WatermarkExtractOperator(
        task_id="extract_window",
        table="{{ params.table }}",
        cursor_column="updated_at",
        cursor_kind="timestamp",
        topic="{{ params.topic }}",
        pipeline="{{ params.pipeline }}",
        reextract="{{ params.reextract }}",
        safety_lag="{{ params.safety_lag }}",
        deleted_column=None,
    )
    # [END howto_operator_watermark_extract]


eo_watermark_settlement()
