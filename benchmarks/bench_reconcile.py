"""Benchmark (not a test): reconcile a >= 1M-row MariaDB table with its PostgreSQL copy.

Seeds the source (MariaDB sequence engine) and the sink (generate_series) with the same rows from the same
formulas, then, in one run: "count" = ``SELECT COUNT(*)`` on both sides (the floor: one full count scan per
side); "clean" = ReconcileOperator with no difference; then one planted difference at a time (changed value,
missing row, extra row) and the key each run names. Prints seconds, queries, full scans and the ratio to the
count baseline. Usage: ``make bench-reconcile`` or ``python benchmarks/bench_reconcile.py [--rows 1000000]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=int(os.environ.get("BENCH_ROWS", 1_000_000)))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from tests.conftest import STACK as stack  # the one loader of docker/local/stack.py

    stack.up()
    os.environ.update(stack.connection_env())
    import psycopg2

    from exactly_once_provider.operators.reconcile import ReconcileOperator
    from tests.mysql_support import connect

    n, table = args.rows, f"bench_rec_{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    src = connect(stack)
    cur = src.cursor()
    cur.execute(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, currency CHAR(3),"
                " note VARCHAR(40), created DATETIME(6))")
    cur.execute(f"INSERT INTO {table} SELECT seq, (seq MOD 99991) / 100, ELT(seq MOD 3 + 1, 'EUR', 'USD', 'CNY'),"
                f" IF(seq MOD 7 = 0, NULL, CONCAT('n', seq)), TIMESTAMP('2026-11-20') + INTERVAL seq SECOND"
                f" FROM seq_1_to_{n}")
    pg = psycopg2.connect(host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER,
                          password=stack.DB_PASSWORD)
    pg.autocommit = True
    pcur = pg.cursor()
    pcur.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, currency text,"
                 " note text, created timestamp)")
    pcur.execute(f"INSERT INTO {table} SELECT s, (s % 99991) / 100.0, (ARRAY['EUR','USD','CNY'])[s % 3 + 1],"
                 f" CASE WHEN s % 7 = 0 THEN NULL ELSE 'n' || s END, TIMESTAMP '2026-11-20' + s * INTERVAL '1 second'"
                 f" FROM generate_series(1, {n}) s")
    pcur.execute(f"ANALYZE {table}")
    print(f"seeded {n} rows on both sides in {time.monotonic() - started:.1f}s")

    def count() -> float:
        t0 = time.monotonic()
        cur.execute(f"SELECT COUNT(*) FROM {table}")
        pcur.execute(f"SELECT COUNT(*) FROM {table}")
        assert cur.fetchone()[0] == pcur.fetchone()[0] == n
        return time.monotonic() - t0

    def reconcile() -> dict:
        op = ReconcileOperator(task_id="bench", name=f"bench-{table}", table=table, sink="postgres",
                               sink_table=table, fail_on_mismatch=False, store_result=False)
        return op.execute({})

    count()  # warm both caches the same way
    baseline = min(count() for _ in range(2))
    rows = [("count(*) both sides", baseline, 2, 2, "-")]
    clean = reconcile()
    assert clean["clean"], clean
    rows.append(("no difference", clean["seconds"], clean["queries"], clean["full_scans"], "-"))
    key = n // 2 + 17
    plants = [("changed value", f"UPDATE {table} SET amount = amount + 0.01 WHERE id = {key}",
               f"UPDATE {table} SET amount = amount - 0.01 WHERE id = {key}", key, "changed"),
              ("missing row", f"DELETE FROM {table} WHERE id = {key}",
               f"INSERT INTO {table} SELECT id, amount, currency, note, created FROM {table}_keep", key, "missing"),
              ("extra row", f"INSERT INTO {table} (id, amount) VALUES ({n + 5}, 1)",
               f"DELETE FROM {table} WHERE id = {n + 5}", n + 5, "extra")]
    pcur.execute(f"CREATE TABLE {table}_keep AS SELECT * FROM {table} WHERE id = {key}")
    for label, plant, undo, want, kind in plants:
        pcur.execute(plant)
        found = reconcile()
        named = [(d["key"], d["kind"]) for d in found["differences"]]
        assert named == [(want, kind)], named
        rows.append((f"{label} (key {want})", found["seconds"], found["queries"], found["full_scans"],
                     f"{want} {kind}"))
        pcur.execute(undo)
    print(f"\nbench-reconcile: {n} rows, MariaDB source vs PostgreSQL sink (same run)")
    print(f"{'case':<28} {'seconds':>8} {'x count':>8} {'queries':>8} {'full scans':>11}  named")
    for label, seconds, queries, scans, named in rows:
        print(f"{label:<28} {seconds:>8.2f} {seconds / baseline:>8.2f} {queries:>8} {scans:>11}  {named}")
    cur.execute(f"DROP TABLE {table}")
    pcur.execute(f"DROP TABLE {table}, {table}_keep")
    return 0


if __name__ == "__main__":
    sys.exit(main())
