"""Preflight on the real MariaDB: restricted users, tables without a usable key, bad global settings."""

from __future__ import annotations

import json
import uuid

import pytest

from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from tests.mysql_support import connect, unique_name


@pytest.fixture
def admin(stack):
    conn = connect(stack)
    yield conn.cursor()
    conn.close()


@pytest.fixture
def table(admin):
    name = unique_name("pf")
    admin.execute(
        f"CREATE TABLE `{name}` (id INT PRIMARY KEY, code CHAR(4) NOT NULL, opt CHAR(4) NULL, "
        "grp INT NOT NULL, UNIQUE KEY uk_code (code), UNIQUE KEY uk_opt (opt), KEY k_grp (grp))"
    )
    admin.execute(f"INSERT INTO `{name}` VALUES (1, 'a', NULL, 1), (2, 'b', NULL, 1)")
    admin.execute(f"ANALYZE TABLE `{name}`")  # TABLE_ROWS (the load-time estimate) = 2
    admin.fetchall()
    yield name
    admin.execute(f"DROP TABLE `{name}`")


@pytest.fixture
def restricted_user(stack, admin, monkeypatch):
    """Create a user with the given grants and point a connection id at it."""
    users = []

    def make(*grants: str) -> MySqlSourceHook:
        user, password = f"pf_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        admin.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (user, password))
        users.append(user)
        for grant in grants:
            admin.execute(f"GRANT {grant} TO `{user}`@'%'")
        conn_id = f"pf_{user}"
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{conn_id.upper()}",
            json.dumps(
                {
                    "conn_type": "mysql",
                    "host": stack.HOST,
                    "port": stack.MARIADB_PORT,
                    "login": user,
                    "password": password,
                    "schema": stack.DB_NAME,
                }
            ),
        )
        return MySqlSourceHook(mysql_conn_id=conn_id)

    yield make
    for user in users:
        admin.execute(f"DROP USER `{user}`@'%'")


def test_a_fit_table_passes_with_its_primary_key(stack, airflow_connections, table):
    result = MySqlSourceHook().preflight(stack.DB_NAME, table)
    assert result.server.is_mariadb and result.key.columns == ("id",) and result.key.index == "PRIMARY"


def test_least_privileges_pass(stack, airflow_connections, table, restricted_user):
    hook = restricted_user(
        f"SELECT ON `{stack.DB_NAME}`.`{table}`", "BINLOG MONITOR ON *.*", "REPLICATION SLAVE ON *.*"
    )
    assert hook.preflight(stack.DB_NAME, table).key.columns == ("id",)


def test_table_without_primary_key_is_refused_with_the_reason(stack, airflow_connections, admin):
    name = unique_name("pf_nopk")
    admin.execute(f"CREATE TABLE `{name}` (a INT, b INT NOT NULL, UNIQUE KEY ub (b))")
    try:
        with pytest.raises(
            SourceConfigurationError,
            match=r"has no PRIMARY KEY.*exactly-once is refused.*"
            r"candidates: \[\['b'\]\]",
        ):
            MySqlSourceHook().preflight(stack.DB_NAME, name)
        key = MySqlSourceHook().preflight(stack.DB_NAME, name, chunk_key=("b",)).key
        assert key.columns == ("b",) and key.index == "ub"
    finally:
        admin.execute(f"DROP TABLE `{name}`")


@pytest.mark.parametrize("chunk_key", [("opt",), ("grp",), ("code", "id")])
def test_nullable_or_non_unique_chunk_key_is_refused(stack, airflow_connections, table, chunk_key):
    with pytest.raises(SourceConfigurationError, match=r"is not a UNIQUE index of NOT NULL columns"):
        MySqlSourceHook().preflight(stack.DB_NAME, table, chunk_key=chunk_key)


def test_enum_or_set_chunk_key_is_refused_and_another_unique_key_accepted(stack, airflow_connections, admin):
    name = unique_name("pf_enum")
    admin.execute(
        f"CREATE TABLE `{name}` (state ENUM('new', 'paid', 'gone') NOT NULL, n INT NOT NULL, "
        "PRIMARY KEY (state, n), UNIQUE KEY un (n))"
    )
    try:
        with pytest.raises(SourceConfigurationError, match=r"ENUM/SET column\(s\) \['state'\].*member index"):
            MySqlSourceHook().preflight(stack.DB_NAME, name)
        assert MySqlSourceHook().preflight(stack.DB_NAME, name, chunk_key=("n",)).key.columns == ("n",)
    finally:
        admin.execute(f"DROP TABLE `{name}`")


