"""The native chunk reader's query, URL and errors (provider/source/native_reader.py); reading is tested on the real server."""

from __future__ import annotations

import decimal
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pytest

from exactly_once_provider.full_load.columns import Column, from_native, native_select
from exactly_once_provider.source.native_reader import _native_error, chunk_query, connection_url
from exactly_once_provider.source.snapshot import Chunk, ConnectionSettings

SETTINGS = ConnectionSettings("db.example", 3306, "us@r:x", "p@ss/w:rd?#%", "my db", connect_timeout=7)


def test_connection_url_quotes_every_part_and_never_uses_a_local_socket():
    url = urlsplit(connection_url(SETTINGS))
    assert (unquote(url.username), unquote(url.password)) == ("us@r:x", "p@ss/w:rd?#%")
    assert (url.hostname, url.port, unquote(url.path)) == ("db.example", 3306, "/my db")
    assert "prefer_socket=false" in url.query and "tcp_connect_timeout_ms=7000" in url.query


def test_chunk_query_quotes_names_inlines_bounds_as_literals_and_adds_the_position_column():
    sql = chunk_query("s`", "t;", ["`a`", "CAST(`d` AS CHAR) AS `d`"], ("k`",), Chunk(1, ("x'; DROP",), (5,)))
    assert sql.startswith("SELECT `a`, CAST(`d` AS CHAR) AS `d`, IF((@eo_row := @eo_row + 1) = 1, ")
    assert "FROM `s```.`t;` WHERE" in sql
    assert "`k``` > _utf8mb4 X'78273b2044524f50'" in sql and "`k``` <= 5" in sql and "DROP" not in sql


def test_native_errors_never_show_the_password():
    error = _native_error(
        RuntimeError(f"bad url mysql://u:{SETTINGS.password}@h and p%40ss%2Fw%3Ard%3F%23%25\nmore"), SETTINGS.password
    )
    assert SETTINGS.password not in str(error) and "p%40ss" not in str(error) and "more" not in str(error)
    assert str(error).startswith("RuntimeError: bad url mysql://u:***@h")
    interrupt = KeyboardInterrupt()
    assert _native_error(interrupt, "x") is interrupt


@pytest.mark.parametrize(
    "column, native, expected",
    [
        (
            Column("t", "tinyint", "tinyint(4)", 3, 0),
            pa.array([-128, None], pa.int8()),
            pa.array([-128, None], pa.int32()),
        ),
        (
            Column("u", "int", "int(10) unsigned", 10, 0),
            pa.array([2**32 - 1], pa.uint32()),
            pa.array([2**32 - 1], pa.int64()),
        ),
        (
            Column("b", "bigint", "bigint(20) unsigned", 20, 0),
            pa.array([2**64 - 1], pa.uint64()),
            pa.array([2**64 - 1], pa.decimal128(20, 0)),
        ),
        (
            Column("d", "decimal", "decimal(12,3)", 12, 3),
            pa.array([-1500, None], pa.int64()),
            pa.array([decimal.Decimal("-1.500"), None], pa.decimal128(12, 3)),
        ),
        (
            Column("d18", "decimal", "decimal(18,18)", 18, 18),
            pa.array([-(10**18 - 1)], pa.int64()),
            pa.array([decimal.Decimal("-0." + "9" * 18)], pa.decimal128(18, 18)),
        ),
        (
            Column("d0", "decimal", "decimal(1,0) unsigned", 1, 0),
            pa.array([9], pa.int8()),
            pa.array([9], pa.decimal128(1, 0)),
        ),
        (
            Column("d19", "decimal", "decimal(19,1)", 19, 1),
            pa.array(["-1.5"]),
            pa.array([decimal.Decimal("-1.5")], pa.decimal128(19, 1)),
        ),
        (Column("w", "decimal", "decimal(65,30)", 65, 30), pa.array(["1." + "0" * 30]), pa.array(["1." + "0" * 30])),
        (Column("tm", "time", "time(3)", None, None), pa.array(["-00:00:00.500"]), pa.array(["-00:00:00.500000"])),
        (
            Column("ts", "timestamp", "timestamp(6)", None, None),
            pa.array([0], pa.timestamp("us")),
            pa.array([0], pa.timestamp("us", tz="UTC")),
        ),
        (Column("bl", "blob", "blob", None, None), pa.array([b"\x00"], pa.large_binary()), pa.array([b"\x00"])),
    ],
)
def test_from_native_casts_each_connectorx_type_to_the_loaded_type(column, native, expected):
    assert from_native(column, native).equals(expected)


def test_from_native_refuses_a_value_that_does_not_fit_instead_of_changing_it():
    with pytest.raises(pa.ArrowInvalid):
        from_native(Column("i", "int", "int(11)", 10, 0), pa.array([2**40], pa.int64()))


def test_from_native_refuses_an_unscaled_decimal_past_its_precision():
    with pytest.raises(pa.ArrowInvalid, match="outside 5 digits"):
        from_native(Column("d", "decimal", "decimal(5,2)", 5, 2), pa.array([1, None, 100_000], pa.int64()))


def test_native_select_has_the_server_send_short_decimals_unscaled_and_others_and_time_as_text():
    assert native_select(Column("a`b", "decimal", "decimal(5,2)", 5, 2)) == "CAST(`a``b` * 100 AS SIGNED) AS `a``b`"
    assert native_select(Column("n", "decimal", "decimal(18,0)", 18, 0)) == "CAST(`n` AS SIGNED) AS `n`"
    assert native_select(Column("w", "decimal", "decimal(19,2)", 19, 2)) == "CAST(`w` AS CHAR) AS `w`"
    assert native_select(Column("t", "time", "time", None, None)) == "CAST(`t` AS CHAR) AS `t`"
    assert native_select(Column("d", "datetime", "datetime", None, None)) == "`d`"
