"""A MySQL/MariaDB source server reached with :class:`~exactly_once_provider.source.snapshot.ConnectionSettings`.

What the full load, the reconciliation and the capture ask of the source: its flavor and version, consistent
snapshots with their exact binlog position, the preflight checks, the binlog's end and files, GTID lookups and
binlog readers. Built from settings, not from an Airflow connection: a Spark driver gets its settings from the
job's 0600 secrets file (written by the operator), and the hooks
(:class:`~exactly_once_provider.hooks.mysql_source.MySqlSourceHook`,
:class:`~exactly_once_provider.hooks.mysql_binlog.MySqlBinlogHook`) are these classes with the settings read from
the Airflow connection.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import MySQLdb

from exactly_once_provider.errors import PipelineError, ServiceAccessError, SourceConfigurationError
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source import gtid, preflight
from exactly_once_provider.source.binlog import (
    BinlogReader,
    PurgedPositionError,
    TableName,
    first_transaction_after,
    purged_message,
)
from exactly_once_provider.source.identifiers import quote_table
from exactly_once_provider.source.snapshot import (
    ConnectionSettings,
    ServerChunkLocator,
    begin_snapshot,
    server_ordered_columns,
)

if TYPE_CHECKING:
    from exactly_once_provider.full_load.handoff import Handoff

_DB_ACCESS_DENIED = 1044
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)")
log = logging.getLogger(__name__)


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


class MySqlSource:
    """
    Read a MySQL or MariaDB server as the source of an exactly-once pipeline.

    Every session runs with ``time_zone='+00:00'`` so TIMESTAMP values read the same in the snapshot and in the
    binlog.

    :param settings: how to connect (never log them: they hold the password).
    :param label: names the source in error messages (e.g. ``MySQL connection 'mysql_default'``).
    """

    def __init__(self, settings: ConnectionSettings, label: str = "MySQL source") -> None:
        self._settings = settings
        self.label = label

    def connection_settings(self) -> ConnectionSettings:
        """Return what is needed to open a connection, e.g. on a Spark executor (never log it)."""
        return self._settings

    def get_conn(self) -> MySQLdb.connections.Connection:
        """Open a new connection with UTC session time and utf8mb4."""
        try:
            return self.connection_settings().connect()
        except ServiceAccessError as err:
            raise ServiceAccessError(f"{self.label}: {err}") from None

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


class MySqlBinlogSource(MySqlSource):
    """
    Read the binlog of a MySQL/MariaDB server as whole committed transactions of chosen tables.

    The user needs REPLICATION SLAVE and BINLOG MONITOR / REPLICATION CLIENT.

    :param settings: how to connect (never log them: they hold the password).
    :param label: names the source in error messages.
    """

    def binlog_end(self) -> BinlogPosition:
        """Return the current end of the binlog (where the next transaction will be written)."""
        with self.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
        if not row:
            raise SourceConfigurationError("The server has no binary log (log_bin=OFF): enable log_bin.")
        return BinlogPosition(str(row[0]), int(row[1]))

    def binlog_files(self) -> list[tuple[str, int]]:
        """Return ``(file, size)`` of every binlog file the server keeps, oldest first."""
        with self.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            return [(str(row[0]), int(row[1])) for row in cur.fetchall()]

    def lag(self, position: BinlogPosition) -> tuple[int, int]:
        """Return ``(bytes, files)`` between ``position`` and the end of the binlog."""
        files = self.binlog_files()
        behind = [(name, size) for name, size in files if BinlogPosition(name, 0).sort_key[0] >= position.sort_key[0]]
        if not behind:
            return 0, 0
        total = sum(size for _, size in behind) - min(position.pos, behind[0][1])
        return max(total, 0), len(behind) - 1

    def check_capture(self, start: BinlogPosition) -> None:
        """
        Refuse to capture from ``start`` when the server cannot deliver every change after it.

        Reuses the full load's preflight (binlog settings, REPLICATION SLAVE) and refuses a purged start
        position with :class:`PurgedPositionError`, which asks for a full reload.
        """
        with self.cursor() as cur:
            cur.execute("SELECT VERSION()")
            is_mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
            preflight.check_binlog_settings(preflight.server_variables(cur))
            preflight.check_privileges(cur, is_mariadb, require_replication=True)
        retained = [name for name, _ in self.binlog_files()]
        if start.file not in retained:
            raise PurgedPositionError(purged_message(start, retained))

    def server_identity(self) -> gtid.ServerIdentity:
        """Return the server id of the server the connection reaches and, on MariaDB, its GTID state."""
        with self.cursor() as cur:
            cur.execute("SELECT @@server_id, VERSION()")
            server_id, version = cur.fetchone()
            is_mariadb = "mariadb" in str(version).lower()
            state = None
            if is_mariadb:
                cur.execute("SELECT @@gtid_binlog_state")
                state = gtid.parse_list(cur.fetchone()[0])
        return gtid.ServerIdentity(int(server_id), is_mariadb, state)

    def gtid_position_at(self, position: BinlogPosition) -> gtid.GtidPosition:
        """Return the MariaDB GTID position at a binlog position of this server (``BINLOG_GTID_POS``).

        The server reads the binlog file from its start up to ``position`` to answer.
        """
        with self.cursor() as cur:
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (position.file, position.pos))
            row = cur.fetchone()
        if row is None or row[0] is None:
            raise PurgedPositionError(
                f"The server has no binlog position {position}: BINLOG_GTID_POS returned NULL "
                "(the file is not in its binlog, or the offset is not an event boundary)."
            )
        return gtid.parse_position(row[0])

    def locate_gtid(self, position: gtid.GtidPosition, server_id: int, attempts: int = 5) -> BinlogPosition:
        """
        Return this server's binlog position at a MariaDB GTID position: where the transaction after it starts,
        or the binlog end when none follows yet.

        Checked with ``BINLOG_GTID_POS``: the answer's GTID position must equal ``position`` exactly (same
        domains, same GTIDs), otherwise transactions before it were never read and the capture would skip them.

        :param position: the last GTID of each domain already delivered.
        :param server_id: the replica server id to register the locating dump with.
        :param attempts: how often to retry when new transactions arrive while the end of the binlog is checked.
        """
        text = gtid.format_position(position)
        for attempt in range(1, attempts + 1):
            found = first_transaction_after(self.connection_settings().replication_settings(), text, server_id)
            at_end = found is None
            if at_end:
                found = self.binlog_end()
            at = self.gtid_position_at(found)
            if at == position:
                return found
            if at_end and attempt < attempts:
                continue  # a transaction may have been written after the dump ended: look again
            break
        raise PipelineError(
            f"GTID position {text} is at {found} in this server's binlog, but the GTID position there is "
            f"{gtid.format_position(at) or 'empty'}: the binlog before it holds transactions of other domains (or "
            "other GTIDs) the capture never delivered. Resuming there would skip them; check the replication "
            "topology (gtid_domain_id, gtid_strict_mode=ON on every server)."
        )

    def table_key(self, schema: str, table: str) -> tuple[str, ...]:
        """Return the primary key columns of a table (for tables captured without a full load)."""
        with self.cursor() as cur:
            return preflight.resolve_chunk_key(cur, schema, table).columns

    def chunk_locators(self, handoffs: dict[TableName, Handoff]) -> dict[TableName, ServerChunkLocator]:
        """
        Return a server-side chunk locator for each full-loaded table whose key Python cannot order (collations).

        Close them when the capture ends.

        :param handoffs: the full loads of the captured tables.
        """
        locators: dict[TableName, ServerChunkLocator] = {}
        with self.cursor() as cur:
            for (schema, table), handoff in handoffs.items():
                collations = server_ordered_columns(cur, schema, table, handoff.key)
                if not collations:
                    continue
                chunks = sorted(handoff.chunks, key=lambda c: c.chunk.index)
                locators[(schema, table)] = ServerChunkLocator(
                    self.connection_settings().connect, handoff.key, collations, [c.chunk.upper for c in chunks[:-1]]
                )
                log.info(
                    "Handoff filter of %s.%s: the server orders its key (%s), one cached query per key "
                    "changed before the last chunk's snapshot",
                    schema,
                    table,
                    ", ".join(f"{c} {coll}" for c, (_, coll) in collations.items()),
                )
        return locators

    def reader(
        self,
        tables: dict[TableName, tuple[str, ...]],
        server_id: int,
        heartbeat_seconds: float = 1.0,
        reconnect_timeout: float = 180.0,
    ) -> BinlogReader:
        """
        Return a reader of ``tables`` (``{(schema, table): key columns}``).

        :param tables: the captured tables and the key of each (the full load's chunk key).
        :param server_id: the replica server id this reader registers with; unique per reader (a second
            reader with the same id makes the server drop the first one).
        :param heartbeat_seconds: how often an idle blocking stream wakes up.
        :param reconnect_timeout: how long to retry a lost server before failing.
        """
        return BinlogReader(
            self.connection_settings().replication_settings(),
            tables,
            server_id,
            heartbeat_seconds,
            reconnect_timeout,
            log,
        )


def source_secrets(source: MySqlSource) -> dict[str, Any]:
    """Return the entry of a Spark job's 0600 secrets file that gives its driver ``source`` (its settings and label).

    Resolved where the connection is (the operator's process); the driver rebuilds the source with
    :func:`source_from_secrets` and never reads an Airflow connection.

    :param source: the source (a hook reads its settings from its connection here).
    """
    return {"mysql": {"settings": source.connection_settings().to_json(), "label": source.label}}


def source_from_secrets(secrets: dict[str, Any]) -> MySqlBinlogSource:
    """Return the source a Spark job's secrets file names (written with :func:`source_secrets`).

    :param secrets: the job's secrets file, read.
    """
    entry = secrets.get("mysql")
    if not entry:
        raise ValueError("The job's secrets file has no MySQL source ('mysql'); the operator writes it (job_secrets).")
    return MySqlBinlogSource(ConnectionSettings.from_json(entry["settings"]), entry["label"])
