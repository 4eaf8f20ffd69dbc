"""Helpers for tests on the real MariaDB: connections, tables, rows normalised for comparison."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import subprocess
import uuid
from collections import Counter

import MySQLdb


def connect(stack, **kwargs):
    return MySQLdb.connect(
        host=stack.HOST,
        port=stack.MARIADB_PORT,
        user=kwargs.pop("user", stack.DB_USER),
        password=kwargs.pop("password", stack.DB_PASSWORD),
        database=stack.DB_NAME,
        autocommit=True,
        charset="utf8mb4",
        init_command="SET time_zone = '+00:00'",
        **kwargs,
    )


def load_time_zone(cur, zone: str, database: str) -> None:
    """Load one zone into the server's time zone tables if missing (a fresh MariaDB has none)."""
    cur.execute("SELECT COUNT(*) FROM mysql.time_zone_name WHERE Name = %s", (zone,))
    if cur.fetchone()[0]:
        return
    sql = subprocess.run(
        ["mariadb-tzinfo-to-sql", f"/usr/share/zoneinfo/{zone}", zone], check=True, capture_output=True, text=True
    ).stdout
    cur.execute("USE mysql")
    for statement in sql.split(";\n"):
        if statement.strip():
            cur.execute(statement)
    cur.execute("UNLOCK TABLES")
    cur.execute(f"USE `{database.replace('`', '``')}`")


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _time_text(value: dt.timedelta) -> str:
    # Independent of the loader's formatter: via total seconds.
    total = round(value.total_seconds() * 1_000_000)
    sign = "-" if total < 0 else ""
    total = abs(total)
    h, rest = divmod(total, 3_600_000_000)
    m, rest = divmod(rest, 60_000_000)
    s, us = divmod(rest, 1_000_000)
    return f"{sign}{h:02d}:{m:02d}:{s:02d}" + (f".{us:06d}" if us else "")


def normalise(value):
    """One comparable, hashable form for a source (MySQLdb) or sink (Spark) value."""
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dt.timedelta):
        return _time_text(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, decimal.Decimal) and value == value.to_integral_value() and value.as_tuple().exponent == 0:
        return int(value)
    if isinstance(value, decimal.Decimal):
        return str(value)  # DECIMAL wider than 38 digits is loaded as its exact text
    return value


def source_rows(stack, table: str, columns: list[str]) -> Counter:
    conn = connect(stack)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT {', '.join('`' + c + '`' for c in columns)} FROM `{table.replace('`', '``')}`")
        return Counter(tuple(normalise(v) for v in row) for row in cur.fetchall())
    finally:
        conn.close()


def sink_rows(spark, path: str, columns: list[str]) -> Counter:
    frame = spark.read.format("delta").load(path).select(*columns)
    return Counter(tuple(normalise(v) for v in row) for row in frame.collect())


def assert_same_rows(sink: Counter, source: Counter, columns: list[str]) -> None:
    """Assert equal multisets of rows; on failure name the first differing key and columns."""
    if sink == source:
        return
    dupes = [row for row, n in sink.items() if n > 1]
    only_sink, only_source = sink - source, source - sink
    detail = (
        f"{len(dupes)} duplicated rows in the sink; {len(only_sink)} rows only in the sink; "
        f"{len(only_source)} only in the source"
    )
    by_key = {row[0]: row for row in only_sink}
    for row in only_source:
        other = by_key.get(row[0])
        if other is not None:
            diff = {c: (a, b) for c, a, b in zip(columns, row, other) if a != b}
            detail += f"; first differing key {row[0]!r}: (source, sink) = {diff}"
            break
    raise AssertionError(detail)


# Every column type the full load maps (columns.arrow_type), with a NULL in each nullable one.
ALL_TYPES = """(
  id INT NOT NULL PRIMARY KEY, d DECIMAL(12,3), big_d DECIMAL(50,10), dt DATETIME(6), ts TIMESTAMP(6) NULL,
  dd DATE, t TIME(6), j JSON, b BLOB, vb VARBINARY(16), u BIGINT UNSIGNED, ui INT UNSIGNED, ti TINYINT,
  s VARCHAR(64) CHARACTER SET utf8mb4, tx TEXT, f FLOAT, db DOUBLE, e ENUM('a','b'), y YEAR, bt BIT(8)
)"""

ALL_TYPES_COLUMNS = [
    "id",
    "d",
    "big_d",
    "dt",
    "ts",
    "dd",
    "t",
    "j",
    "b",
    "vb",
    "u",
    "ui",
    "ti",
    "s",
    "tx",
    "f",
    "db",
    "e",
    "y",
    "bt",
]


def all_types_rows(n: int) -> list[tuple]:
    """Return ``n`` rows of :data:`ALL_TYPES` with awkward values, then one row of NULLs (id ``n + 1``)."""
    rows = []
    for i in range(1, n + 1):
        rows.append(
            (
                i,
                f"{i}.125",
                f"{i}1234567890123456789.0123456789",
                f"2024-10-27 0{i % 4}:30:00.{i:06d}",
                f"2024-03-31 02:{i % 60:02d}:00.5",
                "2024-02-29",
                f"-{i % 800}:01:02.5" if i % 2 else "12:00:00",
                json.dumps({"i": i, "s": "ü😀", "a": [1, None]}),
                bytes([i % 256, 0, 255]) * 3,
                b"\x00`'\"",
                2**64 - i,
                2**32 - i,
                -128 + i % 256,
                f"ȧ😀 {i} ' \" ` ;",
                "x" * (i % 300),
                0.5,
                i / 7,
                "ab"[i % 2],
                1901 + i % 254,
                bytes([i % 256]),
            )
        )
    rows.append((n + 1,) + (None,) * 19)  # every nullable column NULL
    return rows
