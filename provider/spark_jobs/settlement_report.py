"""Spark job: the per-group row counts and exact sums of one settled window of a window-mode Delta sink.

Submitted by :class:`~exactly_once_provider.operators.settlement_report.SettlementReportOperator`
(``spark-submit .../settlement_report.py --spec <job spec>``); it returns the groups through its result file and
the operator replaces the window's report rows in PostgreSQL. Reads only: a rerun is harmless.
"""

from __future__ import annotations

import sys
from typing import Any

from exactly_once_provider.spark_jobs.driver import run_job
from exactly_once_provider.spark_jobs.spec import JobSpec

JOB = "settlement_report"


def window_groups(
    spark: Any, sink_path: str, window_id: str, group_by: list[str], sum_columns: list[str], scales: dict[str, int]
) -> list[dict[str, Any]]:
    """Return per group of ``window_id``: its values, ``eo_rows``, ``v`` (the window version) and each sum.

    Sums are exact decimals at the source column's scale, returned as text so JSON keeps every digit.

    :param spark: the SparkSession.
    :param sink_path: the window-mode Delta table (local, or ``s3://``: read through ``s3a`` with the driver's
        registered settings).
    :param window_id: the window.
    :param group_by: the row's JSON fields to group by.
    :param sum_columns: the row's JSON fields to sum.
    :param scales: each sum column's decimal scale.
    """
    from pyspark.sql import functions as F

    from exactly_once_provider.sinks.delta_log import spark_path

    rows = spark.read.format("delta").load(spark_path(sink_path)).where(F.col("window_id") == window_id)
    groups = [F.get_json_object("record_value", f"$.row.{c}").alias(c) for c in group_by]
    sums = [
        F.sum(F.get_json_object("record_value", f"$.row.{c}").cast(f"decimal(38,{scales[c]})")).alias(c)
        for c in sum_columns
    ]
    result = (
        rows.groupBy(*groups)
        .agg(F.count(F.lit(1)).alias("eo_rows"), F.max("window_version").alias("v"), *sums)
        .collect()
    )
    return [{k: (str(v) if k in sum_columns and v is not None else v) for k, v in r.asDict().items()} for r in result]


def _driver(spec: JobSpec, secrets: dict) -> list[dict[str, Any]]:
    from exactly_once_provider.spark_jobs.session import driver_session

    p = spec.params
    spark = driver_session(spec)
    try:
        return window_groups(spark, p["sink_path"], p["window_id"], p["group_by"], p["sum_columns"], p["scales"])
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(run_job(JOB, _driver, sys.argv[1:]))
