"""The handoff marker: built from chunk positions, parsed back, and the capture's drop rule."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.full_load import handoff
from exactly_once_provider.positions import BinlogPosition

CHUNKS = [
    {"index": 1, "lower": [100], "upper": None, "file": "binlog.000002", "pos": 10, "rows": 5},
    {"index": 0, "lower": None, "upper": [100], "file": "binlog.000001", "pos": 900, "rows": 100},
]


def test_marker_round_trip_and_min_max():
    marker = json.loads(json.dumps(handoff.marker("L1", "eo", "t", ("id",), CHUNKS)))
    body = marker["eo_full_load"]
    assert body["min_position"] == {"file": "binlog.000001", "pos": 900}
    assert body["max_position"] == {"file": "binlog.000002", "pos": 10}
    assert [c["index"] for c in body["chunks"]] == [0, 1] and body["rows"] == 105
    parsed = handoff.parse(4, marker)
    assert parsed.min_position == BinlogPosition("binlog.000001", 900)
    assert parsed.max_position == BinlogPosition("binlog.000002", 10)
    assert (parsed.table_version, parsed.rows, parsed.key) == (4, 105, ("id",))


def test_the_marker_records_the_version_base_and_server_and_older_markers_mean_base_zero():
    marker = json.loads(json.dumps(handoff.marker("L1", "eo", "t", ("id",), CHUNKS, version_base=2**40, server_id=102)))
    parsed = handoff.parse(0, marker)
    assert (parsed.version_base, parsed.server_id) == (2**40, 102)
    assert parsed.min_version == BinlogPosition("binlog.000001", 900).version + 2**40
    assert parsed.chunk_version(parsed.chunks[1]) == BinlogPosition("binlog.000002", 10).version + 2**40
    older = handoff.marker("L0", "eo", "t", ("id",), CHUNKS)
    for key in ("version_base", "server_id"):
        del older["eo_full_load"][key]
    assert (handoff.parse(0, older).version_base, handoff.parse(0, older).server_id) == (0, None)


def test_the_capture_filter_uses_the_position_of_the_chunk_holding_the_key():
    from exactly_once_provider.capture.loop import HandoffFilter

    h = HandoffFilter({("eo", "t"): handoff.parse(0, handoff.marker("L1", "eo", "t", ("id",), CHUNKS))})
    # chunk 0 holds keys <= 100 (snapshotted at binlog.000001:900); chunk 1 the rest (binlog.000002:10)
    assert h.already_loaded(("eo", "t"), (100,), BinlogPosition("binlog.000001", 900))
    assert h.already_loaded(("eo", "t"), (101,), BinlogPosition("binlog.000002", 10))
    assert not h.already_loaded(("eo", "t"), (101,), BinlogPosition("binlog.000002", 11))
    assert h.already_loaded(("eo", "t"), (5,), BinlogPosition("binlog.000001", 900))
    assert not h.already_loaded(("eo", "t"), (5,), BinlogPosition("binlog.000001", 901))
    assert h.already_loaded(("eo", "t"), (500,), BinlogPosition("binlog.000001", 5000))
    assert not h.already_loaded(("eo", "t"), (500,), BinlogPosition("binlog.000002", 11))


def _loaded(chunks, key=("id",)):
    return handoff.parse(0, handoff.marker("L1", "eo", "t", key, chunks))


def _chunk(index, lower, upper, pos):
    return {"index": index, "lower": lower, "upper": upper, "file": "binlog.000001", "pos": pos, "rows": 1}


def test_the_apply_bound_is_the_snapshot_version_of_the_chunk_holding_an_integer_key():
    def v(pos):
        return BinlogPosition("binlog.000001", pos).version

    loaded = _loaded(
        [
            _chunk(0, None, [100], 500),
            _chunk(1, [100], [200], 900),
            _chunk(2, [200], [300], 900),
            _chunk(3, [300], [400], 700),
            _chunk(4, [400], None, 700),
        ]
    )
    # neighbours of one snapshot share a branch; the last ones go to ELSE
    assert loaded.snapshot_version_sql("`id`") == (
        f"(CASE WHEN `id` <= 100 THEN {v(500)} WHEN `id` <= 300 THEN {v(900)} ELSE {v(700)} END)"
    )
    assert _loaded([_chunk(0, None, [5], 500), _chunk(1, [5], None, 500)]).snapshot_version_sql("k") == str(v(500))


@pytest.mark.parametrize(
    "key, bounds", [(("name",), (["m"],)), (("a", "b"), ([1, 2],)), (("amount",), ([{"dec": "1.5"}],))]
)
def test_keys_spark_may_order_unlike_the_server_get_the_oldest_snapshot(key, bounds):
    loaded = _loaded([_chunk(0, None, bounds[0], 900), _chunk(1, bounds[0], None, 500)], key)
    assert (
        loaded.snapshot_version_sql("`k`")
        == str(loaded.min_version)
        == str(BinlogPosition("binlog.000001", 500).version)
    )


def test_unknown_format_is_refused():
    marker = handoff.marker("L1", "eo", "t", ("id",), CHUNKS)
    marker["eo_full_load"]["format"] = 99
    with pytest.raises(ValueError, match="Unknown full-load handoff format"):
        handoff.parse(0, marker)


def test_missing_handoff_says_to_run_the_load(tmp_path):
    with pytest.raises(LookupError, match="run the full load"):
        handoff.read_handoff(str(tmp_path / "nothing"))


def _commit(table, version: int, marker: dict) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text(json.dumps({"commitInfo": {"userMetadata": json.dumps(marker)}}) + "\n")


def test_stream_commits_point_to_their_full_load_which_survives_log_cleanup_in_the_staging_manifest(tmp_path):
    from exactly_once_provider.full_load.staging import Staging
    from exactly_once_provider.sinks.current_table import full_load_pointer

    table, staging = tmp_path / "t", str(tmp_path / "t._eo_full_load")
    loaded = handoff.marker("L1", "eo", "t", ("id",), CHUNKS, staging=staging)
    _commit(table, 0, loaded)
    for version in range(1, 40):  # a stream's commits: each carries the pointer; readers stop at the newest
        _commit(table, version, {"eo_stream:p-apply": {"batch_id": version, "full_load": full_load_pointer(0, loaded)}})
    assert handoff.read_handoff(str(table)) == handoff.parse(0, loaded)

    (table / "_delta_log" / f"{0:020d}.json").unlink()  # Delta's log cleanup removed the full load's commit
    with pytest.raises(Exception, match="Run a full_reload"):
        handoff.read_handoff(str(table))
    Staging(staging).save({"published": {"table_version": 0, "marker": loaded}})
    assert handoff.read_handoff(str(table)) == handoff.parse(0, loaded)

    reloaded = handoff.marker("L2", "eo", "t", ("id",), CHUNKS, staging=staging)
    _commit(table, 40, reloaded)  # a full reload: newest wins
    assert handoff.read_handoff(str(table)).load_id == "L2" and handoff.has_full_load(str(table))
    assert not handoff.has_full_load(str(tmp_path / "nothing"))
