"""The bisected key: an integer key as itself, any other key as the hash of its canonical text."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.reconcile.canonical import MARIADB, POSTGRES, SPARK, python_row_hash
from exactly_once_provider.reconcile.keys import Key, from_json

pytestmark = pytest.mark.unit


def col(name: str, data_type: str, scale: int | None = None) -> Column:
    return Column(name, data_type, data_type, None, scale)


def test_a_single_integer_key_is_bisected_by_value_on_every_engine():
    key = Key.of(col("id", "bigint"))
    assert not key.hashed and key.of_values([42]) == 42 and key.label_expression(MARIADB) is None
    assert key.expression(MARIADB) == "`id`" and key.expression(POSTGRES) == '"id"'
    assert key.expression(SPARK, "order_id") == "CAST(`order_id` AS BIGINT)"
    assert key.of_record_key({"id": 42}) == 42


@pytest.mark.parametrize(
    "columns", [[col("code", "varchar")], [col("region", "char"), col("id", "int")], [col("amount", "decimal", 2)]]
)
def test_any_other_key_is_bisected_by_the_hash_of_its_canonical_text(columns):
    key = Key.of(columns)
    assert key.hashed
    for dialect in (MARIADB, POSTGRES, SPARK):
        assert key.expression(dialect) == dialect.row_hash(
            [dialect.canonical(dialect.quote(c.name), c) for c in columns]
        )
        assert key.label_expression(dialect).startswith("CONCAT_WS(")


def test_a_record_key_hashes_like_the_row_it_names():
    key = Key.of(
        [
            col("region", "varchar"),
            col("day", "date"),
            col("at", "datetime"),
            col("blob", "blob"),
            col("amount", "decimal", 2),
        ]
    )
    record = {"region": "EU", "day": "2026-11-25", "at": "2026-11-25T10:00:00.5", "blob": "AAE=", "amount": "1.50"}
    values = ("EU", dt.date(2026, 11, 25), dt.datetime(2026, 11, 25, 10, 0, 0, 500000), b"\x00\x01", Decimal("1.5"))
    assert key.of_record_key(record) == key.of_values(values) == python_row_hash(values, list(key.columns))
    assert key.label(values) == "EU, 2026-11-25, 2026-11-25 10:00:00.500000, 0001, 1.50"
    with pytest.raises(KeyError):
        key.of_record_key({"region": "EU"})


def test_a_utc_timestamp_in_a_record_key_is_rendered_in_utc():
    assert from_json("2026-11-25T10:00:00Z", col("at", "timestamp")) == dt.datetime(2026, 11, 25, 10, tzinfo=dt.UTC)


def test_keys_without_one_canonical_text_and_renamed_composite_keys_are_refused():
    with pytest.raises(ValueError, match="FLOAT/DOUBLE/JSON/TIME"):
        Key.of([col("id", "int"), col("score", "double")])
    with pytest.raises(ValueError, match="single integer key only"):
        Key.of(col("code", "varchar")).expression(SPARK, "other")
    with pytest.raises(ValueError, match="needs a key"):
        Key(())
