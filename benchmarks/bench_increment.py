"""Wall time of one increment of the scheduled history -> stream template, and its reconciliation vs table size.

For each table size (``--sizes``, default 10,000 and 1,000,000 rows) the benchmark creates a table, runs the
template's first run (``airflow dags test``: the full load and a first increment; not measured), then ``--repeats``
rounds of two increments, each after ``--changes`` new source changes (updates, inserts, deletes in 5-statement
transactions): an ordinary increment (its reconciliation compares only the keys changed since the last clean one,
read in the task with delta-rs) and one with the ``full_reconcile`` Param (the whole table, in a Spark
application: what every increment did before the incremental scope, and what the template still runs nightly).
The two kinds alternate ABBA. Timers: the DAG run's start -> end (its duration in the UI), the whole ``airflow dags
test`` process (its CLI start, DAG parse and in-process API server included), and each task's own start -> end, from
Airflow's metadata DB.

Prints medians per size and kind; JSON in ``benchmarks/results/increment-<commit>-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import _support

KINDS = ("changed", "full")


def _airflow_home(work: Path) -> dict:
    home = work / "airflow_home"
    home.mkdir(parents=True)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True
    )
    return env


def _fill(cur, table: str, rows: int) -> None:
    cur.execute(
        f"CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, "
        "currency CHAR(3) NOT NULL, note VARCHAR(40) NULL, updated DATETIME(6) NOT NULL)"
    )
    cur.execute(
        f"INSERT INTO {table} (id, amount, currency, note, updated) SELECT seq, seq % 99991 / 100, "
        f"ELT(1 + seq % 3, 'EUR', 'USD', 'CNY'), CONCAT('n', seq), '2026-11-01' FROM seq_1_to_{rows}"
    )


def _change(cur, table: str, rows: int, changes: int, rng: random.Random) -> None:
    """Make ``changes`` row changes: 80% updates, 10% inserts, 10% deletes, 5 statements a transaction."""
    done = 0
    while done < changes:
        cur.execute("START TRANSACTION")
        for _ in range(min(5, changes - done)):
            roll = rng.random()
            if roll < 0.8:
                cur.execute(
                    f"UPDATE {table} SET amount = amount + 1, updated = NOW(6) WHERE id = %s", (rng.randint(1, rows),)
                )
            elif roll < 0.9:
                cur.execute(f"INSERT INTO {table} (amount, currency, note, updated) VALUES (1, 'EUR', 'new', NOW(6))")
            else:
                cur.execute(f"DELETE FROM {table} WHERE id = %s", (rng.randint(1, rows),))
            done += 1
        cur.execute("COMMIT")


def _seconds(start: str, end: str) -> float:
    return round((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 2)


def _run_seconds(env: dict, dag_id: str) -> tuple[float, dict[str, float]]:
    """Return the DAG's newest run's start -> end seconds (its duration in the UI) and each task's, from the
    metadata DB."""
    db = sqlite3.connect(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///"))
    run_id, start, end = db.execute(
        "SELECT run_id, start_date, end_date FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", (dag_id,)
    ).fetchone()
    found = db.execute(
        "SELECT task_id, start_date, end_date FROM task_instance WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)
    ).fetchall()
    db.close()
    return _seconds(start, end), {task: _seconds(t0, t1) for task, t0, t1 in found if t0 and t1}


def _run(dag, env: dict, kind: str, log: Path) -> dict:
    started = time.monotonic()
    output = dag.test(conf={"full_reconcile": kind == "full"}, timeout=3600)
    wall = time.monotonic() - started
    log.write_text(output)
    assert "CLEAN" in output, output[-3000:]
    run_s, tasks_s = _run_seconds(env, dag.dag_id)
    return {"kind": kind, "wall_s": round(wall, 2), "run_s": run_s, "tasks_s": tasks_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,1000000", help="comma-separated table sizes")
    parser.add_argument("--changes", type=int, default=1000, help="source changes before each increment")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of one increment of each kind (ABBA)")
    parser.add_argument("--spark-conf", default="{}", help="JSON: Spark settings added to the template's spark_conf")
    parser.add_argument(
        "--class-archive-dir",
        default=None,
        help="the Spark connection's driver-class-archive-dir (default: the stack's spark/cds; "
        "'' for none); the unmeasured first run writes the archive",
    )
    args = parser.parse_args()
    stack = _support.start_stack()
    archive_dir = str(stack.HOME / "spark" / "cds") if args.class_archive_dir is None else args.class_archive_dir
    if archive_dir:  # as a user turns it on: in the Spark connection
        os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(
            {"conn_type": "spark", "host": "local[*]", "extra": {"driver-class-archive-dir": archive_dir}}
        )
    from tests.template_support import TemplateDag

    sizes = [int(s) for s in args.sizes.split(",")]
    result = _support.result_header(
        "increment",
        {
            "sizes": sizes,
            "changes": args.changes,
            "repeats": args.repeats,
            "spark_conf": json.loads(args.spark_conf),
            "driver_class_archive_dir": archive_dir,
        },
    )
    work = Path(os.environ.get("EO_BENCH_DIR", "/var/tmp/eo-bench")) / f"increment-{uuid.uuid4().hex[:6]}"
    env = _airflow_home(work)
    conn = _support.connect_source(stack)
    cur = conn.cursor()
    rng = random.Random(5)
    runs: dict[int, list[dict]] = {}
    for size in sizes:
        table = f"inc_{uuid.uuid4().hex[:6]}"
        _fill(cur, table, size)
        dag = TemplateDag(
            env,
            work / f"dags-{table}",
            f"eo_bench_{table}",
            "exactly_once_provider.templates.history_stream.history_stream_dag",
            {
                "dag_id": f"eo_bench_{table}",
                "schema": stack.DB_NAME,
                "table": table,
                "key_column": "id",
                "pipeline": f"bench-inc-{table}",
                "table_path": str(work / table / "current"),
                "checkpoint_location": str(work / table / "checkpoint"),
                "start_date": "2026-01-01T00:00:00+00:00",
                "chunk_rows": max(10_000, size // 4),
                "full_reconcile_hour": None,
                "spark_conf": {**stack.spark_conf(), **json.loads(args.spark_conf)},
                "retries": 0,
            },
        )
        started = time.monotonic()
        dag.test(timeout=3600)  # the full load and the first increment
        print(f"{size:,} rows: full load + first increment {time.monotonic() - started:.0f}s", flush=True)
        runs[size] = []
        order = [k for r in range(args.repeats) for k in (KINDS if r % 2 == 0 else KINDS[::-1])]  # ABBA
        for kind in order:
            _change(cur, table, size, args.changes, rng)
            run = _run(dag, env, kind, work / f"{table}-{len(runs[size])}-{kind}.log")
            runs[size].append(run)
            print(
                f"  {size:,} rows, {kind:<7} increment: run {run['run_s']:.1f}s, process {run['wall_s']:.1f}s "
                f"{json.dumps(run['tasks_s'])}",
                flush=True,
            )
        cur.execute(f"DROP TABLE {table}")
    conn.close()
    summary = []
    for size, found in runs.items():
        for kind in KINDS:
            mine = [r for r in found if r["kind"] == kind]
            tasks = {t: statistics.median(r["tasks_s"].get(t, 0.0) for r in mine) for t in mine[0]["tasks_s"]}
            summary.append(
                {
                    "rows": size,
                    "kind": kind,
                    "runs": len(mine),
                    "run_s": statistics.median(r["run_s"] for r in mine),
                    "wall_s": statistics.median(r["wall_s"] for r in mine),
                    "tasks_s": tasks,
                }
            )
    result.update(runs={str(k): v for k, v in runs.items()}, summary=summary)
    path = _support.write_result(result)
    steps = ["full_load", "retention_guard", "lag_gate", "capture", "apply", "reconcile"]
    _support.print_table(
        f"one increment of {args.changes:,} changes, scheduled history -> stream template ({result['commit']}, nproc "
        f"{result['nproc']}, medians of {args.repeats} runs a kind; load {result['loadavg_before'][0]:.1f} -> "
        f"{result['loadavg_after'][0]:.1f})",
        ["rows", "reconcile", "run s", "process s", *[f"{s} s" for s in steps]],
        [
            [f"{s['rows']:,}", s["kind"], s["run_s"], s["wall_s"], *[s["tasks_s"].get(step, "-") for step in steps]]
            for s in summary
        ],
    )
    print(f"\nJSON: {path}\nrun logs: {work}")


if __name__ == "__main__":
    main()
