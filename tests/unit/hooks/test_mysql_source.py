"""MySqlSourceHook logic against a fake DB-API connection (the real server is in tests/integration)."""

from __future__ import annotations

import MySQLdb
import pytest

from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook, parse_server_version
from exactly_once_provider.positions import BinlogPosition
from tests.unit.hooks.fake_db import FakeConnection, FakeCursor


@pytest.mark.parametrize(
    "version,flavor,parsed",
    [
        ("10.11.19-MariaDB-0+deb12u1-log", "mariadb", (10, 11, 19)),
        ("11.4.2-MariaDB", "mariadb", (11, 4, 2)),
        ("8.4.3", "mysql", (8, 4, 3)),
        ("8.0.36-0ubuntu0.22.04.1", "mysql", (8, 0, 36)),
    ],
)
def test_parse_server_version(version, flavor, parsed):
    info = parse_server_version(version)
    assert (info.flavor, info.version) == (flavor, parsed)


def test_unparseable_version_is_a_clear_error():
    with pytest.raises(ValueError, match="Cannot parse server version"):
        parse_server_version("garbage")


def _hook_with(monkeypatch, answers):
    cursor = FakeCursor(answers)
    connection = FakeConnection(cursor)
    monkeypatch.setattr(MySqlSourceHook, "get_conn", lambda self: connection)
    return MySqlSourceHook(), cursor, connection


def test_mariadb_snapshot_statement_sequence_and_position(monkeypatch):
    hook, cursor, connection = _hook_with(
        monkeypatch,
        {
            "SELECT VERSION()": [("10.11.19-MariaDB-log",)],
            "SHOW STATUS LIKE 'binlog_snapshot_%'": [
                ("Binlog_snapshot_file", "binlog.000007"),
                ("Binlog_snapshot_position", "4711"),
            ],
        },
    )
    with hook.consistent_snapshot() as snapshot:
        assert snapshot.position == BinlogPosition("binlog.000007", 4711)
    assert cursor.statements[1:] == [
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
        "SHOW STATUS LIKE 'binlog_snapshot_%'",
    ]
    assert connection.rolled_back and connection.closed


def test_snapshot_without_binlog_says_to_enable_log_bin(monkeypatch):
    hook, _, connection = _hook_with(
        monkeypatch,
        {
            "SELECT VERSION()": [("10.11.19-MariaDB",)],
            "SHOW STATUS": [("Binlog_snapshot_file", ""), ("Binlog_snapshot_position", "0")],
        },
    )
    with pytest.raises(SourceConfigurationError, match="log_bin"):
        with hook.consistent_snapshot():
            pass
    assert connection.closed


def test_mysql_snapshot_takes_the_brief_lock_path(monkeypatch):
    """MySQL has no binlog_snapshot_* status: the hook uses FTWRL (details in test_mysql_snapshot.py)."""
    hook, cursor, _ = _hook_with(
        monkeypatch, {"SELECT VERSION()": [("8.4.3",)], "SHOW BINARY LOG STATUS": [("binlog.000002", 157, "", "", "")]}
    )
    with hook.consistent_snapshot() as snapshot:
        assert snapshot.position == BinlogPosition("binlog.000002", 157)
    assert "FLUSH TABLES WITH READ LOCK" in cursor.statements
    assert cursor.statements[-1] == "UNLOCK TABLES"


def test_missing_host_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_NO_HOST", '{"conn_type": "mysql", "login": "u"}')
    with pytest.raises(ValueError, match="no host"):
        MySqlSourceHook(mysql_conn_id="no_host").get_conn()


def test_connection_uses_utc_sessions(monkeypatch):
    seen = {}
    monkeypatch.setenv(
        "AIRFLOW_CONN_SRC",
        '{"conn_type": "mysql", "host": "db", "port": 3307, "login": "u", "password": "secret", "schema": "shop"}',
    )
    monkeypatch.setattr(MySQLdb, "connect", lambda **kwargs: seen.update(kwargs) or "conn")
    assert MySqlSourceHook(mysql_conn_id="src").get_conn() == "conn"
    assert seen["init_command"] == "SET time_zone = '+00:00'"
    assert (seen["host"], seen["port"], seen["database"], seen["charset"]) == ("db", 3307, "shop", "utf8mb4")
