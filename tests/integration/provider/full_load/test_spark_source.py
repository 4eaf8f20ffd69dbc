"""One chunk read on the real MariaDB (full_load/spark_source.stage_chunk, no Spark): every type at its extremes.

The staged Parquet file must hold exactly what MySQLdb's own conversions make of the same rows, with both
readers: the native one (connectorx, provider/source/native_reader.py) and the row reader (the server's text parsed by
Arrow column-wise, full_load/columns.py). This is the check that no value changes on the way (DECIMAL(65,30),
DECIMAL(18,18) read unscaled, BIGINT UNSIGNED max, DATETIME(6) range ends, negative TIME, a FLOAT whose 6-digit
text is not its value, 4-byte UTF-8, empty strings vs NULL, zero bytes in BLOBs).
"""

from __future__ import annotations

import decimal
import json
import struct

import pyarrow.parquet as pq
import pytest

from exactly_once_provider.full_load import spark_source
from exactly_once_provider.full_load.columns import table_columns
from exactly_once_provider.full_load.plan import chunk_to_json
from exactly_once_provider.full_load.spark_source import arrow_schema, chunk_read_options, stage_chunk
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.sinks.current_table import snapshot_version
from exactly_once_provider.source.snapshot import Chunk, ConnectionSettings
from tests.mysql_support import connect, normalise, unique_name

EXTREMES = """(
  id INT NOT NULL PRIMARY KEY, d65 DECIMAL(65,30), d38 DECIMAL(38,10), d12 DECIMAL(12,3), d18 DECIMAL(18,18),
  ubig BIGINT UNSIGNED, sbig BIGINT, ui INT UNSIGNED, i INT, umi MEDIUMINT UNSIGNED, si SMALLINT, ti TINYINT,
  zf INT(5) ZEROFILL, f FLOAT, db DOUBLE, dt6 DATETIME(6), dt0 DATETIME, ts6 TIMESTAMP(6) NULL DEFAULT NULL, dd DATE, t0 TIME,
  t6 TIME(6), t3 TIME(3), y YEAR, bt BIT(12), b1 BIT(1), j JSON, s VARCHAR(16) CHARACTER SET utf8mb4,
  c CHAR(4), tx TEXT, e ENUM('a','b'), st SET('x','y'), bl BLOB, vb VARBINARY(8), bn BINARY(3), lb LONGBLOB
)"""
NINES = "9" * 35 + "." + "9" * 30
ROWS = [
    (
        1,
        "-" + NINES,
        "-" + "9" * 28 + "." + "9" * 10,
        "-999999999.999",
        "-0." + "9" * 18,
        0,
        -(2**63),
        0,
        -(2**31),
        0,
        -32768,
        -128,
        12,
        -3.40282e38,
        -1.7976931348623157e308,
        "1000-01-01 00:00:00",
        "1000-01-01 00:00:00",
        "1970-01-01 00:00:01",
        "1000-01-01",
        "-838:59:59",
        "-00:00:00.000001",
        "-01:02:03.5",
        1901,
        b"\x00\x00",
        b"\x00",
        json.dumps({"s": "ü😀𝄞", "n": None}),
        "😀𝄞ȧ'\"`;\\",
        "ab",
        "",
        "a",
        "x,y",
        b"\x00\x00\xff",
        b"\x00",
        b"a",
        b"\x00" * 70_000 + b"end",
    ),
    (
        2,
        NINES,
        "9" * 28 + "." + "9" * 10,
        "999999999.999",
        "0." + "9" * 18,
        2**64 - 1,
        2**63 - 1,
        2**32 - 1,
        2**31 - 1,
        2**24 - 1,
        32767,
        127,
        99999,
        0.1,
        5e-324,
        "9999-12-31 23:59:59.999999",
        "9999-12-31 23:59:59",
        "2038-01-19 03:14:07.999999",
        "9999-12-31",
        "838:59:59",
        "12:00:00",
        "00:00:00",
        2155,
        b"\x0f\xff",
        b"\x01",
        "[]",
        "",
        "",
        "x" * 1000,
        "b",
        "",
        b"",
        b"",
        b"\x00\x00\x00",
        b"",
    ),
    (
        3,
        "0",
        "0",
        "0",
        "0.000000000000000001",
        1,
        0,
        1,
        0,
        1,
        0,
        0,
        0,
        1 / 3,
        -0.0,
        "2024-02-29 12:34:56.000001",
        "2024-02-29 12:34:56",
        "2024-03-31 02:00:00.5",
        "2024-02-29",
        "00:00:00",
        "-12:00:00.5",
        "23:59:59.999",
        0,
        b"\x00\x01",
        b"\x00",
        "null",
        "NULL",
        "NULL",
        "NULL",
        "a",
        "y",
        b"NULL",
        b"\x00\xff",
        b"\xff\xff\xff",
        b"\x00",
    ),
    (4,) + (None,) * 34,  # every nullable column NULL (unlike the empty strings and zero bytes above)
]


