"""The ``mysql`` connection -> a binlog reader of chosen tables (:mod:`exactly_once_provider.source.binlog`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source import gtid, preflight
from exactly_once_provider.source.binlog import (
    BinlogReader,
    PurgedPositionError,
    TableName,
    first_transaction_after,
    purged_message,
)
from exactly_once_provider.source.snapshot import ServerChunkLocator, server_ordered_columns

if TYPE_CHECKING:
    from exactly_once_provider.full_load.handoff import Handoff


class MySqlBinlogHook(MySqlSourceHook):
    """
    Read the binlog of a MySQL/MariaDB server as whole committed transactions of chosen tables.

    Uses the standard ``mysql`` connection (the user needs REPLICATION SLAVE and BINLOG MONITOR / REPLICATION
    CLIENT).

    :param mysql_conn_id: the Airflow connection id of the source server.
    """

    hook_name = "MySQL/MariaDB binlog reader (exactly-once)"

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
        raise AirflowException(
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
                self.log.info(
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
            self.log,
        )
