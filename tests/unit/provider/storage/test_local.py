"""Local storage: put-if-absent, overwrite, read, list by prefix, delete; and the location dispatch."""

from __future__ import annotations

import pytest

from exactly_once_provider.storage import Storage, is_s3, open_storage
from exactly_once_provider.storage.local import LocalStorage
from tests.storage_support import check_put_read_list_delete, race_put_if_absent


def test_put_if_absent_creates_once_and_never_overwrites(tmp_path):
    storage = open_storage(str(tmp_path / "root"))
    assert isinstance(storage, LocalStorage) and isinstance(storage, Storage)
    assert storage.put_if_absent("a/b.json", b"one")
    assert not storage.put_if_absent("a/b.json", b"two")
    assert storage.read("a/b.json") == b"one"
    assert storage.list() == ["a/b.json"]  # no temporary file left


def test_of_racing_writers_of_one_key_exactly_one_wins(tmp_path):
    storage = LocalStorage(tmp_path)
    winners = race_put_if_absent(lambda: LocalStorage(tmp_path), "commit/0001.json", 8)
    assert len(winners) == 1 and storage.read("commit/0001.json") == str(winners[0]).encode()


def test_put_read_exists_list_delete(tmp_path):
    storage = open_storage(f"file://{tmp_path}")
    check_put_read_list_delete(storage)
    assert not (tmp_path / "data" / "x").exists()  # delete_prefix removes the emptied folder too
    assert storage.uri("data/x") == str(tmp_path / "data" / "x") == storage.spark_uri("data/x")


@pytest.mark.parametrize("key", ["/etc/passwd", "../outside", "a/../../b"])
def test_keys_stay_below_the_root(tmp_path, key):
    with pytest.raises(ValueError, match="stays below its root"):
        LocalStorage(tmp_path).put(key, b"x")


def test_locations_are_dispatched_by_scheme(tmp_path, monkeypatch):
    assert is_s3("s3://b/p") and is_s3("s3a://b/p") and not is_s3(str(tmp_path))
    with pytest.raises(ValueError, match="no S3 settings were given: name the `aws` Airflow connection"):
        open_storage("s3://bucket/prefix")
    with pytest.raises(ValueError, match="Unsupported storage location 'gs://b/p'"):
        open_storage("gs://b/p")
    with pytest.raises(ValueError, match="A storage location is required"):
        open_storage("")
