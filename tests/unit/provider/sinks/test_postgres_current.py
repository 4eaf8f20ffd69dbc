"""The PostgreSQL current table's column types hold every loaded value; its COPY text keeps NULL, the empty
string and binary apart."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io

import pyarrow as pa
import pytest

from exactly_once_provider.full_load.columns import Column, arrow_type
from exactly_once_provider.sinks.postgres_current import csv_rows, pg_type, refuse_nul, widens

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "data_type, column_type_, expected",
    [
        ("tinyint", "tinyint(4)", "integer"),
        ("int", "int(11)", "integer"),
        ("int", "int(10) unsigned", "bigint"),
        ("bigint", "bigint(20)", "bigint"),
        ("bigint", "bigint(20) unsigned", "numeric(20,0)"),
        ("decimal", "decimal(12,2)", "numeric(12,2)"),
        ("float", "float", "real"),
        ("double", "double", "double precision"),
        ("datetime", "datetime(6)", "timestamp"),
        ("timestamp", "timestamp", "timestamptz"),
        ("date", "date", "date"),
        ("varbinary", "varbinary(8)", "bytea"),
        ("varchar", "varchar(5)", "text"),
        ("time", "time", "text"),
        ("set", "set('a','b')", "text"),
    ],
)
def test_each_loaded_type_has_a_postgres_type_holding_it(data_type, column_type_, expected):
    precision, scale = (12, 2) if data_type == "decimal" else (None, None)
    assert pg_type(arrow_type(Column("c", data_type, column_type_, precision, scale))) == expected


def test_spark_s_large_arrow_types_map_like_the_plain_ones():
    assert pg_type(pa.large_string()) == pg_type(pa.string()) and pg_type(pa.large_binary()) == "bytea"


def test_a_type_without_a_postgres_form_is_refused():
    with pytest.raises(ValueError, match="No PostgreSQL type"):
        pg_type(pa.list_(pa.int32()))


def test_copy_text_keeps_null_empty_binary_and_quotes_apart():
    table = pa.table(
        {
            "s": pa.array(["", None, 'a,"b"\nc'], pa.string()),
            "b": pa.array([b"\x00\xff", None, b""], pa.binary()),
            "d": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("-0.01")], pa.decimal128(12, 2)),
            "t": pa.array([dt.datetime(2026, 1, 2, 3, 4, 5, 6), None, None], pa.timestamp("us")),
        }
    )
    text = csv_rows(table).read().decode()
    rows = list(csv.reader(io.StringIO(text)))
    assert (
        rows[0][:2] == ["", "\\x00ff"] and rows[0][2] == "1.50" and rows[0][3].startswith("2026-01-02 03:04:05.000006")
    )
    assert rows[2][0] == 'a,"b"\nc' and rows[2][1] == "\\x" and rows[2][2] == "-0.01"
    lines = text.split("\n")
    # COPY's CSV: an unquoted empty field is NULL, a quoted one the empty string
    assert lines[0].startswith('"",') and lines[1].startswith(",,,")


def test_text_with_nul_is_refused_naming_the_column_and_keys():
    table = pa.table({"id": [1, 2, 3], "s": ["ok", "a\x00b", None], "b": pa.array([b"\x00", None, None], pa.binary())})
    with pytest.raises(
        ValueError, match=r"Column 's' of 1 row\(s\) of a batch holds the NUL character.*keys \[\(2,\)\]"
    ):
        refuse_nul(table, ("id",), "a batch")
    refuse_nul(table.drop_columns(["s"]), ("id",), "a batch")  # binary holds NUL as bytea: fine


@pytest.mark.parametrize(
    "held, wanted, altered",
    [
        ("integer", "bigint", True),  # INT -> BIGINT, the key's too
        ("integer", "numeric(12,0)", True),
        ("bigint", "numeric(20,0)", True),  # INT UNSIGNED -> BIGINT UNSIGNED
        ("numeric(12,2)", "numeric(18,2)", True),
        ("numeric(12,2)", "numeric(14,4)", True),
        ("real", "double precision", True),  # FLOAT -> DOUBLE
        ("bigint", "bigint", False),
        ("numeric(12,2)", "numeric(12,3)", False),  # fewer integer digits: never followed, never altered
        ("numeric(12,2)", "numeric(12,1)", False),
        ("bigint", "integer", False),
        ("double precision", "real", False),
        ("timestamp with time zone", "timestamptz", False),  # one type, two spellings
        ("timestamp without time zone", "timestamp", False),
        ("text", "text", False),
    ],
)
def test_only_a_widening_alters_a_column_type(held, wanted, altered):
    assert widens(held, wanted) is altered
