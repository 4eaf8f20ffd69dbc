"""MySQL/MariaDB source hook: the ``mysql`` connection -> :class:`~exactly_once_provider.source.server.MySqlSource`."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from exactly_once_provider.source.server import (  # noqa: F401 - the hook's result types, re-exported
    MySqlSource,
    Preflight,
    ServerInfo,
    Snapshot,
    parse_server_version,
)
from exactly_once_provider.source.snapshot import ConnectionSettings


class MySqlSourceHook(MySqlSource, BaseHook):
    """
    Read a MySQL or MariaDB server as the source of an exactly-once pipeline.

    Uses the standard ``mysql`` connection type, so existing MySQL connections work unchanged. What it does is
    :class:`~exactly_once_provider.source.server.MySqlSource`'s; the hook reads the settings from the connection.
    Every session runs with ``time_zone='+00:00'`` so TIMESTAMP values read the same in the snapshot and
    in the binlog.

    :param mysql_conn_id: the Airflow connection id of the source server.
    """

    conn_name_attr = "mysql_conn_id"
    default_conn_name = "mysql_default"
    conn_type = "mysql"
    hook_name = "MySQL/MariaDB source (exactly-once)"

    def __init__(self, mysql_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        BaseHook.__init__(self, **kwargs)
        self.mysql_conn_id = mysql_conn_id
        self.label = f"MySQL connection {mysql_conn_id!r}"

    def connection_settings(self) -> ConnectionSettings:
        """Return what is needed to open a connection, e.g. on a Spark executor or in a Spark driver's secrets
        file (never log it).

        Read as the MySQL provider's ``MySqlHook`` reads the connection: TLS from the Extra ``ssl`` dict and
        ``ssl_mode`` (:func:`~exactly_once_provider.connections.mysql_connect_kwargs`).
        """
        return ConnectionSettings.of_connection(self.mysql_conn_id)
