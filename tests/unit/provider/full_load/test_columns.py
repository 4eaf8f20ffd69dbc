"""Source types map to Arrow types that keep the value exactly."""

from __future__ import annotations

import datetime as dt
import decimal
import struct

import pyarrow as pa
import pytest

from exactly_once_provider.full_load.columns import Column, arrow_type, to_arrays


def col(data_type, column_type=None, precision=None, scale=None):
    return Column("c", data_type, column_type or data_type, precision, scale)


@pytest.mark.parametrize(
    "column,expected",
    [
        (col("int"), pa.int32()),
        (col("int", "int(10) unsigned"), pa.int64()),
        (col("bigint", "bigint(20) unsigned"), pa.decimal128(20, 0)),
        (col("decimal", "decimal(65,30)", 65, 30), pa.string()),
        (col("decimal", "decimal(12,3)", 12, 3), pa.decimal128(12, 3)),
        (col("datetime"), pa.timestamp("us")),
        (col("timestamp"), pa.timestamp("us", tz="UTC")),
        (col("longblob"), pa.binary()),
        (col("json"), pa.string()),
    ],
)
def test_type_mapping(column, expected):
    assert arrow_type(column) == expected


def test_unknown_type_is_refused_by_name():
    with pytest.raises(ValueError, match="'geometry'"):
        arrow_type(col("geometry"))


# One column of every mapped type, as MySQLdb returns it with raw_conversions(): the server's text as bytes
# for numbers, dates and times, str for character columns, bytes for binary ones.
EVERY_TYPE = [
    (col("tinyint"), [b"-128", b"127"], [-128, 127]),
    (col("smallint", "smallint unsigned"), [b"0", b"65535"], [0, 65535]),
    (col("mediumint"), [b"-8388608", b"8388607"], [-8388608, 8388607]),
    (col("int", "int(5) unsigned zerofill"), [b"00012", b"4294967295"], [12, 4294967295]),
    (col("int"), [b"-2147483648", b"2147483647"], [-2147483648, 2147483647]),
    (col("bigint"), [b"-9223372036854775808", b"9223372036854775807"], [-(2**63), 2**63 - 1]),
    (
        col("bigint", "bigint(20) unsigned"),
        [b"18446744073709551615", b"0"],
        [decimal.Decimal(2**64 - 1), decimal.Decimal(0)],
    ),
    (col("year", "year(4)"), [b"0000", b"2155"], [0, 2155]),
    (col("float"), [b"0.1", b"-3.40282e38"], [struct.unpack("f", struct.pack("f", v))[0] for v in (0.1, -3.40282e38)]),
    (col("double"), [b"0.1", b"-1.7976931348623157e308"], [0.1, -1.7976931348623157e308]),
    (
        col("decimal", "decimal(12,3)", 12, 3),
        [b"-4800.010", b"0.000"],
        [decimal.Decimal("-4800.010"), decimal.Decimal("0.000")],
    ),
    (
        col("decimal", "decimal(38,0)", 38, 0),
        [b"-" + b"9" * 38, b"1"],
        [decimal.Decimal("-" + "9" * 38), decimal.Decimal(1)],
    ),
    (
        col("decimal", "decimal(65,30)", 65, 30),
        [b"-" + b"9" * 35 + b"." + b"9" * 30, b"0." + b"0" * 30],
        ["-" + "9" * 35 + "." + "9" * 30, "0." + "0" * 30],
    ),
    (
        col("datetime", "datetime(6)"),
        [b"1000-01-01 00:00:00.000000", b"9999-12-31 23:59:59.999999"],
        [dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)],
    ),
    (
        col("datetime"),
        [b"2024-10-27 02:30:00", b"2024-02-29 00:00:00"],
        [dt.datetime(2024, 10, 27, 2, 30), dt.datetime(2024, 2, 29)],
    ),
    (
        col("timestamp", "timestamp(3)"),
        [b"1970-01-01 00:00:01.000", b"2038-01-19 03:14:07.999"],
        [dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC), dt.datetime(2038, 1, 19, 3, 14, 7, 999000, tzinfo=dt.UTC)],
    ),
    (col("date"), [b"1000-01-01", b"9999-12-31"], [dt.date(1000, 1, 1), dt.date(9999, 12, 31)]),
    (col("time"), [b"-838:59:59", b"838:59:59"], ["-838:59:59", "838:59:59"]),
    (col("time", "time(6)"), [b"-00:00:00.000001", b"12:00:00.000000"], ["-00:00:00.000001", "12:00:00"]),
    (col("time", "time(3)"), [b"-01:02:03.500", b"00:00:00.000"], ["-01:02:03.500000", "00:00:00"]),
    (col("time", "time(1)"), [b"-00:00:00", b"23:59:59.9"], ["00:00:00", "23:59:59.900000"]),
    (col("varchar", "varchar(8)"), ["ȧ😀'\"`;", ""], ["ȧ😀'\"`;", ""]),
    (col("longtext"), ["x" * 70_000, "\x00"], ["x" * 70_000, "\x00"]),
    (col("json"), ['{"s": "ü😀"}', "[]"], ['{"s": "ü😀"}', "[]"]),
    (col("enum", "enum('a','b')"), ["a", ""], ["a", ""]),
    (col("set", "set('a','b')"), ["a,b", ""], ["a,b", ""]),
    (col("blob"), [b"\x00\xff\x00", b""], [b"\x00\xff\x00", b""]),
    (col("binary", "binary(2)"), [b"\x00\x00", b"a\x00"], [b"\x00\x00", b"a\x00"]),
    (col("bit", "bit(12)"), [b"\x0f\xff", b"\x00\x00"], [b"\x0f\xff", b"\x00\x00"]),
]


@pytest.mark.parametrize("column,values,expected", EVERY_TYPE, ids=[c.column_type for c, _, _ in EVERY_TYPE])
def test_server_text_is_parsed_exactly_and_nulls_stay_null(column, values, expected):
    rows = [(v, b"7") for v in values] + [(None, None)]
    arrays = to_arrays([column, col("int")], rows)
    assert arrays[0].type == arrow_type(column)
    assert arrays[0].to_pylist() == [*expected, None]
    assert arrays[1].to_pylist() == [7] * len(values) + [None]


def test_every_type_in_one_batch_and_an_empty_batch():
    columns = [c for c, _, _ in EVERY_TYPE]
    rows = [tuple(values[i] for _, values, _ in EVERY_TYPE) for i in range(2)] + [(None,) * len(columns)]
    arrays = to_arrays(columns, rows)
    for (column, _, expected), array in zip(EVERY_TYPE, arrays):
        assert array.to_pylist() == [*expected, None], column
    assert [a.type for a in to_arrays(columns, [])] == [arrow_type(c) for c in columns]


def test_text_that_is_not_utf8_is_refused():
    with pytest.raises(pa.ArrowInvalid):
        to_arrays([col("int")], [(b"\xff",)])


def test_zero_date_is_refused_with_the_column_name():
    with pytest.raises(ValueError, match="'c' .*zero dates"):
        to_arrays([col("date")], [(b"0000-00-00",)])
