"""The files sink's publish protocol on the stack's MinIO (a stand-in writes the Parquet part, not Spark; the
Spark job on MinIO is tests/integration/spark_jobs/test_kafka_to_sink.py[files-s3])."""

from __future__ import annotations

import json
import uuid

import pytest

from exactly_once_provider.sinks import files as files_module
from exactly_once_provider.sinks.base import BatchCommit, StaleBatchError
from exactly_once_provider.sinks.files import FilesSink, latest_manifest, newest_sequence, read_published, write_pointer
from exactly_once_provider.storage import open_storage
from exactly_once_provider.storage.s3 import S3Settings
from tests.storage_support import ParquetFrame


@pytest.fixture
def storage(stack, airflow_connections):
    storage = open_storage(
        f"s3://{stack.MINIO_BUCKETS[0]}/it-files-sink/{uuid.uuid4().hex}", S3Settings.from_connection("aws_default")
    )
    yield storage
    storage.delete_prefix("")


def _rows(storage) -> list[int]:
    table = read_published(storage)
    return sorted(table["n"].to_pylist()) if table is not None else []


def test_batches_publish_on_s3_a_replay_is_skipped_and_a_stale_writer_is_refused(storage, monkeypatch):
    sink = FilesSink(storage.uri(), "p", storage)
    assert sink.committed() is None
    assert sink.commit(ParquetFrame(storage, [1, 2]), BatchCommit("p", "c1", 0, {"t": {0: 2}}))
    stale = latest_manifest(storage)
    assert sink.commit(ParquetFrame(storage, [3]), BatchCommit("p", "c1", 1, {"t": {0: 3}}))
    assert not sink.commit(ParquetFrame(storage, [3]), BatchCommit("p", "c1", 1, {"t": {0: 3}}))  # replay
    # A zombie that read manifest 0 tries to publish sequence 1 as well: its put-if-absent is refused.
    monkeypatch.setattr(files_module, "latest_manifest", lambda root: stale)
    with pytest.raises(StaleBatchError, match="Manifest 1 of s3://.* was published by another writer"):
        sink.commit(ParquetFrame(storage, [7]), BatchCommit("p", "c2", 0, {"t": {0: 2}}))
    monkeypatch.undo()
    state = sink.committed()
    assert (state.batch_id, state.offsets, state.rows_total) == (1, {"t": {0: 3}}, 3)
    assert _rows(storage) == [1, 2, 3]  # the zombie's file is an orphan no manifest names
    orphans = sink.remove_orphans()
    assert len(orphans) == 1 and orphans[0].startswith("data/c2-0-")
    assert not storage.list(orphans[0] + "/") and _rows(storage) == [1, 2, 3]


def test_the_pointer_on_s3_is_verified_against_the_manifests(storage):
    sink = FilesSink(storage.uri(), "p", storage)
    for batch in range(3):
        sink.commit(ParquetFrame(storage, [batch]), BatchCommit("p", "c1", batch, {"t": {0: batch + 1}}))
    pointer = json.loads(storage.read("_manifests/_latest.json"))
    assert (pointer["sequence"], pointer["batch_id"]) == (2, 2)
    # A crash between manifest and pointer leaves the pointer behind: readers step forward to the newest.
    write_pointer(storage, json.loads(storage.read(f"_manifests/{0:020d}.json")))
    assert newest_sequence(storage) == (2, None) and sink.committed().batch_id == 2
    storage.delete("_manifests/_latest.json")  # no pointer at all: the manifests are listed
    assert newest_sequence(storage) == (2, None) and _rows(storage) == [0, 1, 2]
