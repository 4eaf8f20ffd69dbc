"""Example: the history -> stream template on a whole shop database, tables by pattern, an increment every 5 minutes.

The shop's tables (``make demo`` seeds them): ``orders``, ``payments`` and ``refunds`` by name, and every table
matching ``shop_*`` (customers by integer key, products by text key, shipments by a composite key). The patterns
are resolved at every run: a table created later (``demo_shop.py add-table`` creates ``shop_reviews``) is loaded
by the next run and followed from its snapshot, the others streaming on. One full-load application, one capture,
one apply application and one reconciliation task for all of them.

Data lives under ``$EO_DATA_DIR`` (default ``/var/tmp/eo-data``); ``$EO_SPARK_JARS`` lists the Spark connector jars.
"""

from __future__ import annotations

# An Airflow DAG file: Airflow's DAG discovery (safe mode) parses only files that mention "airflow" and "dag".
import os

import pendulum

from exactly_once_provider.templates.history_stream import history_stream_dag

DATA = os.environ.get("EO_DATA_DIR", "/var/tmp/eo-data")
LAKE = os.environ.get("EO_LAKE") or DATA
RUN = os.environ.get("EO_DEMO_RUN", "")
SPARK_CONF = {"spark.jars": os.environ["EO_SPARK_JARS"]} if os.environ.get("EO_SPARK_JARS") else {}
if os.environ.get("EO_SPARK_CLASSPATH"):  # the s3a jars (make demo STORAGE=s3)
    SPARK_CONF.update(
        dict.fromkeys(
            ("spark.driver.extraClassPath", "spark.executor.extraClassPath"), os.environ["EO_SPARK_CLASSPATH"]
        )
    )

dag = history_stream_dag(
    dag_id="eo_shop_database",
    schema=os.environ.get("EO_SHOP_SCHEMA", "eo"),
    tables=["orders", "payments", "refunds", "shop_*"],
    pipeline=f"shop-db{RUN}",
    table_path=f"{LAKE}/shop/{{table}}",
    checkpoint_location=f"{LAKE}/shop/checkpoint",
    staging_path=f"{LAKE}/shop/staging/{{table}}",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    every_minutes=5,
    spark_conf=SPARK_CONF,
    tags=["example"],
)
