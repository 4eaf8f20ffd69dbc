"""The SparkSession of a packaged job's driver (started by spark-submit, which sets the master)."""

from __future__ import annotations

import os
import sys
from typing import Any

from exactly_once_provider.spark_jobs.spec import JobSpec, report_started


def driver_session(spec: JobSpec, delta: bool = True) -> Any:
    """Return the driver's SparkSession, with Delta enabled and UTC time; tell the operator it runs.

    :param spec: the job's spec (its ``app_name``; the started file to write).
    :param delta: enable the Delta extension and catalog.
    """
    from pyspark.sql import SparkSession

    # Python workers must run this environment's interpreter (docs/pitfalls.md#spark-structured-streaming).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(spec.app_name).config("spark.sql.session.timeZone", "UTC")
    if delta:
        builder = (builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
                   .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
    spark = builder.getOrCreate()
    if delta and spark.conf.get("spark.databricks.delta.snapshotPartitions", None) is None:
        # Delta rebuilds a table's state with 50 tasks by default: far too many for a small driver; follow
        # the shuffle partitions unless the user set it.
        spark.conf.set("spark.databricks.delta.snapshotPartitions", spark.conf.get("spark.sql.shuffle.partitions"))
    report_started(spec, spark.sparkContext.uiWebUrl)
    return spark
