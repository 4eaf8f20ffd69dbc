"""The files sink's publish protocol with a stand-in for Spark's Parquet writer (the real one is in integration)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactly_once_provider.sinks import files as files_module
from exactly_once_provider.sinks.base import BatchCommit, StaleBatchError
from exactly_once_provider.sinks.files import (
    POINTER,
    FilesSink,
    latest_manifest,
    newest_sequence,
    published_files,
    write_pointer,
)
from exactly_once_provider.storage.local import LocalStorage


class _Frame:
    """Writes ``rows`` as one Parquet part file, like ``df.write.mode(m).parquet(path)`` would."""

    def __init__(self, rows: list[int]):
        self.rows = rows
        self.write = self

    def mode(self, _mode):
        return self

    def parquet(self, path):
        os.makedirs(path)
        pq.write_table(pa.table({"n": self.rows}), os.path.join(path, "part-00000-x.snappy.parquet"))


def _read(root) -> list[int]:
    return sorted(n for f in published_files(str(root)) for n in pq.read_table(f)["n"].to_pylist())


def test_batches_publish_cumulative_manifests_and_a_replay_is_skipped(tmp_path):
    sink = FilesSink(str(tmp_path), "p")
    assert sink.committed() is None
    assert sink.commit(_Frame([1, 2]), BatchCommit("p", "c1", 0, {"t": {0: 2}}))
    assert sink.commit(_Frame([3]), BatchCommit("p", "c1", 1, {"t": {0: 3}}))
    assert not sink.commit(_Frame([3]), BatchCommit("p", "c1", 1, {"t": {0: 3}}))  # replay
    state = sink.committed()
    assert (state.checkpoint_id, state.batch_id, state.offsets, state.rows_total) == ("c1", 1, {"t": {0: 3}}, 3)
    assert latest_manifest(str(tmp_path))["sequence"] == 1
    assert _read(tmp_path) == [1, 2, 3]


def test_orphans_of_a_crash_are_invisible_then_removed(tmp_path):
    sink = FilesSink(str(tmp_path), "p")
    sink.commit(_Frame([1]), BatchCommit("p", "c1", 0, {"t": {0: 1}}))
    _Frame([9]).parquet(str(tmp_path / "data" / "c1-1-dead"))  # written, manifest never published
    _Frame([8]).parquet(str(tmp_path / "_staging" / "c1-1-beef"))  # staged by a version before the storage layer
    assert _read(tmp_path) == [1]
    assert sink.remove_orphans() == ["data/c1-1-dead"]
    assert not (tmp_path / "_staging").exists()
    assert _read(tmp_path) == [1]


def test_a_second_writer_cannot_publish_the_same_sequence(tmp_path, monkeypatch):
    sink = FilesSink(str(tmp_path), "p")
    sink.commit(_Frame([1]), BatchCommit("p", "c1", 0, {"t": {0: 1}}))
    stale = latest_manifest(str(tmp_path))
    sink.commit(_Frame([2]), BatchCommit("p", "c1", 1, {"t": {0: 2}}))
    # A zombie that read the manifest before the commit above tries to publish sequence 1 as well.
    monkeypatch.setattr("exactly_once_provider.sinks.files.latest_manifest", lambda root: stale)
    with pytest.raises(StaleBatchError, match="Manifest 1 of .* was published by another writer"):
        sink.commit(_Frame([7]), BatchCommit("p", "c2", 0, {"t": {0: 2}}))
    monkeypatch.undo()
    assert _read(tmp_path) == [1, 2]


def test_a_zombie_of_an_older_checkpoint_cannot_publish_on_top_of_the_newer_driver(tmp_path):
    sink = FilesSink(str(tmp_path), "p")
    sink.commit(_Frame([1]), BatchCommit("p", "c1", 0, {"t": {0: 1}}), expected=None)
    planned_on = sink.committed()  # the zombie (checkpoint c1) planned batch 1 on this, then stalled
    sink.commit(_Frame([2, 3]), BatchCommit("p", "c2", 0, {"t": {0: 3}}), expected=planned_on)  # the next run
    with pytest.raises(
        StaleBatchError, match="planned on batch 0 of checkpoint c1 .* now holds batch 0 of checkpoint c2"
    ):
        sink.commit(_Frame([2]), BatchCommit("p", "c1", 1, {"t": {0: 2}}), expected=planned_on)
    assert _read(tmp_path) == [1, 2, 3] and latest_manifest(str(tmp_path))["sequence"] == 1
    assert not (tmp_path / "_staging").exists() or not any((tmp_path / "_staging").iterdir())


def test_a_root_of_another_pipeline_is_refused(tmp_path):
    FilesSink(str(tmp_path), "p").commit(_Frame([1]), BatchCommit("p", "c1", 0, {"t": {0: 1}}))
    with pytest.raises(ValueError, match="its own files sink directory"):
        FilesSink(str(tmp_path), "q").committed()


def _manifests(root) -> list[int]:
    return sorted(int(p.name.removesuffix(".json")) for p in (root / "_manifests").glob("[0-9]*.json"))


def _three_batches(root) -> FilesSink:
    sink = FilesSink(str(root), "p")
    for batch in range(3):
        sink.commit(_Frame([batch]), BatchCommit("p", "c1", batch, {"t": {0: batch + 1}}))
    return sink


def test_committed_reads_the_pointer_which_names_the_newest_manifest_and_its_commit(tmp_path, monkeypatch):
    sink = _three_batches(tmp_path)
    pointer = json.loads((tmp_path / "_manifests" / POINTER).read_text())
    assert (pointer["sequence"], pointer["batch_id"], pointer["offsets"]) == (2, 2, {"t": {"0": 3}})
    # committed() needs neither a listing nor the (cumulative) manifest while the pointer is current
    monkeypatch.setattr(LocalStorage, "list", lambda *a: pytest.fail("listed the manifests"))
    monkeypatch.setattr(files_module, "latest_manifest", lambda root: pytest.fail("read the manifest"))
    state = sink.committed()
    assert (state.batch_id, state.offsets, state.rows_total) == (2, {"t": {0: 3}}, 3)


def test_a_pointer_behind_its_manifests_is_stepped_forward(tmp_path):
    """A crash between publishing manifest n and writing the pointer leaves the pointer at n-1 (or older)."""
    sink = _three_batches(tmp_path)
    write_pointer(tmp_path, json.loads((tmp_path / "_manifests" / f"{0:020d}.json").read_text()))
    assert newest_sequence(tmp_path) == (2, None)
    assert sink.committed().batch_id == 2 and latest_manifest(str(tmp_path))["sequence"] == 2
    assert sink.commit(_Frame([3]), BatchCommit("p", "c1", 3, {"t": {0: 4}}))  # publishes 3, never over 2
    assert _manifests(tmp_path) == [0, 1, 2, 3] and _read(tmp_path) == [0, 1, 2, 3]
    assert newest_sequence(tmp_path)[0] == 3


@pytest.mark.parametrize("damage", ["missing", "names a removed manifest", "torn"])
def test_without_a_usable_pointer_the_manifests_are_listed(tmp_path, damage):
    sink = _three_batches(tmp_path)
    pointer = tmp_path / "_manifests" / POINTER
    if damage == "missing":  # a sink published before pointers existed
        pointer.unlink()
    elif damage == "torn":
        pointer.write_text('{"sequence": ')
    else:
        pointer.write_text(json.dumps({"sequence": 99}))
    assert newest_sequence(tmp_path) == (2, None)
    assert sink.committed().batch_id == 2 and _read(tmp_path) == [0, 1, 2]


def test_old_manifests_are_removed_keeping_the_newest(tmp_path, monkeypatch):
    monkeypatch.setattr(files_module, "KEEP_MANIFESTS", 2)
    sink = FilesSink(str(tmp_path), "p")
    for batch in range(5):
        sink.commit(_Frame([batch]), BatchCommit("p", "c1", batch, {"t": {0: batch + 1}}))
    assert _manifests(tmp_path) == [3, 4]
    assert _read(tmp_path) == [0, 1, 2, 3, 4] and sink.committed().batch_id == 4
