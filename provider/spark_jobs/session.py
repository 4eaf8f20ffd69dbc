"""The SparkSession of a packaged job's driver (started by spark-submit, which sets the master)."""

from __future__ import annotations

import os
import sys
from typing import Any

from exactly_once_provider.spark_jobs.spec import JobSpec, report_started


def register_storage(secrets: dict[str, Any]) -> None:
    """Make the S3 settings of the secrets file (``s3``, written by the operator) this driver's storage settings.

    Every ``s3://`` location the driver opens (:func:`~exactly_once_provider.storage.open_storage`) and its Spark
    session (:func:`with_storage_conf`) then use them; a job without S3 locations has none.

    :param secrets: the job's secrets file, read.
    """
    from exactly_once_provider.storage.s3 import S3Settings, register_settings

    register_settings(S3Settings.from_json(secrets["s3"]) if secrets.get("s3") else None)


def with_storage_conf(builder: Any) -> Any:
    """Add the registered S3 settings to a SparkSession builder as s3a settings (``spark.hadoop.fs.s3a.*``).

    In the driver's own process, so the credentials reach Spark without a command line; Spark's redaction
    (``spark.redaction.regex``: secret, token, access key) keeps them out of its UI and event log.
    """
    from exactly_once_provider.storage.s3 import registered_settings

    settings = registered_settings()
    for key, value in (settings.hadoop_conf() if settings else {}).items():
        builder = builder.config(key, value)
    return builder


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
        builder = builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension").config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
    spark = with_storage_conf(builder).getOrCreate()
    if delta:
        limit_snapshot_partitions(spark)
    report_started(spec, spark.sparkContext.uiWebUrl)
    return spark


def limit_snapshot_partitions(spark: Any) -> None:
    """Rebuild Delta table states with no more tasks than the application has cores, unless the user chose.

    Delta's default is 50 tasks (200 when it followed Spark's default shuffle partitions): a stage of that many
    tiny tasks for a log of a few files on every snapshot a reconciliation or a report reads (the settlement
    template's reconcile task took ~100 s on 2 cores with 200). More tasks than cores cannot run at once anyway.
    """
    if spark.conf.get("spark.databricks.delta.snapshotPartitions", None) is not None:
        return
    shuffle = int(spark.conf.get("spark.sql.shuffle.partitions"))
    spark.conf.set(
        "spark.databricks.delta.snapshotPartitions", str(max(1, min(shuffle, spark.sparkContext.defaultParallelism)))
    )
