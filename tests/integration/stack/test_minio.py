"""MinIO answers through Airflow's standard ``aws`` connection and honours conditional writes."""

from __future__ import annotations

import uuid

import pytest
from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from botocore.exceptions import ClientError


def test_the_aws_connection_reaches_minio_and_a_second_put_if_absent_is_refused(stack, airflow_connections):
    client = S3Hook(aws_conn_id="aws_default").get_conn()
    assert client.meta.endpoint_url == stack.minio_endpoint()  # endpoint_url from the connection's extra
    bucket, key = stack.MINIO_BUCKETS[0], f"it/{uuid.uuid4().hex}"
    client.put_object(Bucket=bucket, Key=key, Body=b"first", IfNoneMatch="*")
    try:
        with pytest.raises(ClientError) as refused:
            client.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
        assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == b"first"
    finally:
        client.delete_object(Bucket=bucket, Key=key)


def test_every_bucket_the_tests_use_exists_and_the_round_trip_reports(stack):
    client = stack.minio_client()
    assert set(stack.MINIO_BUCKETS) <= {b["Name"] for b in client.list_buckets()["Buckets"]}
    assert "refused a second put-if-absent" in stack.minio_round_trip()


def test_minio_keeps_its_credentials_off_the_command_line(stack):
    pid = stack.MINIO.pid()
    assert pid is not None
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        arguments = cmdline.read().decode()
    assert stack.MINIO_SECRET_KEY not in arguments and stack.MINIO_ACCESS_KEY not in arguments
