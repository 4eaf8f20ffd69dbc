"""The ``mysql`` connection -> a binlog reader of chosen tables (:mod:`exactly_once_provider.source.server`)."""

from __future__ import annotations

from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.source.server import MySqlBinlogSource


class MySqlBinlogHook(MySqlSourceHook, MySqlBinlogSource):
    """
    Read the binlog of a MySQL/MariaDB server as whole committed transactions of chosen tables.

    Uses the standard ``mysql`` connection (the user needs REPLICATION SLAVE and BINLOG MONITOR / REPLICATION
    CLIENT). What it does is :class:`~exactly_once_provider.source.server.MySqlBinlogSource`'s; the hook reads the
    settings from the connection.

    :param mysql_conn_id: the Airflow connection id of the source server.
    """

    hook_name = "MySQL/MariaDB binlog reader (exactly-once)"
