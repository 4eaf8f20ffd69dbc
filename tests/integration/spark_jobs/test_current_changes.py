"""The current table's change step (spark_jobs/current_changes.typed_changes) on real Spark: which changes a
full load's snapshot already holds, per chunk of an integer key."""

from __future__ import annotations

import json

from exactly_once_provider.full_load import handoff
from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.sinks.current_table import VERSION_COLUMN, quoted
from exactly_once_provider.spark_jobs.current_changes import typed_changes

COLUMNS = [Column("id", "int", "int(11)", 10, 0), Column("v", "varchar", "varchar(10)", None, None)]


def _version(pos: int) -> int:
    return BinlogPosition("binlog.000001", pos).version


def _record(offset: int, key: int, pos: int, op: str = "u") -> tuple:
    image = {"id": key, "v": f"{key}@{pos}"}
    value = {
        "source": {"schema": "eo", "table": "t"},
        "version": _version(pos),
        "op": op,
        "before" if op == "d" else "after": image,
    }
    return json.dumps(value), "topic", 0, offset


def test_a_change_older_than_the_snapshot_of_its_own_chunk_is_left_out(spark):
    # keys <= 100 were read in a snapshot at position 500, the others at 900 (a later wave)
    loaded = handoff.parse(
        0,
        handoff.marker(
            "L1",
            "eo",
            "t",
            ("id",),
            [
                {"index": 0, "lower": None, "upper": [100], "file": "binlog.000001", "pos": 500, "rows": 1},
                {"index": 1, "lower": [100], "upper": None, "file": "binlog.000001", "pos": 900, "rows": 1},
            ],
        ),
    )
    records = spark.createDataFrame(
        [
            _record(0, 10, 400),  # before both snapshots: out
            _record(1, 50, 700),  # after its chunk's snapshot (500): in
            _record(2, 150, 700, "c"),  # between the oldest snapshot and its own (900): its chunk holds it, out
            _record(3, 160, 700, "d"),  # likewise a delete: out
            _record(4, 150, 950),  # after its own snapshot: in
        ],
        "record_value string, kafka_topic string, kafka_partition int, kafka_offset long",
    )
    rows = typed_changes(records, COLUMNS, ("id",), "eo", "t", since=loaded.snapshot_version_sql(quoted("id")))
    got = {(r["id"], r["v"], r[VERSION_COLUMN]) for r in rows.collect()}
    assert got == {(50, "50@700", _version(700)), (150, "150@950", _version(950))}
    # the oldest snapshot alone (a bound for any key) keeps the ghost insert of key 150 and the delete of 160
    wide = typed_changes(records, COLUMNS, ("id",), "eo", "t", since=loaded.min_version)
    assert {r["id"] for r in wide.collect()} == {50, 150, 160}
