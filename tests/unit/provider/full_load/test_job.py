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


def test_a_table_is_sized_into_one_wave_of_a_chunk_per_core_up_to_the_largest_chunk():
    from exactly_once_provider.full_load.job import MAX_AUTO_CHUNK_ROWS, MIN_AUTO_CHUNK_ROWS, auto_chunk_rows

    assert auto_chunk_rows(0, 2) == auto_chunk_rows(150_000, 2) == MIN_AUTO_CHUNK_ROWS  # one or two small chunks
    assert auto_chunk_rows(1_000_000, 2) == 500_000  # two chunks, one wave
    assert auto_chunk_rows(5_000_000, 2) == MAX_AUTO_CHUNK_ROWS  # still one wave
    assert auto_chunk_rows(10_000_000, 2) == 2_500_000  # two waves of two chunks
    assert auto_chunk_rows(10_000_001, 2) == 1_666_667  # three waves of two: chunks shrink to even out
    assert auto_chunk_rows(1_000_000, 8) == 125_000


def _load(table: str, chunks: int, estimated_rows: int, chunk_rows: int = 300, per_job: int = 2):
    from exactly_once_provider.full_load.job import FullLoadRequest, _TableLoad

    request = FullLoadRequest(schema="s", table=table, sink_path=f"/lake/{table}")
    manifest = {"chunks": [{"index": i} for i in range(chunks)], "done": {}}
    return _TableLoad(
        request, None, manifest, [], True, manifest["chunks"], 0, 0.0, estimated_rows, chunk_rows, per_job
    )


def test_small_tables_share_a_wave_and_a_big_one_takes_chunks_per_job_a_wave():
    from exactly_once_provider.full_load.job import MAX_CHUNKS_PER_WAVE, _waves

    loads = {0: _load("words", 1, 40), 1: _load("one", 1, 1), 2: _load("pairs", 2, 450), 3: _load("busy", 4, 1199)}
    queue = [(i, chunk) for i, load in loads.items() for chunk in load.pending]
    waves = [[(i, c["index"]) for i, c in wave] for wave in _waves(queue, loads)]
    # 40 + 1 + 300 + 150 expected rows fit 2 x 300; busy's chunks (300 each, 299 the last) two a wave
    assert waves == [[(0, 0), (1, 0), (2, 0), (2, 1)], [(3, 0), (3, 1)], [(3, 2), (3, 3)]]
    empties = {i: _load(f"t{i}", 1, 0) for i in range(100)}  # a row estimate of 0 still costs a chunk slot
    cut = _waves([(i, load.pending[0]) for i, load in empties.items()], empties)
    assert [len(w) for w in cut] == [MAX_CHUNKS_PER_WAVE, 100 - MAX_CHUNKS_PER_WAVE]
