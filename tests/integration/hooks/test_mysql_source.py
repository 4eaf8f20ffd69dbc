"""MySqlSourceHook on the real MariaDB: the snapshot position splits history and stream exactly."""

from __future__ import annotations

import threading
import uuid

import MySQLdb
import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import WriteRowsEvent

from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.positions import BinlogPosition


def _connect(stack):
    return MySQLdb.connect(
        host=stack.HOST,
        port=stack.MARIADB_PORT,
        user=stack.DB_USER,
        password=stack.DB_PASSWORD,
        database=stack.DB_NAME,
        autocommit=True,
    )


@pytest.fixture
def table(stack):
    name = f"smoke_{uuid.uuid4().hex[:8]}"
    conn = _connect(stack)
    conn.cursor().execute(f"CREATE TABLE `{name}` (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL)")
    yield name
    conn.cursor().execute(f"DROP TABLE `{name}`")
    conn.close()


def test_server_detection_and_retention(stack, airflow_connections):
    hook = MySqlSourceHook()
    info = hook.server_info()
    assert info.is_mariadb and info.version[:2] == (10, 11)
    logs = hook.binary_logs()
    assert logs and hook.is_retained(BinlogPosition(logs[-1], 4))
    assert not hook.is_retained(BinlogPosition("binlog.999999", 4))


def test_snapshot_position_splits_rows_exactly_between_snapshot_and_binlog(stack, airflow_connections, table):
    """With a writer committing throughout, snapshot rows + binlog rows after the position == all rows."""
    stop = threading.Event()
    written = threading.Semaphore(0)

    def writer():
        conn = _connect(stack)
        cur = conn.cursor()
        i = 0
        while not stop.is_set():
            i += 1
            if i % 5 == 0:  # multi-row transactions too
                cur.execute("START TRANSACTION")
                cur.executemany(f"INSERT INTO `{table}` (v) VALUES (%s)", [(i,), (i,), (i,)])
                cur.execute("COMMIT")
            else:
                cur.execute(f"INSERT INTO `{table}` (v) VALUES (%s)", (i,))
            written.release()
        conn.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(200):
            written.acquire(timeout=30)
        with MySqlSourceHook().consistent_snapshot() as snapshot:
            snapshot.cursor.execute(f"SELECT id FROM `{table}`")
            snapshot_ids = {row[0] for row in snapshot.cursor.fetchall()}
            position = snapshot.position
        for _ in range(200):
            written.acquire(timeout=30)
    finally:
        stop.set()
        thread.join()

    conn = _connect(stack)
    cur = conn.cursor()
    cur.execute(f"SELECT id FROM `{table}`")
    final_ids = {row[0] for row in cur.fetchall()}
    conn.close()

    stream = BinLogStreamReader(
        connection_settings={
            "host": stack.HOST,
            "port": stack.MARIADB_PORT,
            "user": stack.DB_USER,
            "passwd": stack.DB_PASSWORD,
        },
        server_id=4000 + uuid.uuid4().int % 1000,
        resume_stream=True,
        log_file=position.file,
        log_pos=position.pos,
        # is_mariadb=True would ignore log_file/log_pos and start from a GTID
        # (docs/pitfalls.md#mysql-and-mariadb-sources).
        is_mariadb=False,
        blocking=False,
        only_events=[WriteRowsEvent],
        only_schemas=[stack.DB_NAME],
        only_tables=[table],
    )
    binlog_ids = [row["values"]["id"] for event in stream for row in event.rows]
    stream.close()

    assert snapshot_ids and binlog_ids, "the writer must have committed both before and after the snapshot"
    assert len(binlog_ids) == len(set(binlog_ids)), "a row appears twice in the binlog after the position"
    assert snapshot_ids.isdisjoint(binlog_ids), "rows in the snapshot were also found after its position"
    assert snapshot_ids | set(binlog_ids) == final_ids, "rows lost between the snapshot and the binlog"
