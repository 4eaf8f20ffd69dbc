"""The in-process SparkSession of operators that read or write Delta tables from the Airflow worker."""

from __future__ import annotations

import os
import sys
from typing import Any


def spark_session(spark_conn_id: str, app_name: str, spark_conf: dict[str, str] | None = None) -> Any:
    """Return a SparkSession on the master of the ``spark`` connection, with Delta enabled and UTC time.

    :param spark_conn_id: a ``spark`` connection whose host is the master (``local[2]``, ``spark://h``).
    :param app_name: the Spark application name.
    :param spark_conf: extra settings, e.g. ``{"spark.jars": ...}`` for the Delta connector.
    """
    from airflow.sdk import BaseHook
    from pyspark.sql import SparkSession

    conn = BaseHook.get_connection(spark_conn_id)
    master = conn.host or ""
    if master.startswith("spark://") and conn.port:
        master = f"{master}:{conn.port}"
    if not master:
        raise ValueError(f"Spark connection {spark_conn_id!r} has no host (e.g. local[2], spark://host).")
    # Python workers must run this environment's interpreter (docs/pitfalls.md#spark-structured-streaming).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
    for key, value in (spark_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if spark.conf.get("spark.databricks.delta.snapshotPartitions", None) is None:
        # Delta rebuilds a table's state with 50 tasks by default: far too many for a small driver; follow
        # the shuffle partitions unless the user set it.
        spark.conf.set("spark.databricks.delta.snapshotPartitions", spark.conf.get("spark.sql.shuffle.partitions"))
    return spark
