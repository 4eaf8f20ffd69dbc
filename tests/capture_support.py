"""Shared by the binlog capture tests: a concurrent writer that logs its GTIDs, and the replay oracle."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
import threading
import time
from collections import Counter, defaultdict

import MySQLdb

from tests.kafka_support import read_all
from tests.mysql_support import connect

TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"
SAME_TS = dt.datetime(2026, 1, 1, 12, 0, 0)  # many rows share this timestamp


def create_tables(cur, main: str, side: str) -> None:
    cur.execute(
        f"CREATE TABLE `{main}` (id INT PRIMARY KEY, grp INT NOT NULL, amount DECIMAL(14,2) NOT NULL, "
        "note VARCHAR(64), ts TIMESTAMP(6) NULL, dt DATETIME(6) NULL)"
    )
    cur.execute(f"CREATE TABLE `{side}` (id INT PRIMARY KEY, main_id INT NOT NULL, qty INT UNSIGNED NOT NULL)")


def seed(cur, main: str, rows: int) -> None:
    cur.executemany(
        f"INSERT INTO `{main}` VALUES (%s, %s, %s, %s, %s, %s)",
        [(i, i % 7, decimal.Decimal(i) / 4, f"seed-{i}", SAME_TS, SAME_TS) for i in range(rows)],
    )


class Writer(threading.Thread):
    """
    Random transactions on the two tables; logs each commit's GTID and the row changes it made.

    Ids below ``reserved`` are left alone (for the long transaction of the test).
    """

    def __init__(
        self,
        stack,
        main: str,
        side: str,
        seeded: int,
        reserved: int = 10,
        seed_value: int = 7,
        pause: float = 0.005,
        tag_prefix: str = "w",
    ) -> None:
        super().__init__(daemon=True)
        self.tag_prefix = tag_prefix
        self.stack, self.main, self.side, self.pause = stack, main, side, pause
        self.rnd = random.Random(seed_value)
        self.live = set(range(reserved, seeded))
        self.next_id = 1_000_000
        self.side_ids: list[int] = []
        self.committed: list[tuple[str, int, str]] = []  # (gtid, changes, tag)
        self.rolled_back: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = connect(self.stack)
            cur = conn.cursor()
            n = 0
            while not self.stop.is_set():
                n += 1
                self.transaction(cur, f"{self.tag_prefix}{n}")
                time.sleep(self.pause)
            conn.close()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err

    def transaction(self, cur, tag: str) -> None:
        kind = self.rnd.choice(
            ["insert", "multi_insert", "update", "delete", "multi_table", "rollback", "same_ts", "update"]
        )
        cur.execute("BEGIN")
        changes = 0
        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        if kind in ("insert", "multi_insert", "same_ts", "rollback"):
            count = 1 if kind == "insert" else self.rnd.randint(2, 12)
            ids = [self._new_id() for _ in range(count)]
            ts = SAME_TS if kind == "same_ts" else now
            cur.executemany(
                f"INSERT INTO `{self.main}` VALUES (%s, %s, %s, %s, %s, %s)",
                [(i, i % 7, decimal.Decimal(self.rnd.randint(0, 10**6)) / 100, tag, ts, ts) for i in ids],
            )
            changes += count
            if kind == "rollback":
                cur.execute(f"UPDATE `{self.main}` SET note = %s WHERE id = %s", (tag, self._pick()))
                cur.execute("ROLLBACK")
                self.rolled_back.append(tag)
                return
            self.live.update(ids)
        elif kind == "update":
            for i in {self._pick() for _ in range(self.rnd.randint(1, 4))}:
                changes += cur.execute(
                    f"UPDATE `{self.main}` SET amount = amount + 1, note = %s, ts = %s WHERE id = %s", (tag, now, i)
                )
        elif kind == "delete":
            i = self._pick()
            changes += cur.execute(f"DELETE FROM `{self.main}` WHERE id = %s", (i,))
            self.live.discard(i)
        else:  # multi_table
            i = self._new_id()
            cur.execute(f"INSERT INTO `{self.main}` VALUES (%s, 1, 1.00, %s, %s, %s)", (i, tag, now, now))
            self.live.add(i)
            cur.execute(
                f"INSERT INTO `{self.side}` (id, main_id, qty) VALUES (%s, %s, %s)",
                (i, i, self.rnd.randint(0, 2**32 - 1)),
            )
            self.side_ids.append(i)
            changes += 2
            if len(self.side_ids) > 1:
                changes += cur.execute(
                    f"UPDATE `{self.side}` SET qty = qty DIV 2 + 1, main_id = main_id + 1 WHERE id = %s",
                    (self.rnd.choice(self.side_ids[:-1]),),
                )
        cur.execute("COMMIT")
        cur.execute("SELECT @@last_gtid")
        self.committed.append((cur.fetchone()[0], changes, tag))

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _pick(self) -> int:
        return self.rnd.choice(sorted(self.live))


def gtid_seq(gtid: str) -> int:
    return int(gtid.rsplit("-", 1)[1])


def gtid_at(stack, position) -> int:
    """Return the sequence number of the last GTID at or before a binlog position (MariaDB BINLOG_GTID_POS)."""
    conn = connect(stack)
    try:
        cur = conn.cursor()
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (position.file, position.pos))
        state = cur.fetchone()[0]
        return max(gtid_seq(g) for g in state.split(",") if g.startswith("0-")) if state else 0
    finally:
        conn.close()


def topic_records(stack, topic: str) -> list[dict]:
    return [json.loads(v) for v in read_all(f"{stack.HOST}:{stack.KAFKA_PORT}", topic)]


def main_row(values: dict) -> tuple:
    """A row of the main table as comparable text (record images, source rows and Spark rows alike)."""

    def stamp(v):
        if v is None:
            return None
        if isinstance(v, str):
            v = dt.datetime.fromisoformat(v.removesuffix("Z"))
        return v.strftime(TS_FORMAT)

    return (
        int(values["id"]),
        int(values["grp"]),
        str(decimal.Decimal(str(values["amount"]))),
        values["note"],
        stamp(values["ts"]),
        stamp(values["dt"]),
    )


def full_load_rows(sink: str) -> dict:
    """Read a full load's Delta table (one overwrite commit) with pyarrow: ``{pk json: row}`` (no Spark job)."""
    import urllib.parse
    from pathlib import Path

    import pyarrow.parquet as pq

    commits = sorted(Path(sink, "_delta_log").glob("*.json"))
    assert [c.stem for c in commits] == ["0" * 20], f"expected one publish commit, found {commits}"
    files = [
        urllib.parse.unquote(json.loads(line)["add"]["path"])
        for line in commits[0].read_text().splitlines()
        if '"add"' in line
    ]
    rows = {}
    for name in files:
        for row in pq.read_table(Path(sink, name)).to_pylist():
            for column in ("ts", "dt"):
                if row[column] is not None and row[column].tzinfo is not None:
                    row[column] = row[column].astimezone(dt.UTC).replace(tzinfo=None)
            rows[json.dumps({"id": row["id"]})] = row
    return rows


