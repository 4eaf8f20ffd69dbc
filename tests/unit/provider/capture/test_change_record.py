"""The change record format: fields, key, version order, key-changing updates, topic names."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.capture.change_record import FORMAT, parse, records_of, topic_for, version_of
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source.binlog import RowChange, SourceTransaction, TableShape

SHAPE = TableShape("eo", "orders", ("id", "v"), "abc123", (), frozenset(), ("id",), (None,))
TOPICS = {("eo", "orders"): "p.eo.orders"}


def txn(*rows):
    return SourceTransaction(
        "0-1-77", 1, BinlogPosition("binlog.000003", 100), BinlogPosition("binlog.000003", 900), 1763694000, list(rows)
    )


def row(op, before, after, index=0, pos=400):
    key = lambda image: None if image is None else (image["id"],)  # noqa: E731
    return RowChange(SHAPE, op, before, after, key(before), key(after), "binlog.000003", pos, index)


def test_record_fields_match_the_documented_format():
    (record,) = records_of(txn(row("u", {"id": 5, "v": 1}, {"id": 5, "v": 2})), TOPICS)
    value = parse(record.value)
    assert record.topic == "p.eo.orders" and record.key == b'{"id":5}' and record.key_values == (5,)
    assert value == {
        "format": FORMAT,
        "op": "u",
        "pk": {"id": 5},
        "before": {"id": 5, "v": 1},
        "after": {"id": 5, "v": 2},
        "version": (3 << 32) + 400,
        "source": {
            "server_id": 1,
            "file": "binlog.000003",
            "pos": 400,
            "row": 0,
            "gtid": "0-1-77",
            "commit_file": "binlog.000003",
            "commit_pos": 900,
            "txn_row": 0,
            "txn_rows": 1,
            "schema": "eo",
            "table": "orders",
        },
        "commit_ts": "2025-11-21T03:00:00Z",
        "schema_version": "abc123",
    }


def test_record_bytes_are_exactly_the_compact_json_of_the_documented_object():
    # orjson writes the records; every value type of the conversion table must come out as Python's json
    # writes it (floats: 1e-05 not 1e-5; control characters escaped, other text as UTF-8).
    shape = TableShape(
        "eo",
        "t\u00e9",
        ("id", "f", "d", "s", "j", "n", "u"),
        "v1",
        (),
        frozenset(),
        ("id", "f"),
        (None, None),
        ("f", "d"),
    )
    before = {
        "id": 18446744073709551615,
        "f": 1e-05,
        "d": float("nan"),
        "s": ["a", "b"],
        "j": '{"a":1}',
        "n": None,
        "u": 'h\u00e9 "q" \\ \n\t\x00\x1f\x7f\u2028\U0001f600',
    }
    after = dict(before, f=2.5e-07, d=1e16, s=[])
    txn_ = SourceTransaction(
        None,
        None,
        BinlogPosition("binlog.000003", 100),
        BinlogPosition("binlog.000004", 900),
        1763694000,
        [RowChange(shape, "u", before, after, (1, 1e-05), (1, 2.5e-07), "binlog.000004", 4, 2)],
    )
    records = list(records_of(txn_, {("eo", "t\u00e9"): "p.t"}))
    expected = []
    for index, (op, b, a) in enumerate([("d", before, None), ("c", None, after)]):
        image = a or b
        expected.append(
            {
                "format": 1,
                "op": op,
                "pk": {"id": image["id"], "f": image["f"]},
                "before": b,
                "after": a,
                "version": (4 << 32) + 4 + 2,
                "source": {
                    "server_id": None,
                    "file": "binlog.000004",
                    "pos": 4,
                    "row": 2,
                    "gtid": None,
                    "commit_file": "binlog.000004",
                    "commit_pos": 900,
                    "txn_rows": 2,
                    "txn_row": index,
                    "schema": "eo",
                    "table": "t\u00e9",
                },
                "commit_ts": "2025-11-21T03:00:00Z",
                "schema_version": "v1",
            }
        )
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    assert [r.value for r in records] == [dumps(e).encode() for e in expected]
    assert [r.key for r in records] == [dumps(e["pk"]).encode() for e in expected]
    assert b'"f":1e-05' in records[0].value and b'"f":2.5e-07' in records[1].value


def test_spark_cdc_mode_fields_pk_version_op_are_present_and_version_fits_bigint():
    (record,) = records_of(txn(row("d", {"id": 5, "v": 1}, None)), TOPICS)
    value = json.loads(record.value)
    assert value["op"] == "d" and value["pk"] == {"id": 5} and value["after"] is None
    assert version_of("binlog.999999", 2**32 - 2, 1) < 2**63


def test_versions_increase_with_binlog_order():
    order = [
        ("binlog.000009", 4000, 0),
        ("binlog.000009", 4000, 1),
        ("binlog.000009", 4100, 0),
        ("binlog.000010", 4, 0),
    ]
    versions = [version_of(*o) for o in order]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)


def test_an_update_of_the_key_is_a_delete_and_a_create():
    records = list(
        records_of(
            txn(row("u", {"id": 1, "v": 0}, {"id": 2, "v": 0}), row("c", None, {"id": 3, "v": 0}, index=1)), TOPICS
        )
    )
    values = [parse(r.value) for r in records]
    assert [(v["op"], v["pk"]["id"], v["source"]["txn_row"], v["source"]["txn_rows"]) for v in values] == [
        ("d", 1, 0, 3),
        ("c", 2, 1, 3),
        ("c", 3, 2, 3),
    ]
    assert [r.key_values for r in records] == [(1,), (2,), (3,)]


def test_topic_template():
    assert topic_for("{pipeline}.{schema}.{table}", "p", "eo", "t_1") == "p.eo.t_1"
    with pytest.raises(ValueError, match="unknown placeholder"):
        topic_for("{db}.{table}", "p", "eo", "t")
    with pytest.raises(ValueError, match="not a valid Kafka topic"):
        topic_for("{schema}/{table}", "p", "eo", "t")


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="format"):
        parse(b'{"format": 2}')


def test_change_record_is_produced_as_a_message():
    """The capture hands ChangeRecords to the writer as they are: Message's fields must lead, same order."""
    from exactly_once_provider.capture.change_record import ChangeRecord
    from exactly_once_provider.kafka.writer import Message

    assert ChangeRecord._fields[: len(Message._fields)] == Message._fields
    (record,) = records_of(txn(row("c", None, {"id": 5, "v": 1})), TOPICS)
    assert Message(*record[:4]) == Message(record.value, record.key, None, "p.eo.orders")
