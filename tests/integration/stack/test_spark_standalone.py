"""A Spark standalone master + worker on loopback runs a PySpark job with Python workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

JOB = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("eo-standalone-smoke").getOrCreate()
# A Python lambda forces Python workers on the executor, not just JVM work.
total = spark.sparkContext.parallelize(range(1, 100001), 4).map(lambda x: x * 2).sum()
print(f"RESULT {total} on {spark.sparkContext.master}")
spark.stop()
"""


def test_job_runs_on_standalone_cluster(stack, tmp_path):
    stack.start_spark_cluster()
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {**os.environ, **stack.spark_env()}
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "spark-submit"),
            "--master",
            stack.SPARK_MASTER_URL,
            "--conf",
            "spark.executor.memory=512m",
            "--conf",
            "spark.driver.memory=512m",
            str(job),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"RESULT {100000 * 100001} on {stack.SPARK_MASTER_URL}" in result.stdout