def test_missing_table_and_hostile_name(stack, airflow_connections):
    with pytest.raises(SourceConfigurationError, match=r"was not found, or the user has no privilege"):
        MySqlSourceHook().preflight(stack.DB_NAME, "x`; DROP TABLE mysql.user; --")


def test_user_without_select_is_told_to_grant_it(stack, airflow_connections, table, admin, restricted_user):
    hook = restricted_user(
        f"INSERT ON `{stack.DB_NAME}`.`{table}`", "BINLOG MONITOR ON *.*", "REPLICATION SLAVE ON *.*"
    )
    with pytest.raises(SourceConfigurationError, match=r"cannot read .* GRANT SELECT ON"):
        hook.preflight(stack.DB_NAME, table)
    invisible = restricted_user("BINLOG MONITOR ON *.*")
    with pytest.raises(SourceConfigurationError, match=r"may not use the connection.s database.*GRANT SELECT ON"):
        invisible.preflight(stack.DB_NAME, table)
    other = unique_name("pf_other")
    admin.execute(f"CREATE TABLE `{other}` (id INT PRIMARY KEY)")
    try:
        other_table_only = restricted_user(f"SELECT ON `{stack.DB_NAME}`.`{other}`", "BINLOG MONITOR ON *.*")
        with pytest.raises(
            SourceConfigurationError, match=r"was not found, or the user has no privilege.*GRANT SELECT"
        ):
            other_table_only.preflight(stack.DB_NAME, table)
    finally:
        admin.execute(f"DROP TABLE `{other}`")


def test_user_without_binlog_monitor_is_told_to_grant_it(stack, airflow_connections, table, restricted_user):
    hook = restricted_user(f"SELECT ON `{stack.DB_NAME}`.`{table}`", "REPLICATION SLAVE ON *.*")
    with pytest.raises(SourceConfigurationError, match=r"cannot list binary logs.*GRANT BINLOG MONITOR ON \*\.\*"):
        hook.preflight(stack.DB_NAME, table)


def test_user_without_replication_slave_is_told_to_grant_it(stack, airflow_connections, table, restricted_user):
    hook = restricted_user(f"SELECT ON `{stack.DB_NAME}`.`{table}`", "BINLOG MONITOR ON *.*")
    with pytest.raises(SourceConfigurationError, match=r"lacks REPLICATION SLAVE.*GRANT REPLICATION SLAVE"):
        hook.preflight(stack.DB_NAME, table)
    assert hook.preflight(stack.DB_NAME, table, require_replication=False).key.columns == ("id",)


@pytest.mark.parametrize(
    "name,bad,message",
    [
        ("binlog_format", "MIXED", r"binlog_format=MIXED .*SET GLOBAL binlog_format='ROW'"),
        ("binlog_format", "STATEMENT", r"binlog_format=STATEMENT .*SET GLOBAL binlog_format='ROW'"),
        ("binlog_row_image", "MINIMAL", r"binlog_row_image=MINIMAL .*SET GLOBAL binlog_row_image='FULL'"),
        ("binlog_row_metadata", "MINIMAL", r"binlog_row_metadata=MINIMAL .*SET GLOBAL binlog_row_metadata='FULL'"),
        ("binlog_row_metadata", "NO_LOG", r"binlog_row_metadata=NO_LOG .*SET GLOBAL binlog_row_metadata='FULL'"),
        ("binlog_expire_logs_seconds", "7200", r"Binlog retention is 7200s .*at least"),
    ],
)
@pytest.mark.exclusive  # other tests' sessions would pick up the bad global while it is set
def test_bad_global_settings_on_the_real_server(stack, airflow_connections, table, admin, name, bad, message):
    """Switches one global of this stack's own MariaDB for the duration of the check, then restores it."""
    admin.execute(f"SELECT @@GLOBAL.{name}")
    original = admin.fetchone()[0]
    admin.execute(f"SET GLOBAL {name} = %s", (int(bad) if bad.isdigit() else bad,))
    try:
        with pytest.raises(SourceConfigurationError, match=message):
            # 2 rows at 0.0005 rows/s: ~4000 s of load; 2x that + 1 h margin is more than 7200 s.
            MySqlSourceHook().preflight(stack.DB_NAME, table, expected_rows_per_second=0.0005)
    finally:
        admin.execute(f"SET GLOBAL {name} = %s", (original,))
    MySqlSourceHook().preflight(stack.DB_NAME, table, expected_rows_per_second=0.0005)
