"""Benchmark (not a test): reconcile a >= 1M-row MariaDB table with its PostgreSQL copy.

Seeds the source (MariaDB sequence engine) and the sink (generate_series) with the same rows from the same
formulas, then, in one run: "count" = ``SELECT COUNT(*)`` on both sides (the issue's baseline: one full count
scan per side, which reads no row's content); "content floor" = one query per side that reads every compared
column of every row into one checksum, both sides at once (what any content comparison must at least do);
"clean" = ReconcileOperator with no difference; then one planted difference at a time (changed value,
missing row, extra row) and the key each run names. Prints seconds, queries, full scans and the ratio to the
count baseline; writes ``benchmarks/results/reconcile-*.json``. Usage: ``make bench-reconcile`` or
``python benchmarks/bench_reconcile.py [--rows 1000000]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid

import _support


def main() -> int:
    # --repeats: the count baseline and the clean run, interleaved; each planted difference runs once.
    args = _support.parse_args(__doc__, rows=int(os.environ.get("BENCH_ROWS", 1_000_000)))
    stack = _support.start_stack()
    result = _support.result_header("reconcile", {"rows": args.rows, "repeats": args.repeats})
    import psycopg2

    from exactly_once_provider.operators.reconcile import ReconcileOperator

    n, table = args.rows, f"bench_rec_{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    src = _support.connect_source(stack)
    cur = src.cursor()
    cur.execute(
        f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, currency CHAR(3),"
        " note VARCHAR(40), created DATETIME(6))"
    )
    cur.execute(
        f"INSERT INTO {table} SELECT seq, (seq MOD 99991) / 100, ELT(seq MOD 3 + 1, 'EUR', 'USD', 'CNY'),"
        f" IF(seq MOD 7 = 0, NULL, CONCAT('n', seq)), TIMESTAMP('2026-11-20') + INTERVAL seq SECOND"
        f" FROM seq_1_to_{n}"
    )
    pg = psycopg2.connect(
        host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER, password=stack.DB_PASSWORD
    )
    pg.autocommit = True
    pcur = pg.cursor()
    pcur.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, currency text,"
        " note text, created timestamp)"
    )
    pcur.execute(
        f"INSERT INTO {table} SELECT s, (s % 99991) / 100.0, (ARRAY['EUR','USD','CNY'])[s % 3 + 1],"
        f" CASE WHEN s % 7 = 0 THEN NULL ELSE 'n' || s END, TIMESTAMP '2026-11-20' + s * INTERVAL '1 second'"
        f" FROM generate_series(1, {n}) s"
    )
    pcur.execute(f"ANALYZE {table}")
    print(f"seeded {n} rows on both sides in {time.monotonic() - started:.1f}s")

    def count() -> float:
        t0 = time.monotonic()
        cur.execute(f"SELECT COUNT(*) FROM {table}")
        pcur.execute(f"SELECT COUNT(*) FROM {table}")
        assert cur.fetchone()[0] == pcur.fetchone()[0] == n
        return time.monotonic() - t0

    def content_floor() -> float:
        from concurrent.futures import ThreadPoolExecutor

        columns = "id, amount, currency, note, created"
        t0 = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            source = pool.submit(cur.execute, f"SELECT COUNT(*), SUM(CRC32(CONCAT_WS('|', {columns}))) FROM {table}")
            pcur.execute(f"SELECT COUNT(*), SUM(hashtext(concat_ws('|', {columns}))::bigint) FROM {table}")
            source.result()
        assert cur.fetchone()[0] == pcur.fetchone()[0] == n
        return time.monotonic() - t0

    def reconcile() -> dict:
        op = ReconcileOperator(
            task_id="bench",
            name=f"bench-{table}",
            table=table,
            sink="postgres",
            sink_table=table,
            fail_on_mismatch=False,
            store_result=False,
        )
        return op.execute({})

    count()  # warm both caches the same way
    counts, floors, cleans = [], [], []
    for repeat in range(args.repeats):  # the baselines and the clean run interleaved, ABBA; medians
        sides = [
            lambda: counts.append(count()),
            lambda: floors.append(content_floor()),
            lambda: cleans.append(reconcile()),
        ]
        for side in sides if repeat % 2 == 0 else sides[::-1]:
            side()
    assert all(c["clean"] for c in cleans), cleans
    baseline = statistics.median(counts)
    clean = sorted(cleans, key=lambda c: c["seconds"])[(len(cleans) - 1) // 2]  # the median run (lower one if even)
    rows = [
        (f"count(*) both sides ({len(counts)} runs)", baseline, 2, 2, "-"),
        (
            f"content floor: one checksum of every row per side, at once ({len(floors)} runs)",
            statistics.median(floors),
            2,
            2,
            "-",
        ),
        (f"no difference ({len(cleans)} runs)", clean["seconds"], clean["queries"], clean["full_scans"], "-"),
    ]
    key = n // 2 + 17
    plants = [
        (
            "changed value",
            f"UPDATE {table} SET amount = amount + 0.01 WHERE id = {key}",
            f"UPDATE {table} SET amount = amount - 0.01 WHERE id = {key}",
            key,
            "changed",
        ),
        (
            "missing row",
            f"DELETE FROM {table} WHERE id = {key}",
            f"INSERT INTO {table} SELECT id, amount, currency, note, created FROM {table}_keep",
            key,
            "missing",
        ),
        (
            "extra row",
            f"INSERT INTO {table} (id, amount) VALUES ({n + 5}, 1)",
            f"DELETE FROM {table} WHERE id = {n + 5}",
            n + 5,
            "extra",
        ),
    ]
    pcur.execute(f"CREATE TABLE {table}_keep AS SELECT * FROM {table} WHERE id = {key}")
    for label, plant, undo, want, kind in plants:
        pcur.execute(plant)
        found = reconcile()
        named = [(d["key"], d["kind"]) for d in found["differences"]]
        assert named == [(want, kind)], named
        rows.append(
            (f"{label} (key {want})", found["seconds"], found["queries"], found["full_scans"], f"{want} {kind}")
        )
        pcur.execute(undo)
    cur.execute(f"DROP TABLE {table}")
    pcur.execute(f"DROP TABLE {table}, {table}_keep")
    _support.report(
        result,
        f"Reconcile {n:,} rows, MariaDB source vs PostgreSQL sink: median of the interleaved runs, one run per "
        "planted difference",
        ["case", "seconds", "x COUNT(*) both sides", "queries", "full scans", "named"],
        [[label, seconds, seconds / baseline, queries, scans, named] for label, seconds, queries, scans, named in rows],
        plot={"column": 1, "label": "seconds"},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
