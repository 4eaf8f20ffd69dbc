"""The one place an Airflow ``postgres`` connection becomes PostgreSQL connect arguments.

Two forms of the same settings: :func:`connect_kwargs` for ``psycopg2.connect`` in this process, and
:func:`libpq_environment` (``PG*`` variables) for the Spark job, so the password reaches the driver through
its environment and never through a command line or a log line.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook


def connect_kwargs(conn_id: str, **extra: Any) -> dict[str, Any]:
    """Return ``psycopg2.connect`` keyword arguments for the Airflow connection ``conn_id``.

    Unset fields are None, which psycopg2 leaves out (libpq defaults apply); the port defaults to 5432.

    :param conn_id: the ``postgres`` connection.
    :param extra: further connect arguments, e.g. ``connect_timeout=10``.
    """
    conn = BaseHook.get_connection(conn_id)
    return {"host": conn.host or None, "port": conn.port or 5432, "dbname": conn.schema or None,
            "user": conn.login or None, "password": conn.password or None, **extra}


def libpq_environment(conn_id: str) -> dict[str, str]:
    """Return the libpq ``PG*`` environment variables for the Airflow connection ``conn_id``.

    :param conn_id: the ``postgres`` connection.
    """
    names = {"host": "PGHOST", "port": "PGPORT", "dbname": "PGDATABASE", "user": "PGUSER", "password": "PGPASSWORD"}
    return {names[key]: str(value) for key, value in connect_kwargs(conn_id).items() if value is not None}
