"""Example: the history -> stream template on the demo shop's ``orders``, an increment every 5 minutes.

Data lives under ``$EO_DATA_DIR`` (default ``/var/tmp/eo-data``); ``$EO_SPARK_JARS`` lists the Spark
connector jars (``make demo`` sets both). With ``$EO_LAKE`` set (``s3://bucket/prefix``: ``make demo STORAGE=s3``,
the ``aws_default`` connection, the s3a jars in ``$EO_SPARK_CLASSPATH``) the tables and checkpoints live there.

Try it: ``airflow dags test eo_history_stream`` (first run: full load, then the first increment); reload
from the UI with ``{"full_reload": true}``. Read the table: ``SELECT * FROM delta.`<table_path>` WHERE NOT
_eo_deleted``.
"""

from __future__ import annotations

# [START howto_template_history_stream]
# An Airflow DAG file: Airflow's DAG discovery (safe mode, its default) parses only the files that mention both
# "airflow" and "dag", and a file that only calls a template may mention neither: keep this line.
import os

import pendulum

from exactly_once_provider.templates.history_stream import history_stream_dag

DATA = os.environ.get("EO_DATA_DIR", "/var/tmp/eo-data")
LAKE = os.environ.get("EO_LAKE") or DATA  # the table, its staging and checkpoint: a directory or s3://bucket/prefix
RUN = os.environ.get("EO_DEMO_RUN", "")  # the demo names each of its runs' pipelines apart
SPARK_CONF = {"spark.jars": os.environ["EO_SPARK_JARS"]} if os.environ.get("EO_SPARK_JARS") else {}
if os.environ.get("EO_SPARK_CLASSPATH"):  # the s3a jars (make demo STORAGE=s3)
    SPARK_CONF.update(
        dict.fromkeys(
            ("spark.driver.extraClassPath", "spark.executor.extraClassPath"), os.environ["EO_SPARK_CLASSPATH"]
        )
    )

dag = history_stream_dag(
    dag_id="eo_history_stream",
    schema=os.environ.get("EO_SHOP_SCHEMA", "eo"),
    table="orders",
    key_column="id",
    pipeline=f"shop-orders{RUN}",
    table_path=f"{LAKE}/stream/orders",
    checkpoint_location=f"{LAKE}/stream/checkpoint",
    staging_path=f"{LAKE}/stream/orders_staging",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    every_minutes=5,
    chunk_rows=20_000,
    spark_conf=SPARK_CONF,
    tags=["example"],
)
# [END howto_template_history_stream]
