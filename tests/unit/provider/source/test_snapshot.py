"""Snapshot statement sequences (MySQL 8 only against a fake cursor: no MySQL server here) and chunk SQL."""

from __future__ import annotations

import MySQLdb
import pytest

from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source.snapshot import Chunk, begin_snapshot, plan_chunks, range_predicate
from tests.unit.hooks.fake_db import FakeCursor


def test_mysql8_lock_snapshot_status_unlock_in_this_order():
    cursor = FakeCursor({"SHOW BINARY LOG STATUS": [("binlog.000009", 4711, "", "", "")]})
    assert begin_snapshot(cursor, is_mariadb=False) == BinlogPosition("binlog.000009", 4711)
    assert cursor.statements == [
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "SET SESSION lock_wait_timeout = 60",
        "FLUSH TABLES WITH READ LOCK",
        # The read view opens while writes are blocked, before UNLOCK TABLES (DBZ-9006).
        "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
        "SHOW BINARY LOG STATUS",
        "UNLOCK TABLES",
    ]


def test_mysql_before_8_2_falls_back_to_show_master_status():
    cursor = FakeCursor(
        {
            "SHOW BINARY LOG STATUS": MySQLdb.ProgrammingError(1064, "You have an error in your SQL syntax"),
            "SHOW MASTER STATUS": [("mysql-bin.000003", 157, "", "", "")],
        }
    )
    assert begin_snapshot(cursor, is_mariadb=False) == BinlogPosition("mysql-bin.000003", 157)
    assert cursor.statements[-3:] == ["SHOW BINARY LOG STATUS", "SHOW MASTER STATUS", "UNLOCK TABLES"]


def test_mysql_lock_denied_says_to_grant_reload():
    cursor = FakeCursor({"FLUSH TABLES": MySQLdb.OperationalError(1227, "Access denied; you need RELOAD")})
    with pytest.raises(SourceConfigurationError, match="GRANT RELOAD"):
        begin_snapshot(cursor, is_mariadb=False)
    assert "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY" not in cursor.statements


def test_mysql_error_while_locked_still_unlocks():
    cursor = FakeCursor({"SHOW BINARY LOG STATUS": MySQLdb.OperationalError(2013, "Lost connection")})
    with pytest.raises(MySQLdb.OperationalError):
        begin_snapshot(cursor, is_mariadb=False)
    assert cursor.statements[-1] == "UNLOCK TABLES"


def test_mysql_without_binlog_says_to_enable_log_bin():
    cursor = FakeCursor({"SHOW BINARY LOG STATUS": []})
    with pytest.raises(SourceConfigurationError, match="log_bin"):
        begin_snapshot(cursor, is_mariadb=False)
    assert cursor.statements[-1] == "UNLOCK TABLES"


def test_mariadb_takes_no_lock():
    cursor = FakeCursor(
        {"SHOW STATUS": [("Binlog_snapshot_file", "binlog.000001"), ("Binlog_snapshot_position", "328")]}
    )
    assert begin_snapshot(cursor, is_mariadb=True) == BinlogPosition("binlog.000001", 328)
    assert not any("LOCK" in s for s in cursor.statements)


def test_range_predicate_composite_key_is_lexicographic():
    sql, params = range_predicate(["a", "b"], Chunk(1, (1, "x"), (5, "y")))
    assert sql == ("((`a` > %s) OR (`a` = %s AND `b` > %s)) AND ((`a` < %s) OR (`a` = %s AND `b` <= %s))")
    assert params == [1, 1, "x", 5, 5, "y"]


def test_range_predicate_unbounded_chunk_selects_everything():
    assert range_predicate(["id"], Chunk(0, None, None)) == ("TRUE", [])


def test_plan_walks_the_key_and_ends_with_an_open_chunk():
    # Each query returns the boundary and the key after it; the third finds a boundary with no key after it
    # (the table's last key: the table holds exactly 30 rows): the open chunk reads those rows, no empty chunk.
    boundaries = iter([[(10,), (11,)], [(20,), (21,)], [(30,)]])

    class Walk(FakeCursor):
        def execute(self, sql, args=None):
            super().execute(sql, args)
            self._last = next(boundaries)

    cursor = Walk({})
    chunks = plan_chunks(cursor, "s", "t`x", ["id"], 10)
    assert chunks == [Chunk(0, None, (10,)), Chunk(1, (10,), (20,)), Chunk(2, (20,), None)]
    assert cursor.statements[0] == "SELECT `id` FROM `s`.`t``x` ORDER BY `id` LIMIT 2 OFFSET %s"
    assert cursor.params[1] == (10, 9)
    assert len(cursor.statements) == 3
    with pytest.raises(ValueError, match="chunk_rows"):
        plan_chunks(cursor, "s", "t", ["id"], 0)


class _PlaintextSession:
    """A connection whose server negotiated no TLS (what Connector/C allows despite ssl_mode=REQUIRED)."""

    closed = False

    def cursor(self):
        outer = self

        class Cursor:
            def execute(self, sql):
                assert sql == "SHOW SESSION STATUS LIKE 'Ssl_cipher'"

            def fetchone(self):
                return ("Ssl_cipher", "")

            def close(self):
                pass

        return Cursor() if not outer.closed else None

    def close(self):
        self.closed = True


def test_a_session_that_is_not_encrypted_is_refused_when_the_connection_requires_tls():
    from exactly_once_provider.source.snapshot import ConnectionSettings

    settings = ConnectionSettings(host="db", port=3306, user="u", password="p", database="d", ssl_mode="REQUIRED")
    session = _PlaintextSession()
    with pytest.raises(SourceConfigurationError, match="require encryption .* not encrypted"):
        settings._check_encrypted(session)
    assert session.closed
