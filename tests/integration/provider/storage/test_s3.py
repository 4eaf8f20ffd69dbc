"""S3 storage on the stack's MinIO: put-if-absent under a race, list/read/delete, and preflight's errors."""

from __future__ import annotations

import dataclasses
import socket
import time
import uuid

import pytest

from exactly_once_provider.errors import ServiceAccessError
from exactly_once_provider.storage import open_storage
from exactly_once_provider.storage.preflight import PROBE_PREFIX, preflight
from exactly_once_provider.storage.s3 import S3Settings, S3Storage
from tests.storage_support import check_put_read_list_delete, race_put_if_absent


@pytest.fixture
def settings(stack, airflow_connections) -> S3Settings:
    return S3Settings.from_connection("aws_default")


@pytest.fixture
def storage(stack, settings):
    root = f"s3://{stack.MINIO_BUCKETS[0]}/it-storage/{uuid.uuid4().hex}"
    storage = open_storage(root, settings)
    yield storage
    for key in storage.list():
        storage.delete(key)


def test_settings_come_from_the_aws_connection(stack, settings):
    assert settings.endpoint_url == stack.minio_endpoint()
    assert settings.access_key_id == stack.MINIO_ACCESS_KEY and settings.secret_access_key == stack.MINIO_SECRET_KEY
    assert (settings.region_name, settings.addressing_style) == (stack.MINIO_REGION, "path")


def test_of_racing_writers_of_one_key_exactly_one_wins(storage):
    winners = race_put_if_absent(
        lambda: S3Storage(storage.uri(), storage.settings), "_manifests/00000000000000000001.json", 6
    )
    assert len(winners) == 1
    assert storage.read("_manifests/00000000000000000001.json") == str(winners[0]).encode()


def test_put_read_list_delete(storage):
    check_put_read_list_delete(storage)


def test_preflight_passes_on_minio_and_leaves_nothing(storage):
    assert "a second put-if-absent refused" in preflight(storage)
    assert storage.list() == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            "endpoint",
            r"Cannot reach the S3 endpoint http://127.0.0.1:\d+ of AWS connection 'aws_default'.*endpoint_url",
        ),
        ("secret", r"refused the credentials of AWS connection 'aws_default'.*password \(secret access key\)"),
        ("bucket", r"Bucket 'eo-missing-\w+' does not exist at http://127.0.0.1:\d+ .*create it"),
    ],
)
def test_preflight_names_what_to_fix_and_writes_nothing(stack, settings, storage, change, message):
    root, bad = storage.uri(), settings
    if change == "endpoint":
        bad = dataclasses.replace(settings, endpoint_url=f"http://127.0.0.1:{_free_port()}")
    elif change == "secret":
        bad = dataclasses.replace(settings, secret_access_key="not-the-secret")
    else:
        root = f"s3://eo-missing-{uuid.uuid4().hex[:8]}/x"
    started = time.monotonic()
    with pytest.raises(ServiceAccessError, match=message):
        preflight(open_storage(root, bad))
    assert time.monotonic() - started < 60
    assert storage.list() == [] and not storage.list(PROBE_PREFIX)
