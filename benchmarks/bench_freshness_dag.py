"""Freshness as users run it: the continuous history -> stream template under a real Airflow.

For each configuration (``--configs``, ``<tables>:<changes/s>``; default 1 table and 4 tables at 500 changes/s,
4 tables at 1,000) the benchmark creates the tables, writes a DAG file of ``history_stream_dag(mode="continuous",
tables=[...])`` into the DAG folder of an Airflow of its own (api-server, scheduler, dag-processor, triggerer;
LocalExecutor; metadata DB on the stack's PostgreSQL: the e2e tests' harness) and unpauses it: the scheduler runs
the full loads, then the capture and the Spark stream side by side. Once a change made then is in every current
table, a writer process changes the tables in turn at a steady rate for ``--warmup`` + ``--seconds``, in
``--per-txn``-row transactions: 80 % updates, 10 % deletes with the same keys inserted again in the same
transaction, 10 % updates rolled back (never visible, not counted).

Each committed row carries the writer's clock just before COMMIT; a watcher per table lists its Delta log every
50 ms and reads the rows each new commit adds: the first appearance of a stamp gives its latency (source commit
-> visible to a reader of the table). Changes overwritten before they became visible are not counted. Whether
the lag stays flat: the p99 of the measured window's first and last third.

Prints p50/p90/p99/max per configuration; JSON in ``benchmarks/results/freshness_dag-<commit>-<time>.json``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import threading
import time
import uuid
from pathlib import Path

import _support
from bench_freshness import Watcher, _percentile, create_tables, latency_figures

FACTORY = "exactly_once_provider.templates.history_stream.history_stream_dag"


def _write(tables: list[str], rows: int, rate: float, per_txn: int, seconds: float, result) -> None:
    """Change the tables in turn at ``rate`` committed row changes/s for ``seconds`` (a child process)."""
    stack = _support.start_stack()
    conn = _support.connect_source(stack)
    cur = conn.cursor()
    rng = random.Random(1)
    counts = {"updates": 0, "reinserts": 0, "rolled_back": 0, "transactions": 0}
    changes, behind, turn = 0, 0.0, 0
    start = next_at = time.monotonic()
    while next_at - start < seconds:
        table = tables[turn % len(tables)]
        turn += 1
        ids = ", ".join(map(str, rng.sample(range(1, rows + 1), per_txn)))
        roll = rng.random()
        cur.execute("START TRANSACTION")
        if roll < 0.1:  # rolled back: never visible
            cur.execute(f"UPDATE {table} SET v = v + 1, stamp = 0 WHERE id IN ({ids})")
            cur.execute("ROLLBACK")
            counts["rolled_back"] += 1
            continue
        stamp = time.time_ns() // 1000
        if roll < 0.2:  # a delete, then the same keys again: two changes per row, the insert's image wins
            cur.execute(f"DELETE FROM {table} WHERE id IN ({ids})")
            cur.executemany(
                f"INSERT INTO {table} VALUES (%s, 0, %s, %s)", [(int(i), stamp, "y" * 80) for i in ids.split(", ")]
            )
            counts["reinserts"] += per_txn
            done = 2 * per_txn
        else:
            cur.execute(f"UPDATE {table} SET v = v + 1, stamp = %s WHERE id IN ({ids})", (stamp,))
            counts["updates"] += per_txn
            done = per_txn
        cur.execute("COMMIT")
        counts["transactions"] += 1
        changes += done
        next_at += done / rate
        behind = max(behind, time.monotonic() - next_at)
        time.sleep(max(0.0, next_at - time.monotonic()))
    result.update(changes=changes, seconds=time.monotonic() - start, max_behind_s=behind, **counts)
    conn.close()


def _wait(condition, timeout: float, what: str, explain=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"not within {timeout:.0f}s: {what}\n{explain()}")
        time.sleep(1)


def apply_cpu_seconds(app_name: str) -> float | None:
    """Return the CPU seconds (user + system) the Spark application ``app_name`` used so far: its spark-submit
    JVM (the driver, local mode) and every process under it (the Python driver, its workers); None if not found."""
    import psutil

    total, found = 0.0, False
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        try:
            if not cmdline or "java" not in cmdline[0] or "--spec" not in cmdline:
                continue
            spec = json.loads(Path(cmdline[cmdline.index("--spec") + 1]).read_text())  # the job's spec file
            if spec.get("app_name") != app_name:
                continue
            found = True
            for each in [proc, *proc.children(recursive=True)]:
                times = each.cpu_times()
                total += times.user + times.system
        except (psutil.Error, OSError, ValueError, IndexError):
            continue
    return total if found else None


def _measure(stack, server, args, n_tables: int, rate: float, work: Path, changing: int | None = None) -> dict:
    """Run the template on ``n_tables`` new tables with the writer at ``rate`` over the first ``changing`` of
    them (default: all); return its figures, the apply's CPU seconds per minute included."""
    from tests.airflow_support import write_template_dag

    client = server.client
    prefix = f"fd_{uuid.uuid4().hex[:6]}"
    tables = [f"{prefix}_{i}" for i in range(n_tables)]
    conn = _support.connect_source(stack)
    cur = conn.cursor()
    create_tables(cur, tables, args.rows)
    dag_id, root = f"eo_fresh_{prefix}", work / prefix
    write_template_dag(
        server.dags,
        dag_id,
        FACTORY,
        {
            "dag_id": dag_id,
            "schema": stack.DB_NAME,
            "tables": tables,
            "key_column": "id",
            "pipeline": f"fresh-{prefix}",
            "table_path": str(root / "{table}"),
            "checkpoint_location": str(root / "checkpoint"),
            "start_date": "2026-01-01T00:00:00+00:00",
            "mode": "continuous",
            "run_for": {"seconds": args.warmup + args.seconds + 1800},
            "stream_interval": args.interval,
            "spark_conf": stack.spark_conf(),  # the connector jars, as a user's Spark has them
        },
    )
    started = time.monotonic()
    client.wait_dag(dag_id)
    client.unpause(dag_id)  # @continuous: the scheduler starts the first run itself
    paths = {t: root / t for t in tables}

    def explain() -> str:
        runs = client.runs(dag_id)
        return client.describe(dag_id, runs[0]["dag_run_id"]) if runs else "no run"

    _wait(lambda: all((p / "_delta_log").is_dir() for p in paths.values()), 900, "the full loads", explain)
    busy = tables[: changing or n_tables]  # the tables the writer changes; the others stay idle
    watchers = [Watcher(str(paths[t]), 0, measure_from_us=2**62) for t in busy]
    for watcher in watchers:
        watcher.start()
    # Up when a change made now is in every changing table (a stream commit after the full load's).
    for table in busy:
        cur.execute(f"UPDATE {table} SET stamp = 1 WHERE id = 1")
    conn.commit()
    _wait(lambda: all(w.newest.get(1) == 1 for w in watchers), 900, "a first change in every table", explain)
    result: dict = {
        "tables": n_tables,
        "changing": len(busy),
        "rate": rate,
        "pipeline_up_s": round(time.monotonic() - started, 1),
    }
    measure_from = time.time_ns() // 1000 + int(args.warmup * 1e6)
    for watcher in watchers:
        watcher.measure_from_us = measure_from
    app = f"eo-fresh-{prefix}-apply"
    cpu_from: list = []
    threading.Timer(args.warmup, lambda: cpu_from.append((time.monotonic(), apply_cpu_seconds(app)))).start()
    manager = multiprocessing.get_context("spawn").Manager()
    written = manager.dict()
    writer = multiprocessing.get_context("spawn").Process(
        target=_write, args=(busy, args.rows, rate, args.per_txn, args.warmup + args.seconds, written)
    )
    writer.start()
    try:
        while writer.is_alive():
            writer.join(30)
            seen = [x for w in watchers for x in w.latencies]
            print(
                f"  {n_tables} table(s) at {rate:,.0f}/s, {time.monotonic() - started:6.0f}s: "
                f"{sum(w.commits for w in watchers)} commits, {len(seen):,} changes measured, p99 so far "
                f"{_percentile(seen, 0.99) if seen else float('nan'):.2f}s",
                flush=True,
            )
        cpu_to = (time.monotonic(), apply_cpu_seconds(app))  # the writer's end: the measured window's
        time.sleep(20)  # the last changes become visible
    finally:
        for watcher in watchers:
            watcher.stop.set()
            watcher.join(10)
        client.pause(dag_id)
        for run in client.runs(dag_id)[:1]:
            for task_id in ("capture", "apply"):
                client.mark(dag_id, run["dag_run_id"], task_id, "failed")  # on_kill stops the stream
    if writer.exitcode != 0:
        raise SystemExit(f"the writer failed (exit {writer.exitcode})")
    timed = sorted((t, x) for w in watchers for t, x in w.timed)
    lat = [x for _, x in timed]
    if not lat:
        raise SystemExit(f"no change became visible\n{explain()}")
    third = max(1, len(timed) // 3)
    if cpu_from and cpu_from[0][1] is not None and cpu_to[1] is not None:
        result["apply_cpu_s_per_min"] = round((cpu_to[1] - cpu_from[0][1]) / (cpu_to[0] - cpu_from[0][0]) * 60, 1)
    result.update(
        writer=dict(written),
        commits_per_table=[w.commits for w in watchers],
        **latency_figures(lat, args.seconds),
        p99_first_third_s=_percentile([x for _, x in timed[:third]], 0.99),
        p99_last_third_s=_percentile([x for _, x in timed[-third:]], 0.99),
    )
    for table in tables:
        cur.execute(f"DROP TABLE {table}")
    conn.close()
    return result


def main() -> None:
    args = _support.parse_args(
        __doc__,
        rows=10_000,
        repeats=1,
        extra=lambda p: (
            p.add_argument("--seconds", type=float, default=300),
            p.add_argument("--warmup", type=float, default=30),
            p.add_argument("--per-txn", type=int, default=5),
            p.add_argument("--interval", default="1 second", help="the template's stream_interval"),
            p.add_argument(
                "--configs",
                default="1:500,4:500,4:1000",
                help="comma-separated <tables>[/<changing tables>]:<changes/s> to run in turn (e.g. 100/10:500: 100 "
                "tables followed, the writer changing 10 of them)",
            ),
        ),
    )
    stack = _support.start_stack()
    from tests.airflow_support import AirflowServer

    configs = [
        (int(c.split(":")[0].split("/")[0]), float(c.split(":")[1]), int(c.split(":")[0].split("/")[-1]))
        for c in args.configs.split(",")
    ]
    work = Path(os.environ.get("EO_BENCH_DIR", "/var/tmp/eo-bench")) / f"fresh-dag-{uuid.uuid4().hex[:6]}"
    work.mkdir(parents=True)
    result = _support.result_header("freshness_dag", {**vars(args), "configs": configs})
    server = AirflowServer(stack, work / "airflow")
    server.start()
    runs = []
    try:
        for _ in range(args.repeats):
            for n_tables, rate, changing in configs:
                runs.append(_measure(stack, server, args, n_tables, rate, work, changing))
                print(f"  -> {runs[-1]}", flush=True)
    finally:
        server.stop()
    result["runs"] = runs
    path_json = _support.write_result(result)
    _support.print_table(
        f"freshness under Airflow: source commit -> visible in the current table ({result['commit']}, "
        f"{args.rows:,} rows per table, {args.seconds:.0f}s after a {args.warmup:.0f}s warm-up)",
        [
            "tables",
            "changing",
            "changes/s",
            "p50 s",
            "p90 s",
            "p99 s",
            "max s",
            "p99 1st/last third",
            "measured",
            "apply CPU s/min",
        ],
        [
            [
                r["tables"],
                r.get("changing", r["tables"]),
                f"{r['rate']:,.0f}",
                f"{r['p50_s']:.2f}",
                f"{r['p90_s']:.2f}",
                f"{r['p99_s']:.2f}",
                f"{r['max_s']:.2f}",
                f"{r['p99_first_third_s']:.2f} / {r['p99_last_third_s']:.2f}",
                f"{r['measured']:,}",
                r.get("apply_cpu_s_per_min", "–"),
            ]
            for r in runs
        ],
    )
    print(f"\nJSON: {path_json}")


if __name__ == "__main__":
    main()
