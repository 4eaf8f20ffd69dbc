"""Example: the nightly settlement template on the demo shop's ``payments`` (amount per currency).

Runs at 02:00 Asia/Shanghai for the interval that ends then. Data lives under ``$EO_DATA_DIR`` (default
``/var/tmp/eo-data``); ``$EO_SPARK_JARS`` lists the Spark connector jars (``make demo`` sets both). With
``$EO_LAKE`` set (``s3://bucket/prefix``: ``make demo STORAGE=s3``, the ``aws_default`` connection, the s3a jars
in ``$EO_SPARK_CLASSPATH``) the tables and checkpoints live there.

Try it: ``airflow dags test eo_settlement 2026-11-20T18:00:00+00:00``; re-settle a window from the UI with
``{"reextract": true}`` or ``{"window_end": "2026-11-20T18:00:00+00:00"}``.
"""

from __future__ import annotations

# [START howto_template_settlement]
# An Airflow DAG file: Airflow's DAG discovery (safe mode, its default) parses only the files that mention both
# "airflow" and "dag", and a file that only calls a template may mention neither: keep this line.
import os

import pendulum

from exactly_once_provider.templates.settlement import settlement_dag

LAKE = os.environ.get("EO_LAKE") or os.environ.get("EO_DATA_DIR", "/var/tmp/eo-data")  # or s3://bucket/prefix
RUN = os.environ.get("EO_DEMO_RUN", "")  # the demo names each of its runs' pipelines apart
SPARK_CONF = {"spark.jars": os.environ["EO_SPARK_JARS"]} if os.environ.get("EO_SPARK_JARS") else {}
if os.environ.get("EO_SPARK_CLASSPATH"):  # the s3a jars (make demo STORAGE=s3)
    SPARK_CONF.update(
        dict.fromkeys(
            ("spark.driver.extraClassPath", "spark.executor.extraClassPath"), os.environ["EO_SPARK_CLASSPATH"]
        )
    )

dag = settlement_dag(
    dag_id="eo_settlement",
    table="payments",
    cursor_column="updated_at",
    group_by=["currency"],
    sum_columns=["amount"],
    pipeline=f"shop-settlement{RUN}",
    topic=f"eo-shop-payments{RUN}",
    sink_path=f"{LAKE}/settlement/payments_windows",
    checkpoint_location=f"{LAKE}/settlement/checkpoint",
    report_table="eo_settlement_payments",
    start_date=pendulum.datetime(2026, 1, 1, tz="Asia/Shanghai"),
    cron="0 2 * * *",
    timezone="Asia/Shanghai",
    spark_conf=SPARK_CONF,
    tags=["example"],
)
# [END howto_template_settlement]
