"""Watermark windows on the real MariaDB + Kafka: late commits, equal cursor values at bounds, reruns.

The workload test runs 20+ consecutive windows while a writer (a) keeps a transaction open across each
window's end that commits afterwards with an OLDER cursor value, (b) writes bursts of rows with identical
timestamps exactly at and just below the window's bound, (c) updates and soft-deletes rows already
published. The union of the published windows must equal every committed row version (primary key, cursor
value): 0 missing, 0 duplicated. A naive ``updated_at > last`` extraction run at the same moments on the same
workload must lose the late commits.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import MySQLdb
import pytest

from exactly_once_provider.kafka.offsets import read_committed_offset
from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator
from exactly_once_provider.source.watermark import TRX_CACHE_IDLE
from tests.kafka_support import new_topic, read_all

# The late-commit guard counts every open read-write transaction on the server (it cannot tell which tables a
# transaction touches), so another test's writer open at a window's end cuts the window there: these tests
# assert exact bounds and row counts, so they run alone (after the parallel part of make test).
pytestmark = pytest.mark.exclusive

FMT = "%Y-%m-%d %H:%M:%S.%f"
LAG = 0.2


@pytest.fixture
def bootstrap(stack, airflow_connections):
    return f"{stack.HOST}:{stack.KAFKA_PORT}"


def connect(stack):
    conn = MySQLdb.connect(
        host=stack.HOST,
        port=stack.MARIADB_PORT,
        user=stack.DB_USER,
        password=stack.DB_PASSWORD,
        database=stack.DB_NAME,
        autocommit=True,
        init_command="SET time_zone = '+00:00'",
    )
    return conn


def create_table(
    stack, cursor_type="TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)"
):
    name = f"wm_{uuid.uuid4().hex[:8]}"
    with connect(stack) as conn:
        conn.cursor().execute(
            f"CREATE TABLE {name} (id BIGINT AUTO_INCREMENT PRIMARY KEY, tag VARCHAR(40) NOT NULL, amount INT NOT "
            f"NULL DEFAULT 0, deleted TINYINT NOT NULL DEFAULT 0, updated_at {cursor_type}, KEY (updated_at))"
        )
    return name


def wait_server_clock(cur, until: datetime, timeout: float = 10) -> datetime:
    """Poll the server's NOW(6) (the clock the cursor values come from) until it reaches ``until``; return it.

    Fixed sleeps guessed at the server's clock; this waits exactly as long as the server needs.
    """
    deadline = time.monotonic() + timeout
    while True:
        cur.execute("SELECT NOW(6)")
        now = cur.fetchone()[0]
        if now >= until:
            return now
        assert time.monotonic() < deadline, f"the server clock is at {now}, still before {until}"
        time.sleep(0.02)


def extract(table, topic, ledger, batch_id, **kwargs):
    kwargs.setdefault("cursor_column", "updated_at")
    kwargs.setdefault("cursor_kind", "timestamp")
    return WatermarkExtractOperator(
        task_id=f"t{uuid.uuid4().hex[:6]}",
        table=table,
        topic=topic,
        pipeline=f"wm-{table}",
        offsets_topic=ledger,
        safety_lag=LAG,
        deleted_column="deleted",
        batch_id=batch_id,
        **kwargs,
    ).execute({})


def published(bootstrap, topic):
    """Return the data records of the topic (markers dropped) as parsed JSON values."""
    values = [json.loads(v) for v in read_all(bootstrap, topic)]
    return [v for v in values if "marker" not in v]


class Writer:
    """Writes the workload and records every committed row version (id, cursor text)."""

    def __init__(self, stack, table):
        self.stack, self.table = stack, table
        self.conn = connect(stack)
        self.cur = self.conn.cursor()
        self.versions: set[tuple[int, str]] = set()
        self.late_versions: set[tuple[int, str]] = set()
        self.soft_deleted = 0

    def newest(self) -> datetime:
        self.cur.execute(f"SELECT MAX(updated_at) FROM {self.table}")
        return self.cur.fetchone()[0]

    def wait_past_newest(self, lag: float = 0.0) -> datetime:
        """Wait until the server clock is more than ``lag`` seconds past the newest committed cursor value."""
        return wait_server_clock(self.cur, self.newest() + timedelta(seconds=lag, microseconds=1))

    def record(self, where, args, late=False):
        self.cur.execute(f"SELECT id, updated_at FROM {self.table} WHERE {where}", args)
        found = {(row[0], row[1].strftime(FMT)) for row in self.cur.fetchall()}
        assert found, where
        self.versions |= found
        if late:
            self.late_versions |= found

    def insert(self, tag, count, at=None):
        if at is not None:
            self.cur.execute(f"SET TIMESTAMP = {float(at):.6f}")
        self.cur.execute(
            f"INSERT INTO {self.table} (tag, amount) VALUES " + ", ".join(["(%s, %s)"] * count),
            [x for n in range(count) for x in (tag, n)],
        )
        self.cur.execute("SET TIMESTAMP = DEFAULT")
        self.record("tag = %s", (tag,))

    def open_late(self, tag):
        """Begin a transaction, insert 2 rows, keep it open; return (connection, trx_started)."""
        late = connect(self.stack)
        cur = late.cursor()
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {self.table} (tag) VALUES (%s), (%s)", (tag, tag))
        time.sleep(TRX_CACHE_IDLE)  # innodb_trx is a cache refilled only after 100 ms without a reader
        self.cur.execute(
            "SELECT trx_started FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = %s", (late.thread_id(),)
        )
        return late, self.cur.fetchone()[0]  # the system zone of the test server is UTC, like the session

    def commit_late(self, late, tag):
        late.cursor().execute("COMMIT")
        late.close()
        self.record("tag = %s", (tag,), late=True)

    def update_published(self, upper, n, soft_delete):
        self.cur.execute(
            f"SELECT id FROM {self.table} WHERE updated_at < %s AND deleted = 0 ORDER BY RAND() LIMIT {n}", (upper,)
        )
        ids = [row[0] for row in self.cur.fetchall()]
        marks = ", ".join(["%s"] * len(ids))
        self.cur.execute(f"UPDATE {self.table} SET amount = amount + 1 WHERE id IN ({marks})", ids)
        if soft_delete:
            self.cur.execute(f"UPDATE {self.table} SET deleted = 1 WHERE id = %s", (ids[0],))
            self.soft_deleted += 1
        self.record(f"id IN ({marks})", ids)


class Naive:
    """The peers' extraction: ``updated_at > last`` with the last maximum seen, no lag, no guard."""

    def __init__(self, stack, table):
        self.conn, self.table, self.last, self.seen = connect(stack), table, None, set()

    def run(self):
        cur = self.conn.cursor()
        if self.last is None:
            cur.execute(f"SELECT id, updated_at FROM {self.table}")
        else:
            cur.execute(f"SELECT id, updated_at FROM {self.table} WHERE updated_at > %s", (self.last,))
        rows = cur.fetchall()
        self.seen |= {(row[0], row[1].strftime(FMT)) for row in rows}
        self.last = max([self.last or datetime.min] + [row[1] for row in rows])


