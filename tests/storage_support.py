"""Helpers for storage tests: writers racing to create one key."""

from __future__ import annotations

import threading
from collections.abc import Callable


def race_put_if_absent(storage_for_writer: Callable[[], object], key: str, writers: int) -> list[int]:
    """Let ``writers`` threads put-if-absent ``key`` at once (each its own storage object); return the winners.

    :param storage_for_writer: makes the storage one writer uses (separate clients, as separate drivers have).
    """
    results: list[tuple[int, bool]] = []
    barrier = threading.Barrier(writers)

    def write(n: int) -> None:
        own = storage_for_writer()
        barrier.wait()
        results.append((n, own.put_if_absent(key, str(n).encode())))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == writers, "a writer failed instead of answering"
    return [n for n, won in results if won]


def check_put_read_list_delete(storage) -> None:
    """The storage contract every backend keeps: overwrite, read, exists, list by prefix, delete, delete_prefix."""
    for key in (
        "_manifests/00.json",
        "_manifests/01.json",
        "data/x/part-0.parquet",
        "data/x/part-1.parquet",
        "data-other.txt",
    ):
        storage.put(key, key.encode())
    storage.put("_manifests/01.json", b"replaced")
    assert storage.read("_manifests/01.json") == b"replaced" and storage.read("missing") is None
    assert storage.exists("data/x/part-0.parquet") and not storage.exists("data/x")
    assert storage.list("_manifests/") == ["_manifests/00.json", "_manifests/01.json"]
    assert storage.list("data") == ["data-other.txt", "data/x/part-0.parquet", "data/x/part-1.parquet"]  # a prefix
    assert storage.list("nowhere/") == []
    assert storage.list("_manifests/", start_after="_manifests/00") == ["_manifests/00.json", "_manifests/01.json"]
    assert storage.list("_manifests/", start_after="_manifests/00.json") == ["_manifests/01.json"]
    assert storage.list("data", start_after="data/x/part-0.parquet") == ["data/x/part-1.parquet"]
    storage.delete("_manifests/00.json")
    storage.delete("_manifests/00.json")  # missing: no error
    assert storage.list("_manifests/") == ["_manifests/01.json"]
    storage.delete_prefix("data/x/")
    assert storage.list("data") == ["data-other.txt"]


class ParquetFrame:
    """Stands in for a Spark DataFrame: ``write.mode(m).parquet(uri)`` puts ``rows`` as one Parquet part object
    (plus ``_SUCCESS``, and what a failed task attempt can leave under ``_temporary/``) through ``storage``."""

    def __init__(self, storage, rows: list[int]):
        self.storage, self.rows, self.write = storage, rows, self

    def mode(self, _mode):
        return self

    def parquet(self, uri: str):
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        buffer = io.BytesIO()
        pq.write_table(pa.table({"n": self.rows}), buffer)
        folder = uri.removeprefix(self.storage.spark_uri() + "/")
        self.storage.put(f"{folder}/part-00000-x.snappy.parquet", buffer.getvalue())
        self.storage.put(f"{folder}/_SUCCESS", b"")
        self.storage.put(f"{folder}/_temporary/0/task_1/part-00001-y.snappy.parquet", buffer.getvalue())
