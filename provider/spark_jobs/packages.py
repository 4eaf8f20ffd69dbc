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