def replay(base: dict, records: list[dict]) -> dict:
    """Apply change records (by version) onto ``{pk: row}``; return the result."""
    state = dict(base)
    for record in sorted(records, key=lambda r: r["version"]):
        key = json.dumps(record["pk"], sort_keys=True)
        if record["op"] == "d":
            state.pop(key, None)
        else:
            state[key] = record["after"]
    return state


def source_table(stack, table: str) -> list[dict]:
    conn = connect(stack, cursorclass=MySQLdb.cursors.DictCursor)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT * FROM `{table}`")
        return list(cur.fetchall())
    finally:
        conn.close()


def check_transactions(
    records: list[dict],
    committed: list[tuple[str, int, str]],
    rolled_back: list[str],
    filtered_up_to: int,
    tables: set[str],
) -> dict:
    """
    Check every committed writer transaction appears exactly once; return counts for the report.

    Transactions after ``filtered_up_to`` (GTID sequence of the largest chunk position) must have all their
    changes; earlier ones may have changes dropped as already loaded, never extra ones.
    """
    ours = [r for r in records if r["source"]["table"] in tables]
    seen = Counter((r["source"]["gtid"], r["source"]["txn_row"]) for r in ours)
    duplicated = sum(n - 1 for n in seen.values())
    by_gtid: dict[str, list[dict]] = defaultdict(list)
    for r in ours:
        by_gtid[r["source"]["gtid"]].append(r)
    lost = 0
    for gtid, changes, _tag in committed:
        got = by_gtid.get(gtid, [])
        if got:
            assert {r["source"]["txn_rows"] for r in got} == {changes}, (gtid, changes, got[:2])
        if gtid_seq(gtid) > filtered_up_to:
            lost += changes - len({r["source"]["txn_row"] for r in got})
    leaked = [r for r in ours if r["after"] and r["after"].get("note") in set(rolled_back)]
    assert not leaked, f"rolled-back changes in the topic: {leaked[:3]}"
    return {"records": len(ours), "duplicated": duplicated, "lost": lost}
