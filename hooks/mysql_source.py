"""MySQL/MariaDB source hook: server detection, consistent snapshots with their exact binlog position."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import MySQLdb
from airflow.sdk import BaseHook

from exactly_once_provider.connections import mysql_connect_kwargs
from exactly_once_provider.errors import ServiceAccessError, SourceConfigurationError
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source import preflight
from exactly_once_provider.source.identifiers import quote_table
from exactly_once_provider.source.snapshot import ConnectionSettings, begin_snapshot

_DB_ACCESS_DENIED = 1044
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class ServerInfo:
    """What the source server is: ``flavor`` is ``"mariadb"`` or ``"mysql"``."""

    flavor: str
    version: tuple[int, int, int]
    version_string: str

    @property
    def is_mariadb(self) -> bool:
        return self.flavor == "mariadb"


def parse_server_version(version_string: str) -> ServerInfo:
    """Parse ``SELECT VERSION()`` output such as ``10.11.19-MariaDB-0+deb12u1-log`` or ``8.4.3``.

    :param version_string: the server's version string.
    """
    match = _VERSION.match(version_string)
    if not match:
        raise ValueError(f"Cannot parse server version {version_string!r}; expected 'X.Y.Z...'.")
    flavor = "mariadb" if "mariadb" in version_string.lower() else "mysql"
    major, minor, patch = (int(part) for part in match.groups())
    return ServerInfo(flavor=flavor, version=(major, minor, patch), version_string=version_string)


@dataclass
class Snapshot:
    """An open consistent snapshot: read through ``cursor``; ``position`` is where the binlog stands."""

    cursor: Any
    position: BinlogPosition


@dataclass(frozen=True)
class Preflight:
    """What the preflight checks found: the server, the key to chunk by, the estimated row count."""

    server: ServerInfo
    key: preflight.ChunkKey
    estimated_rows: int


class MySqlSourceHook(BaseHook):
    """
    Read a MySQL or MariaDB server as the source of an exactly-once pipeline.

    Uses the standard ``mysql`` connection type, so existing MySQL connections work unchanged.
    Every session runs with ``time_zone='+00:00'`` so TIMESTAMP values read the same in the snapshot and
    in the binlog.

    :param mysql_conn_id: the Airflow connection id of the source server.
    """

    conn_name_attr = "mysql_conn_id"
    default_conn_name = "mysql_default"
    conn_type = "mysql"
    hook_name = "MySQL/MariaDB source (exactly-once)"

    def __init__(self, mysql_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mysql_conn_id = mysql_conn_id

    def connection_settings(self) -> ConnectionSettings:
        """Return what is needed to open a connection, e.g. on a Spark executor (never log it).

        Read as the MySQL provider's ``MySqlHook`` reads the connection: TLS from the Extra ``ssl`` dict and
        ``ssl_mode`` (:func:`~exactly_once_provider.connections.mysql_connect_kwargs`).
        """
        kwargs = mysql_connect_kwargs(self.mysql_conn_id)
        return ConnectionSettings(
            host=kwargs["host"],
            port=kwargs["port"],
            user=kwargs["user"],
            password=kwargs["passwd"],
            database=kwargs["db"],
            connect_timeout=kwargs["connect_timeout"],
            ssl=kwargs.get("ssl"),
            ssl_mode=kwargs.get("ssl_mode"),
        )

    def get_conn(self) -> MySQLdb.connections.Connection:
        """Open a new connection with UTC session time and utf8mb4."""
        try:
            return self.connection_settings().connect()
        except ServiceAccessError as err:
            raise ServiceAccessError(f"MySQL connection {self.mysql_conn_id!r}: {err}") from None

    def server_info(self) -> ServerInfo:
        """Return the flavor and version of the source server."""
        with self.cursor() as cur:
            cur.execute("SELECT VERSION()")
            return parse_server_version(cur.fetchone()[0])

    def binary_logs(self) -> list[str]:
        """Return the names of the binlog files the server still keeps (``SHOW BINARY LOGS``)."""
        return [name for name, _ in self.binary_log_sizes()]

    def binary_log_sizes(self) -> list[tuple[str, int]]:
        """Return ``(file name, size in bytes)`` of every binlog file the server still keeps, oldest first."""
        with self.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            return [(row[0], int(row[1])) for row in cur.fetchall()]

    def is_retained(self, position: BinlogPosition) -> bool:
        """Return whether the binlog file of ``position`` has not been purged yet."""
        return position.file in self.binary_logs()

    @contextmanager
    def consistent_snapshot(self) -> Iterator[Snapshot]:
        """
        Open a lock-free consistent snapshot and yield it with its exact binlog position.

        On MariaDB (no lock), ``binlog_snapshot_file``/``binlog_snapshot_position`` are the position that matches the
        read view of ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` exactly: every transaction committed
        before it is visible in the snapshot, none after it is. On MySQL 8 a brief global read lock makes
        the position exact (see :mod:`exactly_once_provider.source.snapshot`).
        """
        conn = self.get_conn()
        try:
            cur = conn.cursor()
            cur.execute("SELECT VERSION()")
            info = parse_server_version(cur.fetchone()[0])
            position = begin_snapshot(cur, info.is_mariadb)
            yield Snapshot(cursor=cur, position=position)
            conn.rollback()
        finally:
            conn.close()

    def base_tables(self, schema: str) -> list[str]:
        """Return the base tables of ``schema`` the connection's user can see, sorted.

        :param schema: the database name.
        """
        with self.cursor() as cur:
            return preflight.base_tables(cur, schema)

    def preflight(
        self,
        schema: str,
        table: str,
        chunk_key: tuple[str, ...] | None = None,
        expected_rows_per_second: float = 20_000,
        require_replication: bool = True,
    ) -> Preflight:
        """Check the server and table are fit for an exactly-once full load; raise what to change if not.

        :param schema: the database name.
        :param table: the table name.
        :param chunk_key: columns of a unique NOT NULL index to use instead of the primary key.
        :param expected_rows_per_second: planned load speed, for the binlog retention check.
        :param require_replication: also require REPLICATION SLAVE for the capture that follows the load.
        """
        try:
            conn = self.get_conn()
        except MySQLdb.OperationalError as error:
            if error.args and error.args[0] == _DB_ACCESS_DENIED:
                raise SourceConfigurationError(
                    f"The user may not use the connection's database ({error.args[1]}): GRANT SELECT ON "
                    f"{quote_table(schema, table)} TO the connection's user."
                ) from None
            raise
        try:
            cur = conn.cursor()
            cur.execute("SELECT VERSION()")
            info = parse_server_version(cur.fetchone()[0])
            settings = preflight.server_variables(cur)
            preflight.check_binlog_settings(settings)
            estimated_rows = preflight.check_table_readable(cur, schema, table)
            preflight.check_privileges(cur, info.is_mariadb, require_replication)
            key = preflight.resolve_chunk_key(cur, schema, table, chunk_key)
            preflight.check_chunkable_key(cur, schema, table, key)
            preflight.check_retention(settings, estimated_rows, expected_rows_per_second)
            return Preflight(info, key, estimated_rows)
        finally:
            conn.close()

    @contextmanager
    def cursor(self) -> Iterator[Any]:
        conn = self.get_conn()
        try:
            yield conn.cursor()
        finally:
            conn.close()
