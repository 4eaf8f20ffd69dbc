"""MySQL/MariaDB source hook: server detection, consistent snapshots with their exact binlog position."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import MySQLdb
from airflow.sdk import BaseHook

from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.positions import BinlogPosition

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

    def get_conn(self) -> MySQLdb.connections.Connection:
        """Open a new connection with UTC session time and utf8mb4."""
        conn = self.get_connection(self.mysql_conn_id)
        if not conn.host:
            raise ValueError(f"Connection {self.mysql_conn_id!r} has no host; set the MySQL server's host.")
        return MySQLdb.connect(
            host=conn.host,
            port=int(conn.port or 3306),
            user=conn.login or "",
            password=conn.password or "",
            database=conn.schema or "",
            charset="utf8mb4",
            init_command="SET time_zone = '+00:00'",
            connect_timeout=int(conn.extra_dejson.get("connect_timeout", 10)),
            autocommit=True,
        )

    def server_info(self) -> ServerInfo:
        """Return the flavor and version of the source server."""
        with self._cursor() as cur:
            cur.execute("SELECT VERSION()")
            return parse_server_version(cur.fetchone()[0])

    def binary_logs(self) -> list[str]:
        """Return the names of the binlog files the server still keeps (``SHOW BINARY LOGS``)."""
        with self._cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            return [row[0] for row in cur.fetchall()]

    def is_retained(self, position: BinlogPosition) -> bool:
        """Return whether the binlog file of ``position`` has not been purged yet."""
        return position.file in self.binary_logs()

    @contextmanager
    def consistent_snapshot(self) -> Iterator[Snapshot]:
        """
        Open a lock-free consistent snapshot and yield it with its exact binlog position.

        On MariaDB, ``binlog_snapshot_file``/``binlog_snapshot_position`` are the position that matches the
        read view of ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` exactly: every transaction committed
        before it is visible in the snapshot, none after it is.
        """
        conn = self.get_conn()
        try:
            cur = conn.cursor()
            cur.execute("SELECT VERSION()")
            info = parse_server_version(cur.fetchone()[0])
            if not info.is_mariadb:
                raise SourceConfigurationError(
                    f"Server {info.version_string} is MySQL: an exact lock-free snapshot position needs "
                    "MariaDB's binlog_snapshot_* status; the MySQL 8 locking path is not available yet."
                )
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {name.lower(): value for name, value in cur.fetchall()}
            file = status.get("binlog_snapshot_file") or ""
            if not file:
                raise SourceConfigurationError(
                    "The server has no binary log (binlog_snapshot_file is empty): start it with log_bin "
                    "enabled, binlog_format=ROW, binlog_row_image=FULL, binlog_row_metadata=FULL."
                )
            position = BinlogPosition(file, int(status["binlog_snapshot_position"]))
            yield Snapshot(cursor=cur, position=position)
            conn.rollback()
        finally:
            conn.close()

    @contextmanager
    def _cursor(self) -> Iterator[Any]:
        conn = self.get_conn()
        try:
            yield conn.cursor()
        finally:
            conn.close()
