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


# A DECIMAL column and the two typed bad-value kinds (sinks/bad_values.py): the fail mode's clean stop names them.
AMOUNTS = [*COLUMNS, Column("d", "decimal", "decimal(6,2)", 6, 2)]


def _amount(offset: int, key: int, pos: int, d: str | None, **extra) -> tuple:
    value = {
        "source": {"schema": "eo", "table": "t"},
        "version": _version(pos),
        "op": "u",
        "after": {"id": key, "v": "x", "d": d, **extra},
        "schema_version": "9f86d081884c7d65",
    }
    return json.dumps(value), "topic", 0, offset


def _frame(spark, records):
    return spark.createDataFrame(
        records, "record_value string, kafka_topic string, kafka_partition int, kafka_offset long"
    )


def _error(spark, records, **kwargs) -> str:
    try:
        typed_changes(_frame(spark, records), AMOUNTS, ("id",), "eo", "t", **kwargs).collect()
    except Exception as err:  # Spark's raise_error, as the MERGE's read of its source would meet it
        return str(err)
    raise AssertionError("the batch was not refused")


def test_a_decimal_past_its_column_or_an_unknown_column_stops_the_batch_naming_it(spark):
    from decimal import Decimal

    good = [_amount(0, 1, 100, "1234.56"), _amount(1, 2, 101, "0012.50"), _amount(2, 3, 102, None)]
    rows = typed_changes(_frame(spark, good), AMOUNTS, ("id",), "eo", "t").collect()
    assert {r["id"]: r["d"] for r in rows} == {1: Decimal("1234.56"), 2: Decimal("12.50"), 3: None}
    previous = spark.conf.get("spark.sql.ansi.enabled")
    # ANSI off: Spark's cast itself would store NULL for the first and round the second; the check does not rely on it
    for ansi in ("true", "false"):
        spark.conf.set("spark.sql.ansi.enabled", ansi)
        try:
            for value in ("12345.67", "1.005"):
                message = _error(spark, [*good, _amount(3, 4, 103, value)])
                for part in ("decimal_overflow", "'d'", "decimal(6,2)", value, "offset 3", "Nothing of this batch"):
                    assert part in message, (ansi, message[:2000])
        finally:
            spark.conf.set("spark.sql.ansi.enabled", previous)
    unknown = [*good, _amount(3, 4, 103, "1.00", extra=7)]
    message = _error(spark, unknown, applied=77)
    for part in ("schema_version", "9f86d081884c7d65", "offset 3", "column(s) extra", "schema version 77", "id, v, d"):
        assert part in message, message[:2000]
    # planned without the batch's schema records: planned again with them first (an ADD COLUMN may be among them)
    assert "EO_SCHEMA_RECORD_AHEAD" in _error(spark, unknown, refuse_schema_after=77)
    # older than the snapshot: left out, not refused (a full reload after an ALTER TABLE the table could not follow)
    assert typed_changes(_frame(spark, unknown), AMOUNTS, ("id",), "eo", "t", since=_version(200)).collect() == []


class _Sink:
    def committed(self):
        return None


def test_the_dead_letter_rules_classify_the_typed_kinds(spark):
    from types import SimpleNamespace

    from exactly_once_provider.sinks import dead_letters
    from exactly_once_provider.spark_jobs.current_changes import CurrentChanges

    def snapshot_version_sql(key_sql: str) -> str:  # keys up to 10 read at position 95, the others at 90
        return f"(CASE WHEN {key_sql} <= 10 THEN {_version(95)} ELSE {_version(90)} END)"

    source = SimpleNamespace(
        schema="eo",
        table="t",
        key=["id"],
        columns=AMOUNTS,
        load_id="L1",
        min_version=5,
        snapshot_version_sql=snapshot_version_sql,
    )
    records = [
        _amount(0, 1, 100, "1234.56"),
        _amount(1, 2, 101, "12345.67"),
        _amount(2, 3, 102, "1.00", extra=7),
        _amount(3, 4, 103, "1.005", extra=7),  # both: the schema version is named first
        _amount(4, 5, 104, None),
        _amount(5, 6, 94, "12345.67", extra=7),  # older than its chunk's snapshot: left out as typed_changes does
        _amount(6, 16, 94, "12345.67"),  # newer than its own chunk's (90): judged
    ]
    raw = spark.createDataFrame(
        [(r[0].encode(), b"k", r[1], r[2], r[3]) for r in records],
        "value binary, key binary, kafka_topic string, kafka_partition int, kafka_offset long",
    )
    rules = CurrentChanges(source, _Sink()).letter_rules(raw)
    flagged = dead_letters.flag(raw, "delta", "current", extra=rules)
    found = {r["kafka_offset"]: (r["_eo_error_class"], r["_eo_error_message"]) for r in flagged.collect()}
    classes = [found[o][0] for o in range(7)]
    assert classes == [None, "decimal_overflow", "schema_version", "schema_version", None, None, "decimal_overflow"]
    assert "12345.67" in found[1][1] and "decimal(6,2)" in found[1][1] and "'d'" in found[1][1], found[1][1]
    assert "column(s) extra" in found[2][1] and "schema version 5" in found[2][1], found[2][1]
