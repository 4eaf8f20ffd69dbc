"""Smoke DAG: the source hook opens a consistent snapshot on the stack's MariaDB and checks its binlog.

It proves the wiring (provider installed, connections resolved, real server reached) before the
pipeline templates run. Trigger it with ``airflow dags test eo_smoke``.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.positions import BinlogPosition


@dag(
    dag_id="eo_smoke",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["exactly-once", "example"],
    doc_md=__doc__,
)
def eo_smoke():
    @task
    def snapshot_position(mysql_conn_id: str = "mysql_default") -> dict:
        """Open a consistent snapshot and return its exact binlog position."""
        hook = MySqlSourceHook(mysql_conn_id=mysql_conn_id)
        info = hook.server_info()
        with hook.consistent_snapshot() as snapshot:
            position = snapshot.position
        print(f"Snapshot position on {info.flavor} {info.version_string}: {position}")
        return {"file": position.file, "pos": position.pos, "server": info.version_string}

    @task
    def binlog_retained(position: dict, mysql_conn_id: str = "mysql_default") -> bool:
        """Fail unless the snapshot's binlog file is still kept by the server."""
        hook = MySqlSourceHook(mysql_conn_id=mysql_conn_id)
        binlog_position = BinlogPosition(position["file"], position["pos"])
        if not hook.is_retained(binlog_position):
            raise RuntimeError(f"Binlog file {binlog_position.file} is no longer on the server.")
        print(f"Binlog file {binlog_position.file} is retained.")
        return True

    binlog_retained(snapshot_position())


eo_smoke()
