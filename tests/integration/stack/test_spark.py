"""Spark reads Kafka through the connector with read_committed and sees only committed records."""

from __future__ import annotations

from tests.kafka_support import new_topic, produce_transaction, transactional_producer


def _produce_interleaved(bootstrap: str, topic: str) -> list[str]:
    producer = transactional_producer(bootstrap)
    committed: list[str] = []
    for batch in range(6):
        values = [f"b{batch}-r{i}" for i in range(50)]
        commit = batch % 3 != 1  # batches 1 and 4 are aborted
        produce_transaction(producer, topic, [v.encode() for v in values], commit=commit)
        if commit:
            committed += values
    return committed


def _kafka_options(bootstrap: str, topic: str, isolation: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "kafka.isolation.level": isolation,
        "startingOffsets": "earliest",
    }


def test_batch_read_sees_only_committed_records_in_order(stack, spark):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap)
    committed = _produce_interleaved(bootstrap, topic)

    def read(isolation: str) -> list[str]:
        frame = (
            spark.read.format("kafka")
            .options(**_kafka_options(bootstrap, topic, isolation))
            .option("endingOffsets", "latest")
            .load()
        )
        return [row.v for row in frame.orderBy("offset").selectExpr("CAST(value AS STRING) AS v").collect()]

    assert read("read_committed") == committed
    # Guard against a vacuous pass: the aborted records are in the log.
    assert len(read("read_uncommitted")) == len(committed) + 100


def test_streaming_available_now_sees_only_committed_records(stack, spark, tmp_path):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap)
    committed = _produce_interleaved(bootstrap, topic)

    query = (
        spark.readStream.format("kafka")
        .options(**_kafka_options(bootstrap, topic, "read_committed"))
        .load()
        .selectExpr("CAST(value AS STRING) AS v", "offset")
        .writeStream.format("memory")
        .queryName(f"q_{topic.replace('-', '_')}")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    rows = spark.sql(f"SELECT v FROM q_{topic.replace('-', '_')} ORDER BY offset").collect()
    assert [row.v for row in rows] == committed
