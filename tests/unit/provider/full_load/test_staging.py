"""The full load's staging manifest on the storage layer: numbered, put-if-absent, fenced, legacy-readable."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.full_load import staging as staging_module
from exactly_once_provider.full_load.staging import Staging, StagingFencedError


def _manifest(done: dict) -> dict:
    return {"schema": "s", "table": "t", "done": done, "published": None}


def test_each_save_publishes_the_next_manifest_and_load_reads_the_newest(tmp_path, monkeypatch):
    monkeypatch.setattr(staging_module, "KEEP_MANIFESTS", 2)
    staging = Staging(str(tmp_path / "st"))
    assert staging.load() is None
    for n in range(4):
        staging.save(_manifest({str(i): {"data": f"c{i}.parquet"} for i in range(n)}))
    assert sorted(p.name for p in (tmp_path / "st" / "_manifests").iterdir()) == [f"{2:020d}.json", f"{3:020d}.json"]
    assert Staging(str(tmp_path / "st")).load()["done"].keys() == {"0", "1", "2"}


def test_a_second_loader_saving_on_top_of_the_same_manifest_is_fenced(tmp_path):
    first, second = Staging(str(tmp_path)), Staging(str(tmp_path))
    first.save(_manifest({}))
    first.load(), second.load()
    first.save(_manifest({"0": {"data": "a"}}))
    with pytest.raises(StagingFencedError, match="saved by another loader: two full loads of s.t run at once"):
        second.save(_manifest({"0": {"data": "b"}}))
    assert Staging(str(tmp_path)).load()["done"] == {"0": {"data": "a"}}


def test_a_load_staged_before_the_storage_layer_is_continued(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(_manifest({"0": {"data": "old"}})))
    staging = Staging(str(tmp_path))
    manifest = staging.load()
    assert manifest["done"] == {"0": {"data": "old"}}
    manifest["done"]["1"] = {"data": "new"}
    staging.save(manifest)
    assert not (tmp_path / "manifest.json").exists()
    assert Staging(str(tmp_path)).load()["done"].keys() == {"0", "1"}


def test_unlisted_staged_files_and_folders_are_removed_and_reset_forgets_the_load(tmp_path):
    staging = Staging(str(tmp_path / "st"))
    staging.save(_manifest({"0": {"data": "keep.parquet"}}))
    staging.data_dir.mkdir(parents=True)
    for name in ("keep.parquet", "crashed.parquet"):
        (staging.data_dir / name).write_bytes(b"x")
    (staging.data_dir / "retried").mkdir()
    (staging.data_dir / "retried" / "part").write_bytes(b"x")
    assert staging.remove_unlisted_files(staging.load()) == ["crashed.parquet", "retried"]
    assert sorted(p.name for p in staging.data_dir.iterdir()) == ["keep.parquet"]
    staging.reset()
    assert staging.load() is None and not (tmp_path / "st").exists()
    staging.save(_manifest({}))  # a new load starts at sequence 0 again
    assert (tmp_path / "st" / "_manifests" / f"{0:020d}.json").exists()
