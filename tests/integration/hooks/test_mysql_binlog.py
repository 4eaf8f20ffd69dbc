"""The binlog reader on the real MariaDB: types match the server's SELECT, rollbacks never appear, file/pos
resume at a transaction boundary, a purged position asks for a full reload."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import time

import MySQLdb
import pytest

from exactly_once_provider.hooks.mysql_binlog import MySqlBinlogHook
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source.binlog import PurgedPositionError, SourceTransaction
from tests.mysql_support import connect, unique_name

COLUMNS = (
    "id INT UNSIGNED PRIMARY KEY, d DECIMAL(30,10), f FLOAT, dbl DOUBLE, dt DATETIME(6), ts TIMESTAMP(3) NULL, "
    "dd DATE, t TIME(2), y YEAR, j JSON, b BLOB, bn BINARY(4), vb VARBINARY(10), e ENUM('a','b','c'), "
    "st SET('x','y','z'), bu BIGINT UNSIGNED, tu TINYINT UNSIGNED, ch CHAR(5), txt TEXT, bt BIT(10), n INT"
)
ROWS = [
    (
        4294967295,
        "12345678901234567890.0123456789",
        0.1,
        2.25,
        "2026-03-29 02:30:00.123456",
        "2026-11-21 10:00:00.5",
        "2026-01-02",
        "-12:34:56.78",
        2024,
        '{"a": [1, 2.50, "x"], "b": null}',
        b"\x00\xff\x10",
        b"\x01\x02",
        b"\x00",
        "b",
        "x,z",
        18446744073709551615,
        255,
        "ab",
        "héllo ✓",
        0b1010101010,
        None,
    ),
    (
        2,
        "-0.0000000001",
        -1.5,
        -1e300,
        "1000-01-01 00:00:00",
        "1970-01-01 00:00:01",
        "9999-12-31",
        "838:59:59",
        1901,
        "[]",
        b"",
        b"\x00\x00\x00\x01",
        b"",
        "a",
        "",
        0,
        0,
        "",
        "",
        0,
        -2147483648,
    ),
    (
        3,
        None,
        None,
        None,
        None,
        None,
        None,
        "-00:00:00.01",
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    ),
]


def _expected(row: dict) -> dict:
    """The JSON form of a row as the server's SELECT (MySQLdb) returns it: an independent conversion."""
    out = {}
    for name, value in row.items():
        if value is None:
            out[name] = None
        elif isinstance(value, decimal.Decimal):
            out[name] = str(value)
        elif name == "ts":
            out[name] = value.isoformat() + "Z"
        elif isinstance(value, (dt.datetime, dt.date)):
            out[name] = value.isoformat()
        elif isinstance(value, dt.timedelta):
            micros = round(value.total_seconds() * 1e6)
            sign, micros = ("-" if micros < 0 else ""), abs(micros)
            h, rest = divmod(micros, 3_600_000_000)
            m, rest = divmod(rest, 60_000_000)
            s, us = divmod(rest, 1_000_000)
            out[name] = f"{sign}{h:02d}:{m:02d}:{s:02d}" + (f".{us:06d}" if us else "")
        elif isinstance(value, bytes) and name in ("j", "txt"):
            out[name] = value.decode()
        elif isinstance(value, bytes):
            out[name] = base64.b64encode(value).decode()
        elif name == "st":
            out[name] = sorted(value) if isinstance(value, set) else sorted(filter(None, value.split(",")))
        else:
            out[name] = value
    return out


def _end(cur) -> BinlogPosition:
    cur.execute("SHOW MASTER STATUS")
    file, pos = cur.fetchone()[:2]
    return BinlogPosition(file, int(pos))


def _read(hook, tables, start, until):
    reader = hook.reader(tables, server_id=4_000_001)
    try:
        return list(reader.transactions(start, until))
    finally:
        reader.close()


