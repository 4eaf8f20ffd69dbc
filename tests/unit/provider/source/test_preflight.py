"""Preflight checks against a fake cursor: server settings the shared test server cannot be switched to."""

from __future__ import annotations

import MySQLdb
import pytest

from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.source import preflight
from tests.unit.hooks.fake_db import FakeCursor

GOOD = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
    "binlog_expire_logs_seconds": "604800",
    "expire_logs_days": "7",
}


def test_good_settings_pass():
    preflight.check_binlog_settings(GOOD)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"log_bin": "OFF"}, r"log_bin=OFF.*log_bin=binlog in my.cnf"),
        ({"binlog_format": "MIXED"}, r"binlog_format=MIXED .* SET GLOBAL binlog_format='ROW'"),
        ({"binlog_row_image": "MINIMAL"}, r"binlog_row_image=MINIMAL .* SET GLOBAL binlog_row_image='FULL'"),
        ({"binlog_row_metadata": "NO_LOG"}, r"binlog_row_metadata=NO_LOG .* SET GLOBAL binlog_row_metadata='FULL'"),
    ],
)
def test_each_bad_setting_names_the_fix(change, message):
    with pytest.raises(SourceConfigurationError, match=message):
        preflight.check_binlog_settings({**GOOD, **change})


def test_server_without_row_metadata_is_too_old():
    settings = {k: v for k, v in GOOD.items() if k != "binlog_row_metadata"}
    with pytest.raises(SourceConfigurationError, match="MariaDB 10.5\\+ or MySQL 8.0.1\\+"):
        preflight.check_binlog_settings(settings)


def test_settings_are_read_as_globals():
    cursor = FakeCursor({"SHOW GLOBAL VARIABLES": [("log_bin", "ON"), ("binlog_format", "ROW")]})
    assert preflight.server_variables(cursor) == {"log_bin": "ON", "binlog_format": "ROW"}


@pytest.mark.parametrize(
    "settings,seconds",
    [
        ({"binlog_expire_logs_seconds": "3600", "expire_logs_days": "0"}, 3600),
        ({"binlog_expire_logs_seconds": "0", "expire_logs_days": "2"}, 172800),
        ({"binlog_expire_logs_seconds": "0", "expire_logs_days": "0"}, 0),
    ],
)
def test_retention_seconds(settings, seconds):
    assert preflight.retention_seconds(settings) == seconds


def test_short_retention_versus_load_time_is_refused_with_the_needed_value():
    # 10M rows at 1000 rows/s = 10000 s; 2x + 1 h margin = 23600 s needed, 1 day kept... but 1 h is not.
    preflight.check_retention({"binlog_expire_logs_seconds": "86400"}, 10_000_000, 1000)
    with pytest.raises(SourceConfigurationError, match="binlog_expire_logs_seconds to at least 23600"):
        preflight.check_retention({"binlog_expire_logs_seconds": "3600"}, 10_000_000, 1000)
    preflight.check_retention({"binlog_expire_logs_seconds": "0"}, 10_000_000, 1)  # 0 = kept forever
    with pytest.raises(ValueError, match="expected_rows_per_second"):
        preflight.check_retention(GOOD, 1, 0)


def test_mysql_needs_reload_for_the_lock():
    cursor = FakeCursor(
        {
            "SHOW BINARY LOGS": [("binlog.000001", 4)],
            "SELECT PRIVILEGE_TYPE": [("SELECT",), ("REPLICATION SLAVE",), ("REPLICATION CLIENT",)],
        }
    )
    with pytest.raises(SourceConfigurationError, match="GRANT RELOAD"):
        preflight.check_privileges(cursor, is_mariadb=False)
    preflight.check_privileges(cursor, is_mariadb=True)


def test_mysql_binlog_listing_denied_names_replication_client():
    cursor = FakeCursor({"SHOW BINARY LOGS": MySQLdb.OperationalError(1227, "Access denied")})
    with pytest.raises(SourceConfigurationError, match="GRANT REPLICATION CLIENT"):
        preflight.check_privileges(cursor, is_mariadb=False)


def test_view_is_refused():
    cursor = FakeCursor({"SELECT TABLE_TYPE": [("VIEW", 0)]})
    with pytest.raises(SourceConfigurationError, match="is a VIEW, not a base table"):
        preflight.check_table_readable(cursor, "s", "v")
