"""The local stack's S3 parts without starting anything: the pinned MinIO, its connection, the s3a jar pin."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import STACK


def test_minio_is_pinned_to_one_module_version_and_cached_per_version():
    assert re.fullmatch(r"v\d+\.\d+\.\d+-\d{14}-[0-9a-f]{12}", STACK.MINIO_VERSION)
    assert STACK.minio_binary.__doc__ and "go install" in STACK.minio_binary.__doc__
    assert "minio" in STACK.SERVICES  # `make stack-up` (and so CI) builds and starts it


def test_the_aws_connection_points_at_minio_with_its_endpoint_in_the_extra():
    conn = json.loads(STACK.connection_env()["AIRFLOW_CONN_AWS_DEFAULT"])
    assert conn["conn_type"] == "aws" and conn["login"] == STACK.MINIO_ACCESS_KEY
    assert conn["extra"]["endpoint_url"] == f"http://127.0.0.1:{STACK.MINIO_PORT}"


def test_hadoop_aws_must_match_pysparks_hadoop(monkeypatch):
    STACK._check_hadoop_version()  # the pom's pin matches the installed pyspark
    monkeypatch.setattr(STACK, "_pom_property", lambda name: "9.9.9")
    with pytest.raises(RuntimeError, match=r"pins hadoop-aws 9.9.9: set <hadoop.version> to pyspark's Hadoop"):
        STACK._check_hadoop_version()
