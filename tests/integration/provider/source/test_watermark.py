"""Preflight of watermark tables on the real MariaDB: each misconfiguration raises what to fix."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import datetime, timedelta

import MySQLdb
import pytest

from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.source import watermark
from exactly_once_provider.source.identifiers import quote_identifier
from exactly_once_provider.source.watermark import preflight, read_window
from tests.mysql_support import load_time_zone


@pytest.fixture
def conn(stack):
    conn = _connect(stack, init_command="SET time_zone = '+00:00'")
    yield conn
    conn.close()


def table(conn, columns):
    name = f"pf_{uuid.uuid4().hex[:8]}"
    conn.cursor().execute(f"CREATE TABLE {name} ({columns})")
    return name


def test_a_missing_cursor_column_is_named_with_the_columns_that_exist(conn):
    name = table(conn, "id INT PRIMARY KEY, changed_at TIMESTAMP(6), KEY (changed_at)")
    with pytest.raises(
        SourceConfigurationError, match=r"Cursor column `updated_at` is not in .*columns: id, changed_at"
    ):
        preflight(conn, name, "updated_at", "timestamp")


def test_a_cursor_column_without_an_index_asks_for_one(conn):
    name = table(conn, "id INT PRIMARY KEY, updated_at TIMESTAMP(6), other INT, KEY (other, updated_at)")
    with pytest.raises(
        SourceConfigurationError,
        match=r"No index .* starts with cursor column `updated_at`.*"
        r"ADD INDEX \(`updated_at`\)",
    ):
        preflight(conn, name, "updated_at", "timestamp")


@pytest.mark.parametrize(
    "column_type, kind, expected",
    [
        (
            "VARCHAR(30)",
            "timestamp",
            "is VARCHAR, which cursor_kind='timestamp' does not support .*TIMESTAMP or DATETIME",
        ),
        ("TIMESTAMP(6)", "id", "is TIMESTAMP, which cursor_kind='id' does not support .*AUTO_INCREMENT"),
        ("DOUBLE", "id", "is DOUBLE"),
    ],
)
def test_an_unsupported_cursor_type_names_the_supported_ones(conn, column_type, kind, expected):
    name = table(conn, f"id INT PRIMARY KEY, c {column_type}, KEY (c)")
    with pytest.raises(SourceConfigurationError, match=expected):
        preflight(conn, name, "c", kind)


def test_other_preflight_errors(conn):
    with pytest.raises(SourceConfigurationError, match="does not exist or the connection's user cannot see it"):
        preflight(conn, "no_such_table_xyz", "c", "timestamp")
    no_pk = table(conn, "id INT, updated_at TIMESTAMP(6), KEY (updated_at)")
    with pytest.raises(SourceConfigurationError, match="has no PRIMARY KEY"):
        preflight(conn, no_pk, "updated_at", "timestamp")
    ok = table(conn, "id INT PRIMARY KEY, updated_at TIMESTAMP(6), KEY (updated_at)")
    with pytest.raises(SourceConfigurationError, match="Soft-delete column `is_deleted` is not in"):
        preflight(conn, ok, "updated_at", "timestamp", deleted_column="is_deleted")
    with pytest.raises(ValueError, match="cursor_kind='rowversion'"):
        preflight(conn, ok, "updated_at", "rowversion")


def test_timestamp_cursor_reads_in_utc_and_a_fixed_offset_datetime_gives_no_warning(conn):
    ts = preflight(conn, table(conn, "id INT PRIMARY KEY, u TIMESTAMP(3), KEY (u)"), "u", "timestamp")
    assert (ts.session_time_zone, ts.precision, ts.warnings, ts.primary_key) == ("+00:00", 3, (), ("id",))
    dt = preflight(
        conn, table(conn, "id INT PRIMARY KEY, u DATETIME, KEY (u)"), "u", "timestamp", datetime_time_zone="+08:00"
    )
    assert (dt.session_time_zone, dt.precision, dt.warnings) == ("+08:00", 0, ())


def test_datetime_in_a_zone_with_daylight_saving_warns_and_an_unknown_zone_says_how_to_load_it(conn, stack):
    name = table(conn, "id INT PRIMARY KEY, u DATETIME(6), KEY (u)")
    with pytest.raises(SourceConfigurationError, match="does not know time zone 'Mars/Olympus'.*tzinfo"):
        preflight(conn, name, "u", "timestamp", datetime_time_zone="Mars/Olympus")
    cur = conn.cursor()
    load_time_zone(cur, "Europe/Berlin", stack.DB_NAME)
    spec = preflight(conn, name, "u", "timestamp", datetime_time_zone="Europe/Berlin")
    assert len(spec.warnings) == 1 and "observes daylight saving time" in spec.warnings[0]
    assert "Use a TIMESTAMP column" in spec.warnings[0]
    cur.execute("SELECT @@session.time_zone")
    assert cur.fetchone()[0] == "+00:00", "preflight must restore the session zone"


def test_identifiers_with_backticks_are_quoted(conn):
    assert quote_identifier("a`b") == "`a``b`"
    name = table(
        conn, "`i``d` INT PRIMARY KEY, `up`` at` TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (`up`` at`)"
    )
    conn.cursor().execute(f"INSERT INTO {name} (`i``d`) VALUES (1), (2)")
    spec = preflight(conn, name, "up` at", "timestamp")
    window = read_window(conn, spec, None, fixed_upper=datetime(2100, 1, 1), log=logging.getLogger("test"))
    assert [row["i`d"] for row in window.rows] == [1, 2], window


def test_without_the_process_privilege_the_log_says_the_guard_is_off_and_the_lag_bounds_the_window(conn, stack, caplog):
    name = table(conn, "id INT PRIMARY KEY, u TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (u)")
    user = f"np_{uuid.uuid4().hex[:6]}"
    cur = conn.cursor()
    cur.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'np-pass'")
    cur.execute(f"GRANT SELECT ON {quote_identifier(stack.DB_NAME)}.* TO '{user}'@'%'")
    limited = MySQLdb.connect(
        host=stack.HOST,
        port=stack.MARIADB_PORT,
        user=user,
        password="np-pass",
        database=stack.DB_NAME,
        autocommit=True,
        init_command="SET time_zone = '+00:00'",
    )
    other = _connect(stack)
    try:
        other.cursor().execute("BEGIN")
        other.cursor().execute(f"INSERT INTO {name} (id) VALUES (1)")  # an open writer the guard cannot see
        spec = preflight(limited, name, "u", "timestamp")
        with caplog.at_level(logging.WARNING):
            window = read_window(limited, spec, None, safety_lag=2.5, log=logging.getLogger("test"))
        assert "Cannot read information_schema.innodb_trx" in caplog.text and "Grant PROCESS" in caplog.text
        assert (window.upper_reason, window.guard) == (
            "safety_lag",
            "off (innodb_trx not readable or kept stale); safety lag only",
        )
    finally:
        other.close()
        limited.close()
        cur.execute(f"DROP USER '{user}'@'%'")


@pytest.mark.parametrize("cursor_kind", ["timestamp", "id"])
def test_a_writer_begun_right_after_another_reader_of_innodb_trx_still_holds_the_window(conn, stack, cursor_kind):
    # innodb_trx is a cache InnoDB refills only after 100 ms without a reader: a guard that read it right
    # after someone else would not see this writer, and its row (below upper) would never be extracted.
    name = table(
        conn, "id INT AUTO_INCREMENT PRIMARY KEY, u TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (u)"
    )
    conn.cursor().execute(f"INSERT INTO {name} (id, u) VALUES (1, NOW(6) - INTERVAL 5 SECOND)")
    spec = preflight(conn, name, "u" if cursor_kind == "timestamp" else "id", cursor_kind)
    monitor = conn.cursor()
    writer = _connect(stack)
    reader = _connect(stack, init_command="SET time_zone = '+00:00'")
    try:
        monitor.execute("SELECT COUNT(*) FROM information_schema.innodb_trx")  # fills the cache without the writer
        writer.cursor().execute("BEGIN")
        writer.cursor().execute(f"INSERT INTO {name} (id) VALUES (2)")
        if cursor_kind == "id":  # a committed higher id: the writer's id 2 is below MAX(id)
            conn.cursor().execute(f"INSERT INTO {name} (id) VALUES (3)")
            threading.Timer(1.0, lambda: writer.cursor().execute("COMMIT")).start()
        window = read_window(
            reader, spec, None, safety_lag=0, open_transaction_timeout=30, log=logging.getLogger("test")
        )
        if cursor_kind == "timestamp":
            writer.cursor().execute("COMMIT")
            assert window.upper_reason == "open_transaction", window
            assert [row["id"] for row in window.rows] == [1], window
        else:  # the read waited for the writer: its id is in the window
            assert (window.upper, window.guard) == (4, "older open transactions ended"), window
            assert [row["id"] for row in window.rows] == [1, 2, 3], window
    finally:
        writer.close()
        reader.close()


def _connect(stack, **kwargs):
    return MySQLdb.connect(
        host=stack.HOST,
        port=stack.MARIADB_PORT,
        user=stack.DB_USER,
        password=stack.DB_PASSWORD,
        database=stack.DB_NAME,
        autocommit=True,
        **kwargs,
    )


def test_guard_readers_reading_at_once_each_see_a_writer_begun_just_before(conn, stack):
    # Several pipelines read one server's innodb_trx: each read must refill the cache itself, not take the
    # answer another reader's read left (which can predate the writer).
    name = table(conn, "id INT PRIMARY KEY")
    log = logging.getLogger("test")
    readers = [_connect(stack) for _ in range(3)]
    writer = None
    try:
        for round_ in range(3):
            for reader in readers:  # warm every reader's cache entry before the writer begins
                watermark._open_transactions(reader.cursor(), log)
            writer = _begin_writer(stack, name, round_)
            writer_thread = writer.thread_id()
            seen: dict[int, set] = {}

            def guard_read(i, reader, seen=seen):
                seen[i] = watermark._open_transactions(reader.cursor(), log)

            threads = [threading.Thread(target=guard_read, args=(i, r)) for i, r in enumerate(readers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            writer.cursor().execute("ROLLBACK")
            writer.close()
            writer = None
            assert all(writer_thread in {t for t, _ in seen[i]} for i in range(3)), (round_, writer_thread, seen)
    finally:
        if writer is not None:
            writer.close()
        for reader in readers:
            reader.close()


@pytest.mark.exclusive  # its 20 ms poller keeps the server's innodb_trx stale for every other test's guard
def test_a_monitor_keeping_innodb_trx_stale_turns_the_guard_off_with_a_warning_and_the_lag_holds(conn, stack, caplog):
    name = table(conn, "id INT AUTO_INCREMENT PRIMARY KEY")
    conn.cursor().execute(f"INSERT INTO {name} (id) VALUES (1)")
    spec = preflight(conn, name, "id", "id")
    stop = threading.Event()

    def monitor():  # polls every 20 ms: InnoDB never refills the cache
        polling = _connect(stack)
        while not stop.is_set():
            polling.cursor().execute("SELECT COUNT(*) FROM information_schema.innodb_trx")
            time.sleep(0.02)
        polling.close()

    poller = threading.Thread(target=monitor)
    poller.start()
    time.sleep(0.3)
    writer = _begin_writer(stack, name, 2)  # begun after the cache's last refill: a stale read misses it
    conn.cursor().execute(f"INSERT INTO {name} (id) VALUES (3)")
    timer = threading.Timer(1.0, lambda: writer.cursor().execute("COMMIT"))
    timer.start()
    reader = _connect(stack)
    try:
        with caplog.at_level(logging.WARNING):
            window = read_window(reader, spec, None, safety_lag=2.0, log=logging.getLogger("test"))
        assert "innodb_trx stayed stale" in caplog.text and "safety lag alone" in caplog.text, caplog.text
        assert window.guard == "off (innodb_trx not readable or kept stale); waited the safety lag of 2.0s", window
        assert [row["id"] for row in window.rows] == [1, 2, 3], window  # the lag covered the writer's commit
    finally:
        stop.set()
        poller.join()
        timer.join()
        writer.close()
        reader.close()


def _begin_writer(stack, name, row_id):
    writer = _connect(stack)
    writer.cursor().execute("BEGIN")
    writer.cursor().execute(f"INSERT INTO {name} (id) VALUES ({row_id})")
    return writer


def _server_now(conn):
    cur = conn.cursor()
    cur.execute("SELECT NOW(6)")
    return cur.fetchone()[0]


def _wait_server_past(conn, moment):
    while _server_now(conn) <= moment:
        time.sleep(0.05)


@pytest.mark.exclusive  # waits for every transaction on the server begun before the interval end
def test_a_closed_interval_waits_for_its_open_writers_instead_of_moving_their_rows_to_the_next_night(conn, stack):
    name = table(conn, "id INT PRIMARY KEY, u TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (u)")
    conn.cursor().execute(f"INSERT INTO {name} (id) VALUES (1)")
    spec = preflight(conn, name, "u", "timestamp")
    early = _begin_writer(stack, name, 2)  # began before the interval end: its row belongs to this night
    interval_end = _server_now(conn)
    _wait_server_past(conn, interval_end + timedelta(seconds=2))
    late = _begin_writer(stack, name, 3)  # began after the end + the guard's margin: never holds the window
    threading.Timer(1.5, lambda: early.cursor().execute("COMMIT")).start()
    try:
        window = read_window(
            conn,
            spec,
            None,
            interval_end=interval_end,
            safety_lag=0.5,
            open_transaction_timeout=60,
            log=logging.getLogger("test"),
        )
        assert (window.upper, window.upper_reason) == (interval_end, "interval_end"), window
        assert [row["id"] for row in window.rows] == [1, 2], window
        assert window.guard.startswith("waited for 1 transaction(s) begun before the interval end"), window
    finally:
        early.close()
        late.close()


@pytest.mark.exclusive
def test_a_writer_of_a_closed_interval_that_never_ends_fails_the_read_naming_its_thread(conn, stack):
    name = table(conn, "id INT PRIMARY KEY, u TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (u)")
    spec = preflight(conn, name, "u", "timestamp")
    writer = _begin_writer(stack, name, 1)
    try:
        interval_end = _server_now(conn)
        _wait_server_past(conn, interval_end)
        with pytest.raises(
            TimeoutError,
            match=rf"\({writer.thread_id()}, .*stayed open over 1s and may still commit "
            r"cursor values below the interval end.*open_transaction_timeout",
        ):
            read_window(
                conn,
                spec,
                None,
                interval_end=interval_end,
                safety_lag=0,
                open_transaction_timeout=1,
                log=logging.getLogger("test"),
            )
    finally:
        writer.close()
