"""Preflight checks of a MySQL/MariaDB source before a full load: each failure says what to change.

Every check takes an open DB-API cursor, so the same code runs against the real server and against a fake
cursor in unit tests (for settings that cannot be changed on a shared server, e.g. ``log_bin``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import MySQLdb

from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.source.identifiers import quote_table

# MySQL/MariaDB error codes the privilege probes translate into advice.
_ACCESS_DENIED_CODES = {1142, 1143, 1044, 1045, 1227}
_REQUIRED_SETTINGS = {"binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}
# A load must finish, and the capture start, before the snapshot's binlog file may be purged.
RETENTION_SAFETY_FACTOR = 2
RETENTION_MARGIN_SECONDS = 3600


@dataclass(frozen=True)
class ChunkKey:
    """The unique, NOT NULL key a table is split and ordered by; ``index`` is ``PRIMARY`` or a unique index."""

    columns: tuple[str, ...]
    index: str


def server_variables(cur: Any) -> dict[str, str]:
    """Return the global binlog settings that matter for capture, lower-cased names to string values."""
    cur.execute(
        "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_bin', 'binlog_format', 'binlog_row_image', "
        "'binlog_row_metadata', 'binlog_expire_logs_seconds', 'expire_logs_days')"
    )
    return {str(name).lower(): str(value) for name, value in cur.fetchall()}


def check_binlog_settings(settings: dict[str, str]) -> None:
    """Refuse a server whose binlog cannot carry every change with its column names.

    :param settings: the output of :func:`server_variables`.
    """
    if settings.get("log_bin", "OFF").upper() not in ("ON", "1"):
        raise SourceConfigurationError(
            "The binary log is off (log_bin=OFF): changes after the snapshot could not be captured. Start the "
            "server with log_bin (e.g. log_bin=binlog in my.cnf; it cannot be changed at runtime)."
        )
    for name, wanted in _REQUIRED_SETTINGS.items():
        if name not in settings:
            raise SourceConfigurationError(
                f"The server has no {name} setting: it is too old for exactly-once capture. Use MariaDB "
                "10.5+ or MySQL 8.0.1+ (binlog_row_metadata=FULL is needed for column names in the binlog)."
            )
        actual = settings[name].upper()
        if actual != wanted:
            raise SourceConfigurationError(
                f"{name}={actual} but exactly-once capture needs {name}={wanted}: run "
                f"SET GLOBAL {name}='{wanted}' and set it in my.cnf so a restart keeps it."
            )


def retention_seconds(settings: dict[str, str]) -> int:
    """Return how long the server keeps binlog files, 0 meaning forever."""
    seconds = int(float(settings.get("binlog_expire_logs_seconds") or 0))
    days = float(settings.get("expire_logs_days") or 0)
    return seconds if seconds > 0 else int(days * 86400)


def check_retention(settings: dict[str, str], estimated_rows: int, expected_rows_per_second: float) -> None:
    """Refuse when the binlog may be purged before the load finishes and the capture starts.

    :param settings: the output of :func:`server_variables`.
    :param estimated_rows: the table's estimated row count.
    :param expected_rows_per_second: the load speed to plan with.
    """
    if expected_rows_per_second <= 0:
        raise ValueError(f"expected_rows_per_second must be > 0, got {expected_rows_per_second}.")
    kept = retention_seconds(settings)
    estimate = estimated_rows / expected_rows_per_second
    needed = int(RETENTION_SAFETY_FACTOR * estimate + RETENTION_MARGIN_SECONDS)
    if kept and kept < needed:
        raise SourceConfigurationError(
            f"Binlog retention is {kept}s (binlog_expire_logs_seconds) but loading ~{estimated_rows} rows at "
            f"{expected_rows_per_second:.0f} rows/s takes ~{estimate:.0f}s: the snapshot's binlog file could be "
            f"purged before the capture starts. Raise binlog_expire_logs_seconds to at least {needed} "
            "(SET GLOBAL and my.cnf), or set expected_rows_per_second to the measured speed."
        )


def base_tables(cur: Any, schema: str) -> list[str]:
    """Return the names of the base tables of ``schema`` the user can see, sorted (views have no binlog rows).

    :param cur: an open cursor.
    :param schema: the database name.
    """
    cur.execute(
        "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_TYPE = 'BASE TABLE' "
        "ORDER BY TABLE_NAME",
        (schema,),
    )
    return [row[0] for row in cur.fetchall()]


def check_table_readable(cur: Any, schema: str, table: str) -> int:
    """Check the table exists and can be read; return its estimated row count.

    :param cur: an open cursor.
    :param schema: the database name.
    :param table: the table name.
    """
    cur.execute(
        "SELECT TABLE_TYPE, TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
        (schema, table),
    )
    row = cur.fetchone()
    if row is None:
        raise SourceConfigurationError(
            f"Table {quote_table(schema, table)} was not found, or the user has no privilege on it: check the "
            f"name, and GRANT SELECT ON {quote_table(schema, table)} TO the connection's user."
        )
    if row[0] != "BASE TABLE":
        raise SourceConfigurationError(
            f"{quote_table(schema, table)} is a {row[0]}, not a base table: its changes are not in the binlog "
            "under this name. Load the underlying table instead."
        )
    try:
        cur.execute(f"SELECT 1 FROM {quote_table(schema, table)} LIMIT 0")
        cur.fetchall()
    except MySQLdb.Error as error:
        if error.args and error.args[0] in _ACCESS_DENIED_CODES:
            raise SourceConfigurationError(
                f"The user cannot read {quote_table(schema, table)} ({error.args[1]}): "
                f"GRANT SELECT ON {quote_table(schema, table)} TO the connection's user."
            ) from None
        raise
    return int(row[1] or 0)


def global_privileges(cur: Any) -> set[str]:
    """Return the current user's global privileges (``information_schema.USER_PRIVILEGES``)."""
    cur.execute("SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES")
    return {str(row[0]).upper() for row in cur.fetchall()}


