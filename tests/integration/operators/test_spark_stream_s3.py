"""SparkKafkaToSinkOperator with a files sink on S3 (the stack's MinIO): exact, a retry is a no-op, the
credentials stay off spark-submit's settings; an unusable S3 location fails before any job is submitted."""

from __future__ import annotations

import json
import sys
import uuid

import pytest

from exactly_once_provider.errors import ServiceAccessError
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.storage import open_storage
from exactly_once_provider.storage.s3 import S3Settings
from tests import spark_job_support as jobs
from tests.kafka_support import new_topic


def _operator(stack, tmp_path, **kwargs) -> SparkKafkaToSinkOperator:
    defaults = {
        "task_id": "stream",
        "checkpoint_location": str(tmp_path / "checkpoint"),
        "sink": "files",
        "conf": {**stack.spark_conf(s3=True), **jobs.s3_driver_conf(stack), "spark.ui.enabled": "false"},
        "env_vars": {"PYSPARK_PYTHON": sys.executable},
    }
    return SparkKafkaToSinkOperator(**{**defaults, **kwargs})


def test_files_sink_on_minio_is_exact_and_a_retry_is_a_no_op(stack, airflow_connections, tmp_path):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    location = f"s3://{stack.MINIO_BUCKETS[0]}/op-files/{topic}"
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=4, per_transaction=30, partitions=2)
    op = _operator(
        stack, tmp_path, pipeline=f"op-s3-{topic}", topics=[topic], sink_path=location, max_offsets_per_trigger=50
    )

    state = op.execute({})
    storage = open_storage(location, S3Settings.from_connection("aws_default"))
    assert state["rows_total"] == state["rows_this_run"] == len(committed)
    jobs.assert_exactly(jobs.files_rows(storage), committed)
    assert "_manifests/_latest.json" in storage.list("_manifests/")
    assert stack.MINIO_SECRET_KEY not in json.dumps(op._submit_settings, default=str)

    retry = op.execute({})
    assert retry["rows_this_run"] == 0 and retry["offsets"] == state["offsets"]
    jobs.assert_exactly(jobs.files_rows(storage), committed)


@pytest.mark.parametrize(
    ("connection", "bucket", "message"),
    [
        (
            {"login": "eo-minio", "password": "wrong-secret"},
            None,
            "refused the credentials of AWS connection 'aws_bad'",
        ),
        ({}, "eo-missing-bucket", "Bucket 'eo-missing-bucket' does not exist"),
    ],
)
def test_an_unusable_s3_location_fails_before_submitting(
    stack, airflow_connections, tmp_path, monkeypatch, connection, bucket, message
):
    good = json.loads(airflow_connections["AIRFLOW_CONN_AWS_DEFAULT"])
    monkeypatch.setenv("AIRFLOW_CONN_AWS_BAD", json.dumps({**good, **connection}))
    location = f"s3://{bucket or stack.MINIO_BUCKETS[0]}/op-bad/{uuid.uuid4().hex[:8]}"
    op = _operator(
        stack, tmp_path, pipeline="op-s3-bad", topics=["never-read"], sink_path=location, aws_conn_id="aws_bad"
    )
    with pytest.raises(ServiceAccessError, match=message):
        op.execute({})
    assert not (tmp_path / "checkpoint").exists()  # no job ran
    if bucket is None:
        assert open_storage(location, S3Settings.from_connection("aws_default")).list() == []


def test_delta_sink_and_checkpoint_on_minio_are_exact_and_a_retry_is_a_no_op(stack, airflow_connections, tmp_path):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    location = f"s3://{stack.MINIO_BUCKETS[0]}/op-delta/{topic}"
    checkpoint = f"s3://{stack.MINIO_BUCKETS[0]}/op-checkpoints/{topic}"
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=4, per_transaction=30, partitions=2)
    op = _operator(
        stack,
        tmp_path,
        pipeline=f"op-s3d-{topic}",
        topics=[topic],
        sink="delta",
        sink_path=location,
        checkpoint_location=checkpoint,
        max_offsets_per_trigger=50,
    )

    state = op.execute({})
    s3 = S3Settings.from_connection("aws_default")
    storage = open_storage(location, s3)
    assert state["rows_total"] == state["rows_this_run"] == len(committed)
    jobs.assert_exactly(jobs.delta_rows(storage), committed)
    assert open_storage(checkpoint, s3).list("offsets/"), "the checkpoint should be in the bucket"
    assert not (tmp_path / "checkpoint").exists()
    assert stack.MINIO_SECRET_KEY not in json.dumps(op._submit_settings, default=str)

    retry = op.execute({})
    assert retry["rows_this_run"] == 0 and retry["offsets"] == state["offsets"]
    jobs.assert_exactly(jobs.delta_rows(storage), committed)
    storage.delete_prefix("")
    open_storage(checkpoint, s3).delete_prefix("")
