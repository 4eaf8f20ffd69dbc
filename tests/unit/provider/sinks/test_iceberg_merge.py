"""The Iceberg keyed modes' plain-Python parts: how file names are compared, which small files join a rewrite (the
merges themselves are in integration)."""

from __future__ import annotations

from types import SimpleNamespace

from exactly_once_provider.sinks import iceberg_merge
from exactly_once_provider.sinks.iceberg_merge import SMALL_FILE_BYTES, SMALL_FILES_TOTAL_BYTES
from exactly_once_provider.storage import comparable_location as normalised


def test_spark_and_manifest_names_of_one_file_compare_equal():
    # Spark's _metadata.file_path vs the manifest's location of the same file
    assert normalised("file:/tmp/t/data/a%20b.parquet") == normalised("file:///tmp/t/data/a b.parquet")
    assert normalised("/tmp/t/data/x.parquet") == "/tmp/t/data/x.parquet"
    assert (
        normalised("s3a://lake/t/data/x.parquet") == normalised("s3://lake/t/data/x.parquet") == "lake/t/data/x.parquet"
    )
    assert normalised("s3://lake/t/data/x.parquet") != normalised("s3://other/t/data/x.parquet")


def _file(name: str, size: int):
    return SimpleNamespace(file_path=name, file_size_in_bytes=size)


def test_small_untouched_files_join_a_rewrite_smallest_first_up_to_the_total():
    touched = [_file("touched", 50 << 20)]
    mb = 1 << 20
    files = [_file("c", 3 * mb), _file("limit", SMALL_FILE_BYTES), _file("a", 1 * mb), _file("b", 2 * mb)]
    chosen = iceberg_merge.with_small_files(touched, [*touched, *files])
    assert [f.file_path for f in chosen] == ["touched", "a", "b", "c"], "a file of the threshold's size is not small"
    many = [_file(f"s{n}", 3 * mb) for n in range(8)]  # 8 x 3 MB: 5 fit in the total
    chosen = iceberg_merge.with_small_files([], many)
    assert len(chosen) == 5 and sum(f.file_size_in_bytes for f in chosen) <= SMALL_FILES_TOTAL_BYTES
    assert iceberg_merge.with_small_files([], []) == []