def check_privileges(cur: Any, is_mariadb: bool, require_replication: bool = True) -> None:
    """Check the user may list binlogs, stream them (for the capture) and, on MySQL, take the brief lock.

    :param cur: an open cursor.
    :param is_mariadb: whether the server is MariaDB (lock-free path) or MySQL (FTWRL path).
    :param require_replication: also require REPLICATION SLAVE, which the binlog capture after the load needs.
    """
    monitor = "BINLOG MONITOR" if is_mariadb else "REPLICATION CLIENT"
    try:
        cur.execute("SHOW BINARY LOGS")
        cur.fetchall()
    except MySQLdb.Error as error:
        if error.args and error.args[0] in _ACCESS_DENIED_CODES:
            raise SourceConfigurationError(
                f"The user cannot list binary logs ({error.args[1]}): GRANT {monitor} ON *.* TO the connection's "
                "user; the load checks its snapshot position is still retained."
            ) from None
        raise
    held = global_privileges(cur)
    if require_replication and not held & {"REPLICATION SLAVE", "REPLICATION REPLICA"}:
        raise SourceConfigurationError(
            "The user lacks REPLICATION SLAVE: the binlog capture that continues after this load could not "
            "read the binlog. GRANT REPLICATION SLAVE ON *.* TO the connection's user."
        )
    if not is_mariadb and not held & {"RELOAD", "FLUSH_TABLES"}:
        raise SourceConfigurationError(
            "On MySQL the exact snapshot position needs a brief FLUSH TABLES WITH READ LOCK: GRANT RELOAD "
            "(or FLUSH_TABLES) ON *.* TO the connection's user."
        )


