"""Benchmark (not a test): exactly-once binlog capture into Kafka vs the raw python-mysql-replication read.

Writes ``--rows`` rows (inserts in transactions of 100 rows, then an update of every row) and notes the binlog
range, then, interleaved ``--repeats`` times on that same range: "raw read" iterates python-mysql-replication
over it and decodes every row (the floor: no grouping, no conversion, nothing produced); "exactly_once" runs
BinlogCaptureOperator in bounded mode for a fresh pipeline (transaction grouping, type conversion, JSON change
records, Kafka transactions with the ledger offset). Prints the median rows/s of each and the ratio.
Usage: ``make bench-capture`` or ``python benchmarks/bench_capture.py [--rows 100000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from tests.conftest import STACK as stack  # the one loader of docker/local/stack.py

    stack.up()
    os.environ.update(stack.connection_env())
    import MySQLdb
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

    from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator

    conn = MySQLdb.connect(host=stack.HOST, port=stack.MARIADB_PORT, user=stack.DB_USER, password=stack.DB_PASSWORD,
                           database=stack.DB_NAME, autocommit=True, init_command="SET time_zone = '+00:00'")
    cur = conn.cursor()
    table = f"bench_cap_{uuid.uuid4().hex[:6]}"
    cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, account INT UNSIGNED, amount DECIMAL(12,2), "
                "note VARCHAR(40), updated_at TIMESTAMP(6) NULL, booked DATETIME(6) NULL)")
    cur.execute("SHOW MASTER STATUS")
    start_file, start_pos = cur.fetchone()[:2]
    for first in range(0, args.rows, 100):
        n = min(100, args.rows - first)
        cur.execute(f"INSERT INTO {table} VALUES " + ", ".join(["(%s, %s, %s, %s, NOW(6), NOW(6))"] * n),
                    [x for i in range(first, first + n) for x in (i, i % 997, i / 100, f"row {i}")])
    for first in range(0, args.rows, 1000):
        cur.execute(f"UPDATE {table} SET amount = amount + 1 WHERE id >= %s AND id < %s", (first, first + 1000))
    cur.execute("SHOW MASTER STATUS")
    end_file, end_pos = cur.fetchone()[:2]
    changes = 2 * args.rows

    def raw_read() -> float:
        started = time.monotonic()
        stream = BinLogStreamReader(
            {"host": stack.HOST, "port": stack.MARIADB_PORT, "user": stack.DB_USER, "passwd": stack.DB_PASSWORD},
            server_id=4_100_000, resume_stream=True, log_file=start_file, log_pos=start_pos, blocking=False,
            is_mariadb=False, only_schemas=[stack.DB_NAME], only_tables=[table], enable_logging=False,
            only_events=[TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent])
        rows = 0
        for event in stream:
            if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                rows += len(event.rows)
            if stream.log_file == end_file and stream.log_pos >= end_pos:
                break
        stream.close()
        assert rows == changes, (rows, changes)
        return rows / (time.monotonic() - started)

    def capture() -> float:
        op = BinlogCaptureOperator(task_id="bench", tables=[table], pipeline=f"bench-cap-{uuid.uuid4().hex[:6]}",
                                   start_position=f"{start_file}:{start_pos}", progress_interval=3600)
        result = op.execute({})
        assert result["rows"] == changes, (result["rows"], changes)
        return result["rows"] / result["seconds"]

    raw, ours = [], []
    capture()  # warm-up: topic creation, coordinator, imports
    for _ in range(args.repeats):
        raw.append(raw_read())
        ours.append(capture())
    cur.execute(f"DROP TABLE {table}")
    conn.close()
    print(f"\nBinlog capture, {args.rows} inserts + {args.rows} updates ({changes} row changes, "
          f"{changes // 100 // 2 + args.rows // 1000} source transactions), median of {args.repeats} interleaved runs")
    print(f"{'reader':<28} {'rows/s':>10}   runs")
    print(f"{'raw python-mysql-replication':<28} {statistics.median(raw):>10.0f}   " + " ".join(f"{x:.0f}" for x in raw))
    print(f"{'exactly_once capture':<28} {statistics.median(ours):>10.0f}   " + " ".join(f"{x:.0f}" for x in ours))
    print(f"{'ratio (target >= 0.8)':<28} {statistics.median(ours) / statistics.median(raw):>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
