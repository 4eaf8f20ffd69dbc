"""Source types map to Arrow types that keep the value exactly."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest

from exactly_once_provider.full_load.columns import Column, arrow_type, to_arrays


def col(data_type, column_type=None, precision=None, scale=None):
    return Column("c", data_type, column_type or data_type, precision, scale)


@pytest.mark.parametrize("column,expected", [
    (col("int"), pa.int32()), (col("int", "int(10) unsigned"), pa.int64()),
    (col("bigint", "bigint(20) unsigned"), pa.decimal128(20, 0)), (col("decimal", "decimal(65,30)", 65, 30), pa.string()),
    (col("decimal", "decimal(12,3)", 12, 3), pa.decimal128(12, 3)), (col("datetime"), pa.timestamp("us")),
    (col("timestamp"), pa.timestamp("us", tz="UTC")), (col("longblob"), pa.binary()), (col("json"), pa.string()),
])
def test_type_mapping(column, expected):
    assert arrow_type(column) == expected


def test_unknown_type_is_refused_by_name():
    with pytest.raises(ValueError, match="'geometry'"):
        arrow_type(col("geometry"))


def test_values_convert_exactly():
    columns = [col("time"), col("bigint", "bigint unsigned"), col("timestamp"), col("decimal", "decimal(65,2)", 65, 2)]
    rows = [(dt.timedelta(hours=-1, seconds=-3), 2**64 - 1, dt.datetime(2024, 1, 1), decimal.Decimal("1.50")),
            (dt.timedelta(days=1, microseconds=5), None, None, None)]
    arrays = to_arrays(columns, rows)
    assert arrays[0].to_pylist() == ["-01:00:03", "24:00:00.000005"]
    assert arrays[1].to_pylist() == [decimal.Decimal(2**64 - 1), None]
    assert arrays[2].to_pylist()[0] == dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert arrays[3].to_pylist() == ["1.50", None]


def test_raw_server_text_is_parsed_by_arrow_exactly():
    columns = [col("decimal", "decimal(12,2)", 12, 2), col("datetime", "datetime(6)"), col("timestamp"), col("date")]
    rows = [(b"-4800.01", b"2024-10-27 02:30:00.123456", b"2024-03-31 02:00:00", b"2024-02-29"),
            (None, None, None, None)]
    arrays = to_arrays(columns, rows, raw=True)
    assert arrays[0].to_pylist() == [decimal.Decimal("-4800.01"), None]
    assert arrays[1].to_pylist() == [dt.datetime(2024, 10, 27, 2, 30, 0, 123456), None]
    assert arrays[2].type == pa.timestamp("us", tz="UTC")
    assert arrays[2].to_pylist()[0] == dt.datetime(2024, 3, 31, 2, tzinfo=dt.timezone.utc)
    assert arrays[3].to_pylist() == [dt.date(2024, 2, 29), None]


def test_zero_date_is_refused_with_the_column_name():
    with pytest.raises(ValueError, match="'c' .*zero dates"):
        to_arrays([col("date")], [(b"0000-00-00",)], raw=True)
