"""A short Spark application that loads the classes the product's jobs load; its JVM dumps them into a CDS archive.

Run by ``stack.spark_class_archive()`` with ``-XX:ArchiveClassesAtExit``; the test sessions then start every
Spark driver JVM with that archive (``SPARK_SUBMIT_OPTS``), which halves a short job's start-up CPU on two
cores. It touches what the jobs do: a Kafka batch write and read, a Kafka stream with an available-now trigger
into ``foreachBatch``, Delta append/MERGE/read/history, Parquet and JSON files, windows and aggregates.

Usage: ``spark-submit ... warmup.py <bootstrap servers> <topic> <scratch dir>``
"""

import sys

from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F


def main(bootstrap: str, topic: str, scratch: str) -> None:
    spark = (
        SparkSession.builder.appName("eo-class-archive-warmup")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .getOrCreate()
    )
    rows = spark.range(0, 200).select(
        F.col("id"),
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.to_json(
            F.struct(
                F.col("id"),
                (F.col("id") * 1.5).cast("decimal(12,2)").alias("amount"),
                F.current_timestamp().alias("ts"),
            )
        ).alias("value"),
    )
    rows.select("key", "value").write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option(
        "topic", topic
    ).save()
    delta = f"{scratch}/delta"

    def apply(batch, batch_id):
        parsed = batch.select(
            F.col("key").cast("string").alias("key"),
            F.from_json(F.col("value").cast("string"), "id BIGINT, amount DECIMAL(12,2), ts TIMESTAMP").alias("v"),
            "partition",
            "offset",
        ).select("key", "v.*", "partition", "offset")
        latest = parsed.withColumn("n", F.row_number().over(Window.partitionBy("key").orderBy(F.desc("offset"))))
        latest = latest.where("n = 1").drop("n")
        latest.write.format("delta").mode("append").save(delta)
        from delta.tables import DeltaTable

        DeltaTable.forPath(spark, delta).alias("t").merge(
            latest.alias("s"), "t.key = s.key"
        ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
        latest.write.mode("append").parquet(f"{scratch}/parquet")
        latest.write.mode("append").json(f"{scratch}/json")
        latest.groupBy("partition").agg(F.count("*"), F.max("offset"), F.sum("amount")).collect()

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    stream.writeStream.foreachBatch(apply).option("checkpointLocation", f"{scratch}/checkpoint").trigger(
        availableNow=True
    ).start().awaitTermination()
    table = spark.read.format("delta").load(delta)
    table.where(F.col("id").isin(1, 2, 3)).select(F.sha2(F.concat_ws("|", *table.columns), 256)).collect()
    spark.sql(f"DESCRIBE HISTORY delta.`{delta}`").collect()
    spark.read.parquet(f"{scratch}/parquet").count()
    spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic).load().count()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
