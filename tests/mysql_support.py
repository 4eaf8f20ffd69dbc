"""Helpers for tests on the real MariaDB: connections, tables, rows normalised for comparison."""

from __future__ import annotations

import datetime as dt
import decimal
import subprocess
import uuid
from collections import Counter

import MySQLdb


def connect(stack, **kwargs):
    return MySQLdb.connect(host=stack.HOST, port=stack.MARIADB_PORT, user=kwargs.pop("user", stack.DB_USER),
                           password=kwargs.pop("password", stack.DB_PASSWORD), database=stack.DB_NAME,
                           autocommit=True, charset="utf8mb4", init_command="SET time_zone = '+00:00'", **kwargs)


def load_time_zone(cur, zone: str, database: str) -> None:
    """Load one zone into the server's time zone tables if missing (a fresh MariaDB has none)."""
    cur.execute("SELECT COUNT(*) FROM mysql.time_zone_name WHERE Name = %s", (zone,))
    if cur.fetchone()[0]:
        return
    sql = subprocess.run(["mariadb-tzinfo-to-sql", f"/usr/share/zoneinfo/{zone}", zone], check=True,
                         capture_output=True, text=True).stdout
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
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
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
    detail = f"{len(dupes)} duplicated rows in the sink; {len(only_sink)} rows only in the sink; " \
             f"{len(only_source)} only in the source"
    by_key = {row[0]: row for row in only_sink}
    for row in only_source:
        other = by_key.get(row[0])
        if other is not None:
            diff = {c: (a, b) for c, a, b in zip(columns, row, other) if a != b}
            detail += f"; first differing key {row[0]!r}: (source, sink) = {diff}"
            break
    raise AssertionError(detail)
