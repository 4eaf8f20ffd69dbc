"""Benchmark (not a test): one watermark window end to end vs a bare SELECT of the same rows.

Seeds a table with ``--rows`` rows, then, interleaved ``--repeats`` times: "bare select" reads the rows of
the window with one SELECT (no guard, no snapshot, nothing published: the floor); "window" runs
WatermarkExtractOperator for a fresh pipeline (preflight, guard, consistent snapshot, JSON records, ONE Kafka
transaction with markers and the ledger record, batch lookup; its timer includes opening the transactional
producer and reading the ledger). Prints the median rows/s and the ratio, writes
``benchmarks/results/watermark-*.json``.
Usage: ``make bench-watermark`` or ``python benchmarks/bench_watermark.py [--rows 100000] [--repeats 3]``.
"""

from __future__ import annotations

import sys
import time
import uuid

import _support


def main() -> int:
    args = _support.parse_args(__doc__)
    stack = _support.start_stack()
    result = _support.result_header("watermark", {"rows": args.rows, "repeats": args.repeats})
    from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator

    conn = _support.connect_source(stack)
    cur = conn.cursor()
    table = f"bench_wm_{uuid.uuid4().hex[:6]}"
    cur.execute(
        f"CREATE TABLE {table} (id INT AUTO_INCREMENT PRIMARY KEY, account INT, amount DECIMAL(12,2), "
        "note VARCHAR(40), updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (updated_at))"
    )
    for start in range(0, args.rows, 5000):
        n = min(5000, args.rows - start)
        cur.execute(
            f"INSERT INTO {table} (account, amount, note, updated_at) VALUES "
            + ", ".join(["(%s, %s, %s, NOW(6) - INTERVAL %s SECOND)"] * n),
            [x for i in range(start, start + n) for x in (i % 997, i / 100, f"row {i}", 3600 - i * 3600 / args.rows)],
        )
    time.sleep(1)
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"})
    topics = [f"bench-wm-{uuid.uuid4().hex[:6]}" for _ in range(args.repeats)]
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        future.result(30)
    time.sleep(1)
    bare = _support.Runs("bare SELECT (floor: no guard, nothing published)")
    window = _support.Runs("window: guard + snapshot + 1 Kafka txn + ledger")

    def select() -> int:
        cur.execute(f"SELECT * FROM {table} WHERE updated_at < NOW(6) - INTERVAL 1 SECOND ORDER BY updated_at, id")
        return len(cur.fetchall())

    def extract(topic: str) -> int:
        return WatermarkExtractOperator(
            task_id="bench",
            table=table,
            cursor_column="updated_at",
            cursor_kind="timestamp",
            topic=topic,
            pipeline=f"bench-{uuid.uuid4().hex[:8]}",
            safety_lag=1,
            batch_id="bench",
        ).execute({})["rows"]

    for repeat in range(args.repeats):
        sides = [lambda: bare.measure(select), lambda t=topics[repeat]: window.measure(lambda: extract(t))]
        counts = [side() for side in (sides if repeat % 2 == 0 else sides[::-1])]  # ABBA
        assert counts == [args.rows, args.rows], counts
    cur.execute(f"DROP TABLE {table}")
    _support.delete_topics(stack, topics)
    _support.report(
        result,
        f"Watermark window, {args.rows:,} rows, median of {args.repeats} interleaved runs (ABBA)",
        ["path", "rows/s", "runs", "ratio to bare select"],
        [[r.label, r.median, _support.runs_text(r.wall), r.median / bare.median] for r in (bare, window)],
        plot={"column": 1, "label": "rows/s (median)"},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
