"""Benchmark (not a test): one watermark window end to end vs a bare SELECT of the same rows.

Seeds a table with ``--rows`` rows, then, interleaved ``--repeats`` times: "bare select" reads the rows of
the window with one SELECT (no guard, no snapshot, nothing published: the floor); "window" runs
WatermarkExtractOperator for a fresh pipeline (preflight, guard, consistent snapshot, JSON records, ONE Kafka
transaction with markers and the ledger record, batch lookup). Prints the median rows/s and the ratio.
Usage: ``make bench-watermark`` or ``python benchmarks/bench_watermark.py [--rows 100000] [--repeats 3]``.
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

    from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator

    conn = MySQLdb.connect(host=stack.HOST, port=stack.MARIADB_PORT, user=stack.DB_USER, password=stack.DB_PASSWORD,
                           database=stack.DB_NAME, autocommit=True, init_command="SET time_zone = '+00:00'")
    cur = conn.cursor()
    table = f"bench_wm_{uuid.uuid4().hex[:6]}"
    cur.execute(f"CREATE TABLE {table} (id INT AUTO_INCREMENT PRIMARY KEY, account INT, amount DECIMAL(12,2), "
                "note VARCHAR(40), updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (updated_at))")
    for start in range(0, args.rows, 5000):
        n = min(5000, args.rows - start)
        cur.execute(f"INSERT INTO {table} (account, amount, note, updated_at) VALUES "
                    + ", ".join(["(%s, %s, %s, NOW(6) - INTERVAL %s SECOND)"] * n),
                    [x for i in range(start, start + n) for x in (i % 997, i / 100, f"row {i}", 3600 - i * 3600 / args.rows)])
    time.sleep(1)
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"})
    topics = [f"bench-wm-{uuid.uuid4().hex[:6]}" for _ in range(args.repeats)]
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        future.result(30)
    time.sleep(1)
    bare, window = [], []
    for repeat in range(args.repeats):
        started = time.perf_counter()
        cur.execute(f"SELECT * FROM {table} WHERE updated_at < NOW(6) - INTERVAL 1 SECOND ORDER BY updated_at, id")
        count = len(cur.fetchall())
        bare.append(count / (time.perf_counter() - started))
        started = time.perf_counter()
        result = WatermarkExtractOperator(
            task_id="bench", table=table, cursor_column="updated_at", cursor_kind="timestamp",
            topic=topics[repeat], pipeline=f"bench-{uuid.uuid4().hex[:8]}", safety_lag=1,
            batch_id="bench").execute({})
        assert result["rows"] == count == args.rows, (result["rows"], count)
        window.append(count / (time.perf_counter() - started))
    cur.execute(f"DROP TABLE {table}")
    b, w = statistics.median(bare), statistics.median(window)
    print()
    print(f"Watermark window benchmark, {args.rows} rows, median of {args.repeats} interleaved runs")
    print(f"{'path':<48} | {'rows/s':>10} | {'ratio to bare select':>20}")
    print("-" * 86)
    print(f"{'bare SELECT (floor: no guard, nothing published)':<48} | {b:>10,.0f} | {1:>20.3f}")
    print(f"{'window: guard + snapshot + 1 Kafka txn + ledger':<48} | {w:>10,.0f} | {w / b:>20.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