def test_windows_publish_every_row_version_once_and_the_naive_cursor_loses_late_commits(stack, bootstrap):
    table, topic, ledger = create_table(stack), new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
    writer, naive = Writer(stack, table), Naive(stack, table)
    writer.insert("seed", 20)
    # The first guard (trx_started - 1 s, whole seconds) must land above the seed rows.
    next_second = writer.newest().replace(microsecond=0) + timedelta(seconds=2)
    results, late, upper = [], None, None
    for i in range(20):
        wait_server_clock(writer.cur, next_second)
        if late is not None:
            writer.commit_late(*late)  # began before the previous window's end, commits after it
        connection, started = writer.open_late(f"late{i}")
        late = (connection, f"late{i}")
        next_second = started + timedelta(seconds=1)  # trx_started has second precision: each guard in a new second
        bound = started - timedelta(seconds=1)  # the guard: the oldest open transaction's start minus 1 s
        epoch = bound.replace(tzinfo=UTC).timestamp()
        writer.insert(f"at{i}", 5, at=epoch)  # identical cursor values exactly at this window's upper bound
        writer.insert(f"below{i}", 3, at=epoch - 0.000001)  # identical values just below it
        if upper is not None:
            writer.update_published(upper, 3, soft_delete=i % 4 == 0)  # rows already published change again
        writer.insert(f"now{i}", 4)  # a burst with one NOW(6), newer than the open transaction's rows
        writer.wait_past_newest(LAG)
        result = extract(table, topic, ledger, f"w{i:02d}")
        naive.run()
        assert (result["upper"], result["upper_reason"]) == (bound.strftime(FMT), "open_transaction"), result
        assert result["skipped"] is False and result["batch_version"] == 1
        upper = datetime.strptime(result["upper"], FMT)
        results.append(result)
    writer.commit_late(*late)
    writer.wait_past_newest(LAG)  # no open transaction left: the last window ends at the safety lag
    final = extract(table, topic, ledger, "final")
    naive.run()
    results.append(final)
    assert final["upper_reason"] == "safety_lag"

    # Consecutive half-open windows: each starts where the previous ended.
    assert [r["lower"] for r in results[1:]] == [r["upper"] for r in results[:-1]]
    records = published(bootstrap, topic)
    versions = [(r["row"]["id"], r["cursor"]) for r in records]
    assert len(versions) == len(set(versions)), "duplicated row versions"
    assert set(versions) == writer.versions, (
        f"missing {sorted(writer.versions - set(versions))[:10]}, extra {sorted(set(versions) - writer.versions)[:10]}"
    )
    assert sum(r["rows"] for r in results) == len(records) == len(writer.versions)
    assert sum(r["op"] == "delete" for r in records) == writer.soft_deleted > 0
    assert len(writer.late_versions) == 40

    lost = writer.versions - naive.seen
    assert writer.late_versions <= lost, "the naive cursor was expected to lose every late commit"
    ledger_record = read_committed_offset({"bootstrap.servers": bootstrap}, f"wm-{table}", table, ledger)
    assert ledger_record.offset["next_lower"] == final["upper"]
    assert ledger_record.offset["window"]["checksum"] == final["checksum"]
    assert ledger_record.batch_id == "final" and len(ledger_record.offset["history"]) == 21
    print(
        f"\n{len(results)} windows, {len(writer.versions)} row versions published once each; naive lost "
        f"{len(lost)} ({len(writer.late_versions)} late commits)"
    )


