"""Value conversions and DDL parsing of the binlog reader, on fake table-map columns."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from types import SimpleNamespace

import pytest
from pymysqlreplication.constants import FIELD_TYPE

from exactly_once_provider.errors import PipelineError
from exactly_once_provider.source.binlog import TableShape, column_converter, ddl_tables, replica_server_id


def col(kind, **kw):
    return SimpleNamespace(type=kind, name=kw.pop("name", "c"), character_set_name=kw.pop("charset", None), **kw)


def convert(kind, value, **kw):
    fn = column_converter(col(kind, **kw))
    return value if fn is None else fn(value)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    "kind,value,expected",
    [
        (FIELD_TYPE.LONGLONG, 18446744073709551615, 18446744073709551615),  # BIGINT UNSIGNED stays exact
        (FIELD_TYPE.LONG, 4294967295, 4294967295),
        (FIELD_TYPE.NEWDECIMAL, decimal.Decimal("12345678901234567890.0123456789"), "12345678901234567890.0123456789"),
        (FIELD_TYPE.NEWDECIMAL, decimal.Decimal("1.50"), "1.50"),
        (FIELD_TYPE.DOUBLE, 2.25, 2.25),
        (FIELD_TYPE.TIMESTAMP2, dt.datetime(2026, 11, 21, 10, 0, 0, 500000), "2026-11-21T10:00:00.500000Z"),
        (FIELD_TYPE.DATETIME2, dt.datetime(2026, 3, 29, 2, 30), "2026-03-29T02:30:00"),
        (FIELD_TYPE.DATE, dt.date(2026, 1, 2), "2026-01-02"),
        (FIELD_TYPE.YEAR, 2024, 2024),
        (FIELD_TYPE.ENUM, "b", "b"),
        (FIELD_TYPE.SET, {"z", "x"}, ["x", "z"]),
        (FIELD_TYPE.VARCHAR, "héllo", "héllo"),
    ],
)
def test_values_become_exact_json(kind, value, expected):
    assert convert(kind, value) == expected


def test_float_is_the_shortest_decimal_of_its_four_bytes():
    import struct

    stored = struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert stored != 0.1 and convert(FIELD_TYPE.FLOAT, stored) == 0.1


def test_binary_values_are_base64_and_binary_n_is_zero_padded():
    assert convert(FIELD_TYPE.BLOB, b"\x00\xff\x10", charset="binary") == b64(b"\x00\xff\x10")
    assert convert(FIELD_TYPE.VARCHAR, b"\x00", charset="binary") == b64(b"\x00")
    assert convert(FIELD_TYPE.STRING, b"\x01\x02", charset="binary", max_length=4) == b64(b"\x01\x02\x00\x00")
    assert convert(FIELD_TYPE.BLOB, '{"a": 1}', charset="utf8mb4") == '{"a": 1}'  # MariaDB JSON is text
    assert convert(FIELD_TYPE.BIT, "1010101010", bits=10) == b64(bytes([0b10, 0b10101010]))


def test_mysql_binary_json_becomes_compact_text():
    assert convert(FIELD_TYPE.JSON, {b"a": [1, 2.5, b"x"], b"b": None}) == '{"a":[1,2.5,"x"],"b":null}'


@pytest.mark.parametrize(
    "decoded,expected",
    [
        (dt.timedelta(hours=12, minutes=34, seconds=56, microseconds=789000), "12:34:56.789000"),
        (-dt.timedelta(hours=1), "-01:00:00"),
        (-dt.timedelta(hours=838, minutes=59, seconds=59), "-838:59:59"),
        # python-mysql-replication 1.0.17 returns -(whole + 1 - fraction) for negative TIME(fsp) values:
        (-dt.timedelta(hours=12, minutes=34, seconds=56, microseconds=211000), "-12:34:56.789000"),
        (-dt.timedelta(microseconds=999999), "-00:00:00.000001"),
    ],
)
def test_time2_negative_fractions_are_fixed(decoded, expected):
    assert convert(FIELD_TYPE.TIME2, decoded) == expected


def test_old_time_type_is_not_fixed():
    assert convert(FIELD_TYPE.TIME, -dt.timedelta(hours=1)) == "-01:00:00"


def test_text_in_a_known_charset_needs_no_conversion_and_unknown_charsets_are_decoded_as_utf8():
    # The library decodes text columns itself; it hands raw bytes over only for charsets Python lacks.
    for charset in ("utf8mb4", "latin1", None):
        assert column_converter(col(FIELD_TYPE.VARCHAR, charset=charset, max_length=40)) is None
        assert column_converter(col(FIELD_TYPE.BLOB, charset=charset)) is None
    assert convert(FIELD_TYPE.VARCHAR, "h\u00e9".encode(), charset="swe7") == "h\u00e9"
    assert convert(FIELD_TYPE.STRING, "abc", charset="swe7") == "abc"


def test_integers_enums_and_years_need_no_conversion():
    for kind in (
        FIELD_TYPE.TINY,
        FIELD_TYPE.LONG,
        FIELD_TYPE.LONGLONG,
        FIELD_TYPE.INT24,
        FIELD_TYPE.YEAR,
        FIELD_TYPE.ENUM,
    ):
        assert column_converter(col(kind)) is None


def test_the_key_is_read_as_the_snapshot_reads_it():
    pad = lambda v: v.ljust(4, b"\x00")  # noqa: E731 - BINARY(4) as the snapshot reads it
    assert _shape().key_of({"id": 7, "s": None}) == (7,)
    assert _shape(key=("s", "id"), key_fixes=(None, None)).key_of({"id": 7, "s": "a"}) == ("a", 7)
    assert _shape(key=("s", "id"), key_fixes=(pad, None)).key_of({"id": 7, "s": b"a"}) == (b"a\x00\x00\x00", 7)
    with pytest.raises(PipelineError, match="dropped or renamed"):
        _shape(key=("s", "id"), key_fixes=(None, None)).key_of({"s": 1})


def _shape(**kw):
    defaults = dict(
        schema="eo",
        table="t",
        columns=("id", "s"),
        schema_version="v",
        converters=(),
        empty_sets=frozenset({"s"}),
        key=("id",),
        key_fixes=(None,),
    )
    return TableShape(**{**defaults, **kw})


def test_empty_set_is_an_empty_array_and_null_stays_null():
    shape = _shape()
    assert shape.convert({"id": 1, "s": None}, {"s": "empty set"}) == {"id": 1, "s": []}
    assert shape.convert({"id": 1, "s": None}, {"s": "null"}) == {"id": 1, "s": None}


def test_a_zero_date_is_an_error_not_a_null():
    with pytest.raises(PipelineError, match="zero or invalid date"):
        _shape().convert({"id": 1, "s": None}, {"s": "out of datetime2 range"})


def test_a_missing_key_column_is_a_clear_error():
    with pytest.raises(PipelineError, match="dropped or renamed"):
        _shape().key_of({"s": 1})


@pytest.mark.parametrize(
    "query,expected",
    [
        ("ALTER TABLE orders ADD COLUMN x INT", ("alter", [("db", "orders")])),
        ("alter online table `s`.`o``x` modify column a bigint", ("alter", [("s", "o`x")])),
        ("ALTER TABLE orders RENAME TO old_orders", ("rewrite", [("db", "orders")])),
        ("ALTER TABLE orders RENAME old_orders", ("rewrite", [("db", "orders")])),
        ("ALTER TABLE orders RENAME COLUMN a TO b, RENAME INDEX i TO j", ("alter", [("db", "orders")])),
        ("TRUNCATE TABLE orders", ("rewrite", [("db", "orders")])),
        ("TRUNCATE orders", ("rewrite", [("db", "orders")])),
        ("DROP TABLE IF EXISTS `a`, b.c /* generated by server */", ("rewrite", [("db", "a"), ("b", "c")])),
        ("RENAME TABLE a TO b, c TO d", ("rewrite", [("db", "a"), ("db", "b"), ("db", "c"), ("db", "d")])),
        ("CREATE OR REPLACE TABLE t (id int)", ("rewrite", [("db", "t")])),
        ("CREATE TABLE IF NOT EXISTS t (id int)", ("rewrite", [("db", "t")])),
        ("ALTER TABLE t ADD c INT COMMENT 'RENAME TO x later'", ("alter", [("db", "t")])),  # a string, no clause
        ("ALTER TABLE t WAIT 2 ADD c INT /* , RENAME TO x */", ("alter", [("db", "t")])),  # a comment
        ("/*!40000 ALTER TABLE `t` DISABLE KEYS */", ("alter", [("db", "t")])),  # an executable comment runs
        ("GRANT SELECT ON *.* TO x", ("", [])),
        ("INSERT INTO t VALUES (1)", ("", [])),
    ],
)
def test_ddl_tables(query, expected):
    assert ddl_tables(query, "db") == expected


def test_replica_server_id_is_stable_and_away_from_small_ids():
    assert replica_server_id("p/binlog") == replica_server_id("p/binlog") != replica_server_id("q/binlog")
    assert (1 << 20) <= replica_server_id("p/binlog") < (1 << 31)


def test_star_import_gives_every_name_the_module_exports():
    """Every name in ``__all__`` exists (a name left behind by a move failed ``import *``)."""
    import exactly_once_provider.source.binlog as binlog

    namespace: dict = {}
    exec("from exactly_once_provider.source.binlog import *", namespace)  # the statement under test
    assert set(binlog.__all__) <= set(namespace)


def test_removes_tables_names_the_statements_that_end_a_tables_rows():
    from exactly_once_provider.source.binlog import removes_tables

    ended = ["DROP TABLE `t`", "drop table if exists a, b", "RENAME TABLE a TO b", "ALTER TABLE a RENAME TO b"]
    ended += ["/* gh-ost */ RENAME TABLE `t` TO `_t_del`, `_t_gho` TO `t`", "ALTER TABLE a RENAME AS b"]
    kept = ["TRUNCATE TABLE t", "CREATE OR REPLACE TABLE t (id INT)", "ALTER TABLE t RENAME COLUMN a TO b"]
    kept += ["ALTER TABLE t RENAME INDEX i TO j", "ALTER TABLE t ADD COLUMN c INT", "INSERT INTO t VALUES (1)"]
    assert [removes_tables(q) for q in ended] == [True] * len(ended)
    assert [removes_tables(q) for q in kept] == [False] * len(kept)
