"""The fast row decoder on the real MariaDB: on every type it takes, each row equals python-mysql-replication's."""

from __future__ import annotations

import random

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from exactly_once_provider.hooks.mysql_binlog import MySqlBinlogHook
from exactly_once_provider.source.row_decoder import row_decoder
from tests.mysql_support import connect, unique_name

COLUMNS = [
    ("ti", "TINYINT", lambda r: r.randint(-128, 127)),
    ("tu", "TINYINT UNSIGNED", lambda r: r.randint(0, 255)),
    ("si", "SMALLINT", lambda r: r.randint(-32768, 32767)),
    ("su", "SMALLINT UNSIGNED", lambda r: r.randint(0, 65535)),
    ("mi", "MEDIUMINT", lambda r: r.randint(-(2**23), 2**23 - 1)),
    ("mu", "MEDIUMINT UNSIGNED", lambda r: r.randint(0, 2**24 - 1)),
    ("i", "INT", lambda r: r.randint(-(2**31) + 1, 2**31 - 1)),
    ("iu", "INT UNSIGNED", lambda r: r.randint(0, 2**32 - 1)),
    ("bi", "BIGINT", lambda r: r.randint(-(2**63), 2**63 - 1)),
    ("bu", "BIGINT UNSIGNED", lambda r: r.randint(0, 2**64 - 1)),
    ("f", "FLOAT", lambda r: r.uniform(-1e6, 1e6)),
    ("db", "DOUBLE", lambda r: r.uniform(-1e300, 1e300)),
    ("y", "YEAR", lambda r: r.randint(1901, 2155)),
    ("d1", "DECIMAL(12,3)", lambda r: f"{r.randint(-(10**9) + 1, 10**9 - 1)}.{r.randint(0, 999):03d}"),
    ("d2", "DECIMAL(50,10)", lambda r: f"{r.choice('-')}{r.randint(0, 10**40 - 1)}.{r.randint(0, 10**10 - 1):010d}"),
    ("d3", "DECIMAL(5,0)", lambda r: r.randint(-99999, 99999)),
    ("d4", "DECIMAL(2,2)", lambda r: f"{r.choice(['-', ''])}0.{r.randint(0, 99):02d}"),
    ("d5", "DECIMAL(18,9)", lambda r: f"{r.randint(-(10**9) + 1, 10**9 - 1)}.{r.randint(0, 10**9 - 1):09d}"),
    ("dd", "DATE", lambda r: f"{r.randint(1000, 9999)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"),
    (
        "t0",
        "DATETIME",
        lambda r: (
            f"{r.randint(1000, 9999)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} {r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}"
        ),
    ),
    ("t1", "DATETIME(1)", lambda r: f"2024-02-29 23:59:59.{r.randint(0, 9)}"),
    ("t3", "DATETIME(3)", lambda r: f"1970-01-01 00:00:00.{r.randint(0, 999):03d}"),
    ("t6", "DATETIME(6)", lambda r: f"9999-12-31 23:59:59.{r.randint(0, 999999):06d}"),
    (
        "ts0",
        "TIMESTAMP NULL",
        lambda r: f"{r.randint(1971, 2037)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} 12:00:00",
    ),
    ("ts3", "TIMESTAMP(3) NULL", lambda r: f"2038-01-19 03:14:07.{r.randint(0, 999):03d}"),
    ("ts6", "TIMESTAMP(6) NULL", lambda r: f"1970-01-01 00:00:01.{r.randint(0, 999999):06d}"),
    ("v1", "VARCHAR(10) CHARACTER SET latin1", lambda r: r.choice(["", "abc", "é ü ñ", "x" * 10])),
    ("v2", "VARCHAR(300) CHARACTER SET utf8mb4", lambda r: "ȧ😀 ' \" ` ;" * r.randint(0, 25)),
    ("c", "CHAR(5)", lambda r: r.choice(["", "a", "abcde"])),
    ("tx", "TEXT", lambda r: "x" * r.randint(0, 3000)),
    ("mt", "MEDIUMTEXT CHARACTER SET utf8mb4", lambda r: "✓" * r.randint(0, 100)),
    ("e", "ENUM('a','bb','ccc')", lambda r: r.choice(["a", "bb", "ccc"])),
]


def _changes(cur, table, rng):
    names = ["id"] + [name for name, _, _ in COLUMNS]
    for first in range(0, 300, 50):  # multi-row events; every 7th row all NULL, others NULL here and there
        rows = []
        for i in range(first, first + 50):
            rows.append([i] + [None if i % 7 == 0 or rng.random() < 0.1 else make(rng) for _, _, make in COLUMNS])
        cur.executemany(f"INSERT INTO `{table}` ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})", rows)
    cur.execute(f"UPDATE `{table}` SET i = -i, v2 = CONCAT(v2, 'ü'), d2 = -d2 WHERE id % 3 = 0")
    updated = cur.rowcount  # rows the update left as they were (all NULL) are not in the binlog
    cur.execute(f"DELETE FROM `{table}` WHERE id % 5 = 0")
    return 300 + updated + cur.rowcount


def test_the_fast_decoder_gives_every_row_exactly_as_the_library_and_leaves_zero_dates_to_it(
    stack, airflow_connections
):
    table = unique_name("rd")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE `{table}` (id INT PRIMARY KEY, " + ", ".join(f"{name} {kind}" for name, kind, _ in COLUMNS) + ")"
    )
    cur.execute("SHOW MASTER STATUS")
    start = cur.fetchone()[:2]
    changes = _changes(cur, table, random.Random(7))
    cur.execute("SET SESSION sql_mode = ''")  # lets a zero date in: the library reports it, the decoder must not
    cur.execute(f"INSERT INTO `{table}` (id, dd, t6) VALUES (1000, '0000-00-00', '0000-00-00 00:00:00')")
    cur.execute("SHOW MASTER STATUS")
    end = cur.fetchone()[:2]

    settings = MySqlBinlogHook().connection_settings().replication_settings()
    stream = BinLogStreamReader(
        dict(settings),
        server_id=4_000_777,
        resume_stream=True,
        log_file=start[0],
        log_pos=start[1],
        blocking=False,
        is_mariadb=False,
        only_tables=[table],
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        enable_logging=False,
    )
    fast_rows, kinds, fallbacks = 0, set(), 0
    try:
        for event in stream:
            decoder = row_decoder(event.columns)
            assert decoder is not None, [(c.name, c.type) for c in event.columns]
            fast = decoder.peek(event)  # leaves the bytes to the library
            fallbacks += fast is None
            library = event.rows
            if fast is not None:
                assert fast == library, type(event).__name__
                fast_rows += len(fast)
                kinds.add(type(event).__name__)
            else:
                assert any(r["none_sources"] for r in library) and any(
                    "out of date" in s for r in library for s in r["none_sources"].values()
                ), library
            if stream.log_file == end[0] and stream.log_pos >= end[1]:
                break
    finally:
        stream.close()
    assert kinds == {"WriteRowsEvent", "UpdateRowsEvent", "DeleteRowsEvent"}
    assert (fast_rows, fallbacks) == (changes, 1)
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()