def test_rerun_returns_the_recorded_batch_and_reextract_publishes_a_new_version(stack, bootstrap):
    table, topic, ledger = create_table(stack), new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
    writer = Writer(stack, table)
    writer.insert("a", 10)
    interval_end = writer.wait_past_newest().replace(tzinfo=UTC)
    wait_server_clock(writer.cur, interval_end.replace(tzinfo=None) + timedelta(microseconds=1))
    writer.insert("b", 7)  # after the interval end: belongs to the next window
    writer.wait_past_newest(LAG)
    first = extract(table, topic, ledger, "2026-11-20", interval_end=interval_end.isoformat())
    assert (first["upper"], first["upper_reason"], first["rows"]) == (
        interval_end.replace(tzinfo=None).strftime(FMT),
        "interval_end",
        10,
    )
    assert first["kafka_offsets"]["0"]["records"] == 10
    second = extract(table, topic, ledger, "2026-11-21")
    assert (second["lower"], second["rows"]) == (first["upper"], 7)

    writer.update_published(datetime.strptime(first["upper"], FMT), 2, soft_delete=False)  # source moves on
    writer.insert("c", 3)
    before = read_all(bootstrap, topic)
    rerun = extract(table, topic, ledger, "2026-11-20", interval_end=interval_end.isoformat())
    assert rerun["skipped"] is True
    assert {k: v for k, v in rerun.items() if k != "skipped"} == {k: v for k, v in first.items() if k != "skipped"}
    assert read_all(bootstrap, topic) == before, "a rerun must publish nothing"

    again = extract(table, topic, ledger, "2026-11-20", reextract="True")
    assert (again["batch_version"], again["lower"], again["upper"], again["rows"]) == (
        2,
        first["lower"],
        first["upper"],
        8,
    )  # two rows moved to a later cursor value
    assert again["checksum"] != first["checksum"]
    v2 = list(published(bootstrap, topic)[len(before) - 4 :])  # after the first two framed batches
    assert len(v2) == 8 and {r["row"]["tag"] for r in v2} == {"a"}
    ledger_record = read_committed_offset({"bootstrap.servers": bootstrap}, f"wm-{table}", table, ledger)
    assert ledger_record.offset["next_lower"] == second["upper"], "a re-extract must not move the resume point"
    assert (ledger_record.batch_id, ledger_record.batch_version) == ("2026-11-20", 2)
    rerun_v2 = extract(table, topic, ledger, "2026-11-20")
    assert rerun_v2["skipped"] is True and rerun_v2["batch_version"] == 2
    assert rerun_v2["kafka_offsets"] == again["kafka_offsets"]


def test_id_cursor_waits_for_a_lower_id_that_commits_late(stack, bootstrap):
    table, topic, ledger = create_table(stack), new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
    writer = Writer(stack, table)
    writer.insert("first", 3)
    late = connect(stack)
    late.cursor().execute("BEGIN")
    late.cursor().execute(f"INSERT INTO {table} (tag) VALUES ('late')")  # takes id 4, commits after 5..7
    writer.insert("after", 3)
    reader = connect(stack).cursor()
    reader.execute(f"SELECT id FROM {table}")  # the naive `id > last` read at the same moment
    naive = {row[0] for row in reader.fetchall()}
    timer = threading.Timer(1.5, lambda: late.cursor().execute("COMMIT"))
    timer.start()
    started = time.monotonic()
    result = extract(table, topic, ledger, "ids-1", cursor_column="id", cursor_kind="id")
    timer.join()
    assert time.monotonic() - started >= 1.4, "the read must wait for the older open transaction"
    assert (result["upper"], result["rows"], result["upper_reason"]) == (8, 7, "max_id")
    assert sorted(r["row"]["id"] for r in published(bootstrap, topic)) == list(range(1, 8))
    reader.execute(f"SELECT id FROM {table} WHERE id > %s", (max(naive),))
    naive |= {row[0] for row in reader.fetchall()}
    assert naive == {1, 2, 3, 5, 6, 7}, "the naive id cursor loses id 4, committed after id 7 was read"