@pytest.fixture
def table(stack):
    conn = connect(stack)
    name = unique_name("fl_read")
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{name}` {EXTREMES}")
    cur.executemany(f"INSERT INTO `{name}` VALUES ({', '.join(['%s'] * 35)})", ROWS)
    yield name
    cur.execute(f"DROP TABLE IF EXISTS `{name}`")
    conn.close()


def _stage(stack, table: str, chunks: list[Chunk], tmp_path, reader: str = "native") -> tuple[list, list[dict]]:
    settings = ConnectionSettings(stack.HOST, stack.MARIADB_PORT, stack.DB_USER, stack.DB_PASSWORD, stack.DB_NAME)
    conn = connect(stack)
    try:
        columns = table_columns(conn.cursor(), stack.DB_NAME, table)
    finally:
        conn.close()
    options = chunk_read_options(
        settings,
        True,
        stack.DB_NAME,
        table,
        columns,
        ("id",),
        [chunk_to_json(c) for c in chunks],
        2,
        "0" * 32,
        str(tmp_path),
        reader,
    )
    return columns, [stage_chunk(options, chunk_to_json(c)) for c in chunks]


def _expected(column, value):
    """What the staged file must hold for a value MySQLdb converted itself (None stays None)."""
    if value is None:
        return None
    if column.data_type == "float":  # loaded as its stored float32 (the oracle reads it widened to DOUBLE)
        return struct.unpack("f", struct.pack("f", value))[0]
    if column.data_type == "decimal" and column.precision > 38:  # loaded as its exact text
        return format(value, "f")
    return normalise(value)


@pytest.mark.parametrize("reader", ["native", "rows"])
def test_every_type_at_its_extremes_is_staged_exactly(stack, table, tmp_path, reader, monkeypatch):
    if reader == "native":  # every chunk here has rows: the native reader must read them all itself
        monkeypatch.setattr(spark_source, "read_chunk", _row_reader_must_not_run)
    columns, results = _stage(stack, table, [Chunk(0, None, (3,)), Chunk(1, (3,), None)], tmp_path, reader)
    conn = connect(stack)
    try:
        cur = conn.cursor()
        select = ", ".join("CAST(f AS DOUBLE)" if c.data_type == "float" else f"`{c.name}`" for c in columns)
        cur.execute(f"SELECT {select} FROM `{table}` ORDER BY id")
        source = cur.fetchall()
    finally:
        conn.close()
    staged = []
    for result in results:
        file = pq.read_table(tmp_path / result["data_file"])
        assert file.schema == arrow_schema(columns)
        assert (
            file.num_rows == result["rows"] and result["data_bytes"] == (tmp_path / result["data_file"]).stat().st_size
        )
        staged += file.to_pylist()
    assert [r["rows"] for r in results] == [3, 1]  # fetch_rows=2: batches of 2 and 1 rows in the first chunk
    assert staged[2]["f"] == struct.unpack("f", struct.pack("f", 1 / 3))[0] != float(f"{1 / 3:.6g}")
    assert len(staged) == len(source) == 4
    for got, row in zip(staged, source):
        for column, value in zip(columns, row):
            expected, actual = _expected(column, value), normalise(got[column.name])
            assert actual == expected and type(actual) is type(expected), (row[0], column.column_type, actual, expected)
    assert staged[1]["s"] == "" and staged[3]["s"] is None and staged[0]["lb"].endswith(b"\x00end")
    assert staged[1]["ubig"] == decimal.Decimal(2**64 - 1) and staged[0]["d65"] == "-" + NINES


def _row_reader_must_not_run(*args, **kwargs):
    raise AssertionError("the native reader fell back to the row reader")


@pytest.mark.parametrize("reader", ["native", "rows"])
def test_an_empty_chunk_stages_an_empty_file_with_the_schema_and_its_position(stack, table, tmp_path, reader):
    columns, [result] = _stage(stack, table, [Chunk(5, (10**6,), None)], tmp_path, reader)
    file = pq.read_table(tmp_path / result["data_file"])
    assert file.num_rows == result["rows"] == 0 and file.schema == arrow_schema(columns)
    assert result["chunk"] == 5 and BinlogPosition(result["binlog_file"], result["binlog_pos"]).pos > 0


@pytest.mark.parametrize("reader", ["native", "rows"])
def test_a_zero_date_is_refused_with_the_column_name(stack, tmp_path, reader, caplog):
    conn = connect(stack)
    name = unique_name("fl_zero")
    cur = conn.cursor()
    cur.execute("SET SESSION sql_mode = ''")
    cur.execute(f"CREATE TABLE `{name}` (id INT PRIMARY KEY, happened DATETIME)")
    cur.execute(f"INSERT INTO `{name}` VALUES (1, '0000-00-00 00:00:00')")
    try:
        with pytest.raises(ValueError, match="'happened' .*zero dates"):
            _stage(stack, name, [Chunk(0, None, None)], tmp_path, reader)
        # the native reader cannot convert it either: it says so, and the row reader names the column
        assert ("native reader failed" in caplog.text) == (reader == "native")
    finally:
        cur.execute(f"DROP TABLE `{name}`")
        conn.close()


@pytest.mark.parametrize("reader", ["native", "rows"])
def test_text_in_every_character_set_arrives_as_the_same_unicode(stack, tmp_path, reader):
    conn = connect(stack)
    name = unique_name("fl_charset")
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE `{name}` (id INT PRIMARY KEY, l1 VARCHAR(8) CHARACTER SET latin1, "
        "u3 VARCHAR(8) CHARACTER SET utf8mb3, ub VARCHAR(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, "
        "ch CHAR(5) CHARACTER SET latin1, tx TINYTEXT CHARACTER SET utf8mb4)"
    )
    rows = [(1, "Ünïcødé", "ßØ€ǅ", "😀𝄞", "é ", "a\x00b"), (2, "", "", "", "", ""), (3, None, None, None, None, None)]
    cur.executemany(f"INSERT INTO `{name}` VALUES (%s, %s, %s, %s, %s, %s)", rows)
    try:
        _, [result] = _stage(stack, name, [Chunk(0, None, None)], tmp_path, reader)
        staged = pq.read_table(tmp_path / result["data_file"]).to_pylist()
        cur.execute(f"SELECT * FROM `{name}` ORDER BY id")
        assert [tuple(r.values())[:-2] for r in staged] == list(cur.fetchall())  # the version and tombstone last
        assert {(r["_eo_deleted"], r["_eo_version"]) for r in staged} == {
            (False, snapshot_version(BinlogPosition(result["binlog_file"], result["binlog_pos"])))
        }
        assert staged[0]["ch"] == "é" and result["reader"] == reader  # CHAR drops trailing spaces on both
    finally:
        cur.execute(f"DROP TABLE `{name}`")
        conn.close()
