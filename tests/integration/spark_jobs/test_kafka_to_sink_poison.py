"""Poison records (not storable as text): the job stops cleanly at their batch, names them, commits nothing past.

A first committed transaction of good records, then one holding good records around a value that is not
valid UTF-8 (or, for PostgreSQL, text with a NUL character). With one transaction per micro-batch, the first
batch is committed and the second fails before its sink commit: the error names topic/partition/offset, the
sink holds exactly the first transaction and its offsets stay at its end. The job runs in this process on the
session's local[2] SparkSession.
"""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.storage import open_storage
from tests import spark_job_support as jobs
from tests.integration.spark_jobs.test_kafka_to_sink import sink_state, target_for
from tests.integration.spark_jobs.test_kafka_to_sink_window import run_job
from tests.kafka_support import new_topic, transactional_producer

POISON = {"invalid-utf8": (b'{"n": "\xff\xfe"}', "not valid UTF-8"), "nul": (b'{"n": "a\x00b"}', "NUL character")}


@pytest.mark.parametrize(
    "sink,poison",
    [
        ("delta", "invalid-utf8"),
        ("postgres", "nul"),
        pytest.param("postgres", "invalid-utf8", marks=pytest.mark.matrix),
        pytest.param("files", "invalid-utf8", marks=pytest.mark.matrix),
        pytest.param("files-s3", "invalid-utf8", marks=pytest.mark.matrix),
    ],
)
def test_poison_record_stops_the_job_before_its_batch_is_committed(
    stack, spark, tmp_path, monkeypatch, capsys, sink, poison
):
    for key, value in jobs.pg_env(stack).items():
        monkeypatch.setenv(key, value)
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap)
    location = target_for(sink, tmp_path, topic, stack)
    s3 = stack.minio_settings() if sink == "files-s3" else None
    sink = sink.removesuffix("-s3")
    target = open_storage(location, s3) if sink == "files" else location
    pipeline = f"poison-{topic}"
    good = [(f"g{i}", json.dumps({"n": i, "committed": True})) for i in range(5)]
    value, reason = POISON[poison]
    producer = transactional_producer(bootstrap)
    for batch in (good, [("p0", b"{}"), ("p1", value), ("p2", b"{}")]):
        producer.begin_transaction()
        for key, record in batch:
            producer.produce(topic, record if isinstance(record, bytes) else record.encode(), key.encode())
        producer.flush(30)
        producer.commit_transaction(60)
    # offsets: 0-4 good, 5 commit marker, 6-8 second transaction (poison at 7), 9 commit marker
    args = jobs.job_args(
        stack, pipeline, topic, tmp_path / "checkpoint", sink, location, max_offsets=6, s3=s3.to_json() if s3 else None
    )

    with pytest.raises(Exception) as failure:
        run_job(args, capsys)
    message = str(failure.value)
    assert f"{topic}/0@7" in message and reason in message, message[-2000:]
    assert "Nothing of this batch was committed" in message
    state = sink_state(stack, sink, target, pipeline)
    assert state.offsets == {topic: {0: 6}} and state.rows_total == 5
    jobs.assert_exactly(jobs.sink_rows(stack, sink, target), good)
