"""Freshness of the continuous history -> stream pipeline: source commit -> row visible in the current table.

Runs what ``history_stream_dag(mode="continuous")`` runs, outside Airflow: the full load
(MySqlFullLoadOperator), then side by side the binlog capture (BinlogCaptureOperator, continuous, in its own
process) and the Spark stream (the kafka_to_sink job, ``mode current``, processing-time trigger), while a writer
process updates random rows at a steady rate (``--rate`` changes/s, ``--per-txn`` rows per transaction) for
``--seconds`` after a ``--warmup``. ``--tables N`` (N > 1) follows N tables in one application and compares,
interleaved, one query per table (the template before it shared one) with one shared query split per table
(what the template runs), the writer's transactions going to all N tables in turn, then to the first only.

Each update stamps its rows with the writer's clock just before COMMIT; a watcher per table lists its Delta log
every 50 ms and reads the rows each new commit adds: the first appearance of a stamp gives its latency (source commit -> visible to a reader of the table; overstated by the COMMIT itself,
a few ms). Updates overwritten by a newer one before they became visible are not counted (nobody could see them).

Prints p50/p90/p99/max and the changes/s written and applied; JSON in
``benchmarks/results/freshness-<commit>-<time>.json`` (``freshness_tables-...`` with ``--tables``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import statistics
import threading
import time
import uuid
from pathlib import Path

import _support

PIPELINE_PREFIX = "bench-fresh"


def _write(tables: list[str], rows: int, rate: float, per_txn: int, seconds: float, result) -> None:
    """Update ``per_txn`` random rows per transaction at ``rate`` changes/s for ``seconds``, the tables in turn
    (a child process)."""
    stack = _support.start_stack()
    conn = _support.connect_source(stack)
    cur = conn.cursor()
    rng = random.Random(1)
    interval, changes, behind = per_txn / rate, 0, 0.0
    start = next_at = time.monotonic()
    while next_at - start < seconds:
        ids = rng.sample(range(1, rows + 1), per_txn)
        table = tables[(changes // per_txn) % len(tables)]
        cur.execute("START TRANSACTION")
        cur.execute(
            f"UPDATE {table} SET v = v + 1, stamp = %s WHERE id IN ({', '.join(map(str, ids))})",
            (time.time_ns() // 1000,),
        )
        cur.execute("COMMIT")
        changes += per_txn
        next_at += interval
        behind = max(behind, time.monotonic() - next_at)
        time.sleep(max(0.0, next_at - time.monotonic()))
    result.update(changes=changes, seconds=time.monotonic() - start, max_behind_s=behind)
    conn.close()


def _capture(tables: list[str], pipeline: str, paths: dict[str, str], seconds: float, commit_ms: int) -> None:
    """Run the continuous binlog capture for ``seconds`` (a child process: its own interpreter, as in Airflow)."""
    _support.start_stack()
    from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator

    BinlogCaptureOperator(
        task_id="capture",
        tables=tables,
        pipeline=pipeline,
        full_load_paths=paths,
        mode="continuous",
        max_runtime=seconds,
        commit_interval_ms=commit_ms,
    ).execute({})


class Watcher(threading.Thread):
    """Read each new commit of the table's Delta log as it appears; record every new stamp's latency."""

    def __init__(self, path: str, first_version: int, measure_from_us: int) -> None:
        super().__init__(daemon=True)
        self.log = Path(path) / "_delta_log"
        self.root = Path(path)
        self.version = first_version
        self.measure_from_us = measure_from_us
        self.latencies: list[float] = []
        self.timed: list[tuple[int, float]] = []  # (visible at, µs since the epoch; latency s), in commit order
        self.newest: dict[int, int] = {}
        self.commits = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            nxt = self.log / f"{self.version + 1:020d}.json"
            if not nxt.exists():
                time.sleep(0.05)
                continue
            self._read(nxt)
            self.version += 1

    def _read(self, commit: Path) -> None:
        import pyarrow.parquet as pq

        visible_us = commit.stat().st_mtime_ns // 1000
        self.commits += 1
        for line in commit.read_text().splitlines():
            add = json.loads(line).get("add")
            if not add:
                continue
            table = pq.read_table(self.root / add["path"], columns=["id", "stamp"])
            for key, stamp in zip(table.column("id").to_pylist(), table.column("stamp").to_pylist()):
                if stamp is not None and stamp > self.newest.get(key, 0):
                    self.newest[key] = stamp
                    if stamp >= self.measure_from_us:
                        self.latencies.append((visible_us - stamp) / 1e6)
                        self.timed.append((visible_us, self.latencies[-1]))


def create_tables(cur, tables: list[str], rows: int) -> None:
    """Create each table (``id``, ``v``, ``stamp``: the writer's clock, ``pad``) with ``rows`` rows."""
    for table in tables:
        cur.execute(
            f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, v BIGINT NOT NULL, stamp BIGINT NULL, "
            "pad VARCHAR(100) NOT NULL)"
        )
        for start in range(0, rows, 10_000):
            cur.executemany(
                f"INSERT INTO {table} VALUES (%s, 0, NULL, %s)",
                [(i, "x" * 80) for i in range(start + 1, min(rows, start + 10_000) + 1)],
            )


def latency_figures(latencies: list[float], seconds: float) -> dict:
    """Return p50/p90/p99/max of ``latencies`` and how many were measured per second of ``seconds``."""
    return {
        "measured": len(latencies),
        "p50_s": _percentile(latencies, 0.5),
        "p90_s": _percentile(latencies, 0.9),
        "p99_s": _percentile(latencies, 0.99),
        "max_s": max(latencies),
        "applied_per_s": len(latencies) / seconds,
    }


def _without(args: list[str], *options: str) -> list[str]:
    """Return command-line ``args`` without ``options`` and their values."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        else:
            kept.append(arg)
    return kept


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _measure(stack, args, n_tables: int, queries: str, busy: int) -> dict:
    """Run the pipeline on ``n_tables`` new tables (the writer changing the first ``busy``); return its figures."""
    from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
    from exactly_once_provider.sinks import delta_commit
    from tests import spark_job_support as jobs

    prefix, pipeline = f"fresh_{uuid.uuid4().hex[:6]}", f"{PIPELINE_PREFIX}-{uuid.uuid4().hex[:6]}"
    tables = [f"{prefix}_{i}" for i in range(n_tables)]
    work = Path(os.environ.get("EO_BENCH_DIR", "/var/tmp/eo-bench")) / pipeline
    work.mkdir(parents=True)
    paths = {t: str(work / t) for t in tables}
    conn = _support.connect_source(stack)
    cur = conn.cursor()
    create_tables(cur, tables, args.rows)
    result: dict = {"tables": n_tables, "queries": queries if n_tables > 1 else "one", "busy_tables": busy}
    started = time.monotonic()
    for table in tables:
        MySqlFullLoadOperator(
            task_id="load",
            table=table,
            sink_path=paths[table],
            chunk_rows=max(10_000, args.rows // 4),
            spark_conf=stack.spark_conf(),
        ).execute({})
    result["full_load_s"] = time.monotonic() - started
    run_for = args.warmup + args.seconds + 900  # both are stopped when the writing ends
    capture = multiprocessing.get_context("spawn").Process(
        target=_capture, args=(tables, pipeline, paths, run_for, args.capture_commit_ms)
    )
    capture.start()
    topics = {t: f"{pipeline}.{stack.DB_NAME}.{t}" for t in tables}
    job_args = jobs.job_args(
        stack, f"{pipeline}-apply", ",".join(topics.values()), work / "checkpoint", "delta", "", mode="current"
    ) + ["--trigger", "processing-time", "--interval", args.interval, "--max-runtime", str(run_for)]
    if n_tables > 1:  # one application: one query split per table, or one query per table
        shared = queries == "shared"
        routes = [
            {"topics": [topics[t]], "path": paths[t], **({} if shared else {"checkpoint": str(work / f"cp-{t}")})}
            for t in tables
        ]
        job_args = _without(job_args, "--topics", "--path") + ["--routes", json.dumps(routes)]
        if not shared:
            job_args = _without(job_args, "--checkpoint")
    else:
        job_args = _without(job_args, "--path") + ["--path", paths[tables[0]]]
    stream = jobs.start_job(stack, job_args, work / "stream.log")
    manager = multiprocessing.get_context("spawn").Manager()
    written = manager.dict()
    watchers = [Watcher(paths[t], delta_commit.newest_version(paths[t]), measure_from_us=2**62) for t in tables]
    for watcher in watchers:
        watcher.start()
    # The pipeline is up when one change made now is in each table: only then does the measured writing start.
    for table in tables:
        cur.execute(f"UPDATE {table} SET stamp = 1 WHERE id = 1")
    deadline = time.monotonic() + 600
    while any(w.commits == 0 for w in watchers):
        if time.monotonic() > deadline or stream.poll() is not None or not capture.is_alive():
            raise SystemExit(f"the pipeline did not apply a first change within 600s; see {work / 'stream.log'}")
        time.sleep(0.5)
    result["pipeline_up_s"] = time.monotonic() - started
    measure_from = time.time_ns() // 1000 + int(args.warmup * 1e6)
    for watcher in watchers:
        watcher.measure_from_us = measure_from
    writer = multiprocessing.get_context("spawn").Process(
        target=_write, args=(tables[:busy], args.rows, args.rate, args.per_txn, args.warmup + args.seconds, written)
    )
    writer.start()
    try:
        while writer.is_alive():
            writer.join(30)
            latencies = [x for w in watchers for x in w.latencies]
            print(
                f"  {result['queries']} query, {n_tables} tables ({busy} changing), "
                f"{time.monotonic() - started:6.0f}s: {sum(w.commits for w in watchers)} stream commits, "
                f"{len(latencies):,} changes measured, p50 so far "
                f"{statistics.median(latencies) if latencies else float('nan'):.2f}s",
                flush=True,
            )
        time.sleep(15)  # the last changes become visible
    finally:
        for watcher in watchers:
            watcher.stop.set()
            watcher.join(10)
        capture.kill()
        jobs.sigkill_group(stream)
    if stream.poll() not in (None, 0, -9):
        raise SystemExit(f"the stream failed; see {work / 'stream.log'}")
    lat = [x for w in watchers for x in w.latencies]
    if not lat:
        raise SystemExit(f"no change became visible; see {work / 'stream.log'}")
    result.update(
        writer=dict(written),
        commits=sum(w.commits for w in watchers),
        commits_per_table=[w.commits for w in watchers],
        **latency_figures(lat, args.seconds),
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
            p.add_argument("--rate", type=float, default=500),
            p.add_argument("--per-txn", type=int, default=5),
            p.add_argument("--interval", default="1 second", help="the stream's processing-time trigger"),
            p.add_argument(
                "--tables",
                type=int,
                default=1,
                help="N > 1: compare, interleaved, one query per table with one shared query, the writer "
                "changing all N tables and then only the first",
            ),
            p.add_argument(
                "--only",
                choices=("per-table", "shared"),
                default=None,
                help="with --tables: run this one of the two (all N tables changing, then one) instead of both",
            ),
            p.add_argument(
                "--capture-commit-ms",
                type=int,
                default=None,
                help="the capture's Kafka transaction interval (default: the continuous template's)",
            ),
        ),
    )
    stack = _support.start_stack()
    from exactly_once_provider.templates.history_stream import CONTINUOUS_COMMIT_INTERVAL_MS

    args.capture_commit_ms = args.capture_commit_ms or CONTINUOUS_COMMIT_INTERVAL_MS
    if args.tables == 1:
        result = {**_support.result_header("freshness", vars(args)), **_measure(stack, args, 1, "one", 1)}
        path_json = _support.write_result(result)
        _print([result], result["commit"], args)
        print(f"\nJSON: {path_json}")
        return
    result = _support.result_header("freshness_tables", vars(args))
    runs = []
    for _ in range(args.repeats):  # interleaved: each configuration once per repeat
        for busy in (args.tables, 1):
            for queries in [args.only] if args.only else ("per-table", "shared"):
                runs.append(_measure(stack, args, args.tables, queries, busy))
    result["runs"] = runs
    path_json = _support.write_result(result)
    _print(runs, result["commit"], args)
    print(f"\nJSON: {path_json}")


def _print(runs: list[dict], commit: str, args) -> None:
    _support.print_table(
        f"freshness: source commit -> visible in the current table ({commit}, {args.rows:,} rows per table, "
        f"{args.rate:,.0f} changes/s written for {args.seconds:.0f}s after {args.warmup:.0f}s warm-up)",
        ["query", "tables", "changing", "p50 s", "p90 s", "p99 s", "max s", "changes seen", "stream commits"],
        [
            [
                r["queries"],
                r["tables"],
                r["busy_tables"],
                r["p50_s"],
                r["p90_s"],
                r["p99_s"],
                r["max_s"],
                f"{r['measured']:,}",
                r["commits"],
            ]
            for r in runs
        ],
    )


if __name__ == "__main__":
    main()
