"""Identifier quoting: a hostile name stays one identifier; chunk bounds as literals (strings only as hex)."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from exactly_once_provider.source.identifiers import quote_identifier, quote_table, sql_literal


@pytest.mark.parametrize(
    "name,quoted",
    [
        ("orders", "`orders`"),
        ("a`b", "`a``b`"),
        ("x`; DROP TABLE y; --", "`x``; DROP TABLE y; --`"),
        ('it\'s "q"', '`it\'s "q"`'),
    ],
)
def test_quote_identifier_doubles_backticks(name, quoted):
    assert quote_identifier(name) == quoted


def test_quote_table_qualifies_with_schema():
    assert quote_table("s`1", "t") == "`s``1`.`t`"


@pytest.mark.parametrize("bad", ["", None, "a\x00b"])
def test_bad_identifiers_are_refused(bad):
    with pytest.raises(ValueError, match="identifier|Identifier"):
        quote_identifier(bad)


@pytest.mark.parametrize(
    "value, literal",
    [
        (-9223372036854775808, "-9223372036854775808"),
        (2**64 - 1, "18446744073709551615"),
        (decimal.Decimal("-0.0000000001"), "-0.0000000001"),
        (decimal.Decimal("1E+3"), "1000"),
        (1e-05, "1e-05"),
        ("it's `x`; --", "_utf8mb4 X'69742773206078603b202d2d'"),
        ("", "_utf8mb4 X''"),
        ("😀", "_utf8mb4 X'f09f9880'"),
        (b"\x00'\\", "X'00275c'"),
        (dt.datetime(2024, 2, 29, 12, 0, 0, 1), "'2024-02-29 12:00:00.000001'"),
        (dt.date(1000, 1, 1), "'1000-01-01'"),
        (dt.timedelta(hours=-838, minutes=-59, seconds=-59), "'-838:59:59.000000'"),
        (dt.timedelta(microseconds=-1), "'-0:00:00.000001'"),
    ],
)
def test_sql_literal_writes_each_key_type_exactly_and_strings_only_as_hex(value, literal):
    assert sql_literal(value) == literal


@pytest.mark.parametrize(
    "value", [None, True, float("nan"), decimal.Decimal("NaN"), object(), dt.datetime(2024, 1, 1, tzinfo=dt.UTC)]
)
def test_sql_literal_refuses_what_no_chunk_bound_holds(value):
    with pytest.raises(ValueError, match="literal|chunk bound"):
        sql_literal(value)