def resolve_chunk_key(cur: Any, schema: str, table: str, chunk_key: tuple[str, ...] | None = None) -> ChunkKey:
    """Return the primary key, or the explicit ``chunk_key`` if it is a unique index of NOT NULL columns.

    :param cur: an open cursor.
    :param schema: the database name.
    :param table: the table name.
    :param chunk_key: columns of a unique index to use instead of the primary key.
    """
    cur.execute(
        "SELECT INDEX_NAME, COLUMN_NAME, NON_UNIQUE, NULLABLE FROM information_schema.STATISTICS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY INDEX_NAME, SEQ_IN_INDEX",
        (schema, table),
    )
    indexes: dict[str, list[tuple[str, bool, bool]]] = {}
    for index, column, non_unique, nullable in cur.fetchall():
        indexes.setdefault(index, []).append((column, int(non_unique) == 0, nullable == "YES"))
    unique = {
        name: tuple(c for c, _, _ in cols)
        for name, cols in indexes.items()
        if all(u for _, u, _ in cols) and not any(n for _, _, n in cols)
    }
    if chunk_key:
        wanted = tuple(chunk_key)
        for name, columns in sorted(unique.items(), key=lambda item: item[0] != "PRIMARY"):
            if columns == wanted:
                return ChunkKey(columns, name)
        raise SourceConfigurationError(
            f"chunk_key {list(wanted)} of {quote_table(schema, table)} is not a UNIQUE index of NOT NULL columns "
            f"(unique indexes: {sorted(map(list, unique.values())) or 'none'}): a non-unique or nullable key "
            "cannot tell two rows apart, so changes could not be matched to the snapshot exactly once. Add "
            "a PRIMARY KEY or a UNIQUE index on NOT NULL columns and name it in chunk_key."
        )
    if "PRIMARY" in unique:
        return ChunkKey(unique["PRIMARY"], "PRIMARY")
    raise SourceConfigurationError(
        f"Table {quote_table(schema, table)} has no PRIMARY KEY: without a unique key the binlog capture cannot "
        "tell which snapshot chunk a change belongs to, so exactly-once is refused. Add a PRIMARY KEY, or pass "
        "chunk_key naming the columns of a UNIQUE index on NOT NULL columns"
        + (f" (candidates: {sorted(map(list, unique.values()))})." if unique else ".")
    )


@dataclass(frozen=True)
class ColumnCatalog:
    """What the server's catalog says of one column (lower-case type; charset/collation None if not text)."""

    data_type: str
    charset: str | None
    collation: str | None


def column_catalog(cur: Any, schema: str, table: str) -> dict[str, ColumnCatalog]:
    """Return ``{lower-case column name: ColumnCatalog}`` of a table.

    :param cur: an open cursor.
    :param schema: the database name.
    :param table: the table name.
    """
    cur.execute(
        "SELECT COLUMN_NAME, DATA_TYPE, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
        (schema, table),
    )
    return {
        str(name).lower(): ColumnCatalog(str(data_type).lower(), charset and str(charset), collation and str(collation))
        for name, data_type, charset, collation in cur.fetchall()
    }


def check_chunkable_key(cur: Any, schema: str, table: str, key: ChunkKey) -> ChunkKey:
    """Refuse a chunk key with ENUM or SET columns: the server orders them by member index, not by value.

    Only chunking needs the order (the handoff places each change in the chunk of its key); a capture without
    a full load may key its records by any unique key.

    :param cur: an open cursor.
    :param schema: the database name.
    :param table: the table name.
    :param key: the resolved chunk key.
    """
    catalog = column_catalog(cur, schema, table)
    bad = [c for c in key.columns if c.lower() in catalog and catalog[c.lower()].data_type in ("enum", "set")]
    if bad:
        raise SourceConfigurationError(
            f"The chunk key {list(key.columns)} of {quote_table(schema, table)} has ENUM/SET column(s) {bad}: the "
            "server orders them by member index, so a change could not be matched to the snapshot chunk of its "
            "key exactly. Use another UNIQUE index of NOT NULL columns as chunk_key (or add a surrogate key)."
        )
    return key
