"""Maven coordinates of the Spark connectors the jobs need, kept in one place.

Against a complete Maven repository they go to ``--packages``. The local stack resolves the same
versions once with Maven (docker/local/spark/pom.xml, see "Version choices" in CONTRIBUTING.md) and passes
the jars as ``spark.jars``, so runs never depend on a cold cache.
"""

from __future__ import annotations

import pyspark

SPARK_VERSION = pyspark.__version__
SCALA_BINARY_VERSION = "2.13"

KAFKA_CONNECTOR = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}:{SPARK_VERSION}"
# delta-spark's 4.4.1 wheel names a jar that Maven Central does not have; 4.4.0 is built on Spark 4.2.0.
DELTA_CONNECTOR = f"io.delta:delta-spark_{SCALA_BINARY_VERSION}:4.4.0"

SPARK_PACKAGES: tuple[str, ...] = (KAFKA_CONNECTOR, DELTA_CONNECTOR)


def _hadoop_version() -> str:
    """Return the version of pyspark's own Hadoop client (hadoop-aws must be the same)."""
    from pathlib import Path

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    return jars[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar") if jars else "3.5.0"


HADOOP_VERSION = _hadoop_version()
# s3a:// locations: hadoop-aws brings the AWS SDK v2 bundle it was built against.
S3A_PACKAGES: tuple[str, ...] = (f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",)