def test_every_type_matches_the_servers_select_and_rollbacks_never_appear(stack, airflow_connections):
    table, plain = unique_name("bl_types"), unique_name("bl_aria")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` ({COLUMNS})")
    cur.execute(f"CREATE TABLE `{plain}` (id INT PRIMARY KEY) ENGINE=Aria TRANSACTIONAL=0")
    start = _end(cur)
    cur.executemany(f"INSERT INTO `{table}` VALUES ({', '.join(['%s'] * 21)})", ROWS)
    other = connect(stack)
    other.autocommit(False)
    other.cursor().execute(f"INSERT INTO `{table}` (id) VALUES (99)")
    other.rollback()  # InnoDB: never written to the binlog
    other.cursor().execute(f"INSERT INTO `{table}` (id) VALUES (98)")
    other.cursor().execute(f"INSERT INTO `{plain}` VALUES (1)")  # non-transactional: forces a ROLLBACK group
    other.rollback()
    other.close()
    cur.execute(f"UPDATE `{table}` SET n = 7 WHERE id = 2")
    until = _end(cur)
    key = {(stack.DB_NAME, table): ("id",)}
    items = _read(MySqlBinlogHook(), key, start, until)
    rows = [r for t in items if isinstance(t, SourceTransaction) for r in t.rows]
    assert [(r.op, r.key_after or r.key_before) for r in rows] == [
        ("c", (4294967295,)),
        ("c", (2,)),
        ("c", (3,)),
        ("u", (2,)),
    ]
    dict_cur = connect(stack, cursorclass=MySQLdb.cursors.DictCursor).cursor()
    dict_cur.execute(f"SELECT * FROM `{table}` ORDER BY id")
    source = {r["id"]: _expected(r) for r in dict_cur.fetchall()}
    assert {r.after["id"]: r.after for r in rows[:3]}[4294967295] == source[4294967295]
    assert rows[1].after == dict(source[2], n=-2147483648)  # n was updated to 7 after the insert
    assert rows[2].after == source[3]
    assert rows[3].after == source[2] and rows[3].before == rows[1].after
    assert items[-1].end == until
    assert rows[0].shape.key_of({"id": 1}) == (1,)
    cur.execute(f"DROP TABLE `{table}`, `{plain}`")
    conn.close()


def test_resume_at_a_transaction_boundary_reads_the_rest_exactly(stack, airflow_connections):
    table = unique_name("bl_resume")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY)")
    start = _end(cur)
    for i in range(6):
        cur.execute("BEGIN")
        cur.executemany(f"INSERT INTO `{table}` VALUES (%s)", [(i * 10 + k,) for k in range(3)])
        cur.execute("COMMIT")
    until = _end(cur)
    hook, key = MySqlBinlogHook(), {(stack.DB_NAME, table): ("id",)}
    everything = [t for t in _read(hook, key, start, until) if t.rows]
    middle = everything[2].end
    rest = [t for t in _read(hook, key, middle, until) if t.rows]
    assert [t.gtid for t in rest] == [t.gtid for t in everything[3:]]
    assert [[r.key_after for r in t.rows] for t in rest] == [[(i * 10 + k,) for k in range(3)] for i in range(3, 6)]
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()


def _purge_to(cur, keep: str, gone: str) -> None:
    """Purge the binlog before ``keep``; the server skips files a replica still reads, so end those dump threads
    first (a live capture reconnects on its own)."""
    for _ in range(20):
        cur.execute("PURGE BINARY LOGS TO %s", (keep,))
        cur.execute("SHOW BINARY LOGS")
        if gone not in [row[0] for row in cur.fetchall()]:
            return
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND = 'Binlog Dump'")
        for (thread,) in cur.fetchall():
            cur.execute("KILL %s", (thread,))
        time.sleep(0.5)
    raise AssertionError(f"{gone} could not be purged")


@pytest.mark.exclusive  # purges binlogs other tests' positions may still need, and ends their dump threads
def test_a_purged_start_position_asks_for_a_full_reload(stack, airflow_connections):
    conn = connect(stack)
    cur = conn.cursor()
    old = _end(cur)
    cur.execute("FLUSH BINARY LOGS")
    current = _end(cur)
    _purge_to(cur, current.file, old.file)
    hook = MySqlBinlogHook()
    with pytest.raises(PurgedPositionError, match=r"purged.*full_reload=true"):
        hook.check_capture(old)
    reader = hook.reader({(stack.DB_NAME, "none"): ("id",)}, server_id=4_000_002, reconnect_timeout=5)
    with pytest.raises(PurgedPositionError, match="full_reload=true"):
        list(reader.transactions(old))  # the server refuses too: never a silent skip
    hook.check_capture(current)
    conn.close()
