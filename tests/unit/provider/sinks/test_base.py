"""The sink contract: one dispatch, the replay and window-version rules, a reader side without Spark."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exactly_once_provider.sinks.base import (
    BatchCommit,
    Sink,
    newer_version,
    open_sink,
    replayed,
    require_newer_windows,
)
from exactly_once_provider.sinks.delta import DeltaSink
from exactly_once_provider.sinks.files import FilesSink
from exactly_once_provider.sinks.postgres import OFFSETS_TABLE, PostgresSink


def test_open_sink_is_the_one_dispatch(tmp_path):
    delta = open_sink("delta", str(tmp_path / "d"), "p", mode="cdc", commit_with="delta")
    assert isinstance(delta, DeltaSink) and (delta.mode, delta.commit_with) == ("cdc", "delta")
    assert isinstance(open_sink("files", str(tmp_path / "f"), "p"), FilesSink)
    asked = []
    pg = open_sink(
        "postgres",
        "",
        "p",
        postgres_connect=lambda: asked.append(1) or {"host": "h"},
        postgres_conn_id="pg",
        mode="window",
    )
    assert isinstance(pg, PostgresSink) and pg.connect_kwargs == {"host": "h"} and pg.mode == "window"
    assert pg.commit_location() == f"{OFFSETS_TABLE} (pg)" and asked == [1]
    open_sink("files", str(tmp_path / "f"), "p", postgres_connect=lambda: asked.append(2))
    assert asked == [1]  # the connection is resolved for a postgres sink only
    iceberg = open_sink("iceberg", "lake.t", "p", postgres_connect=lambda: asked.append(3))
    assert iceberg.kind == "iceberg" and asked == [1]
    for sink in (delta, pg, iceberg):
        assert isinstance(sink, Sink)
    with pytest.raises(ValueError, match="sink must be one of delta, postgres, files, iceberg, got 'kafka'"):
        open_sink("kafka", "x", "p")


def test_the_reader_side_imports_no_spark(tmp_path):
    (tmp_path / "_manifests").mkdir()
    manifest = {
        "format": 1,
        "sequence": 0,
        "pipeline": "p",
        "checkpoint_id": "c",
        "batch_id": 0,
        "offsets": {"t": {"0": 5}},
        "rows_total": 5,
        "files": [],
    }
    (tmp_path / "_manifests" / f"{0:020d}.json").write_text(json.dumps(manifest))
    code = (
        "import sys\n"
        "from exactly_once_provider.sinks.base import open_sink\n"
        f"f = open_sink('files', {str(tmp_path)!r}, 'p')\n"
        "assert f.committed().offsets == {'t': {0: 5}} and f.published_windows() == {}\n"
        f"d = open_sink('delta', {str(tmp_path / 'none')!r}, 'p')\n"
        "assert d.committed() is None and d.published_windows() == {} and d.commit_location() == ''\n"
        "open_sink('postgres', 't', 'p')\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'delta')], sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_replayed_batch_is_one_of_the_same_checkpoint_at_or_before_the_sink():
    held = BatchCommit("p", "c1", 4, {"t": {0: 9}})
    assert replayed(held, BatchCommit("p", "c1", 4, {"t": {0: 9}}))
    assert replayed(held, BatchCommit("p", "c1", 3, {"t": {0: 7}}))
    assert not replayed(held, BatchCommit("p", "c1", 5, {"t": {0: 11}}))
    assert not replayed(held, BatchCommit("p", "c2", 0, {"t": {0: 11}}))  # a new checkpoint restarts at 0
    assert not replayed(None, BatchCommit("p", "c1", 0, {}))


def test_only_a_newer_window_version_wins():
    assert newer_version(1, None) and newer_version(3, 2)
    assert not newer_version(2, 2) and not newer_version(1, 2)
    require_newer_windows({"w1": 3, "w2": 1}, {"w1": 2})
    with pytest.raises(ValueError, match="window w1 v2 is not newer than the table's v2"):
        require_newer_windows({"w1": 2}, {"w1": 2})
