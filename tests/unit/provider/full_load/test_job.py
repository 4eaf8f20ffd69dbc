"""The publish's check of the staged files against the staging manifest (local staging; S3 in the integration
tests): a file missing, truncated or unreadable is refused with the same clear error."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactly_once_provider.full_load.job import _can_adopt, _staged_files
from exactly_once_provider.full_load.staging import Staging
from exactly_once_provider.sinks.delta_commit import CommitMarkerError


@pytest.fixture
def staged(tmp_path):
    staging = Staging(str(tmp_path / "t._eo_full_load"))
    staging.data_dir.mkdir(parents=True)
    done = {}
    for index in range(2):
        name = f"{'a' * 32}-c{index:06d}-{'b' * 12}.parquet"
        pq.write_table(pa.table({"id": list(range(index * 10, index * 10 + 10))}), staging.data_dir / name)
        done[str(index)] = {"data": name, "bytes": (staging.data_dir / name).stat().st_size, "rows": 10}
    return staging, str(tmp_path / "t"), done


def test_every_listed_file_is_returned_where_spark_reads_it(staged):
    staging, sink, done = staged
    assert _staged_files(staging, sink, done) == {e["data"]: str(staging.data_dir / e["data"]) for e in done.values()}


@pytest.mark.parametrize(
    "damage,problem",
    [
        (lambda path: path.unlink(), "is missing"),
        (lambda path: path.write_bytes(path.read_bytes()[:-7]), r"has \d+ bytes, not \d+"),
        (lambda path: path.write_bytes(b"x" * path.stat().st_size), r"is not a readable Parquet file"),
    ],
)
def test_a_damaged_staged_file_is_refused_naming_it_and_the_staging_area(staged, damage, problem):
    staging, sink, done = staged
    damage(staging.data_dir / done["1"]["data"])
    with pytest.raises(
        CommitMarkerError,
        match=rf"Staged file {done['1']['data']} of chunk 1 {problem}.*: the "
        rf"staging area {staging.root} is damaged; rerun with full_reload",
    ):
        _staged_files(staging, sink, done)


def test_a_file_holding_other_rows_than_recorded_is_refused(staged):
    staging, sink, done = staged
    done["0"]["rows"] = 11
    with pytest.raises(CommitMarkerError, match="of chunk 0 holds 10 rows, not 11"):
        _staged_files(staging, sink, done)


def test_a_new_table_whose_parent_folders_do_not_exist_yet_adopts_the_staged_files(staged, tmp_path):
    staging, _, _ = staged
    sink = tmp_path / "lake" / "eo" / "t"  # neither lake/ nor lake/eo/ exists; the staging area is elsewhere
    assert _can_adopt(str(sink), staging, "a" * 32) and not (tmp_path / "lake").exists()
