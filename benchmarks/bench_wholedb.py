"""A whole database against one table of the same rows: the history -> stream template's first run, as users run it.

Under an Airflow of its own (api-server, scheduler, dag-processor, triggerer; LocalExecutor: the e2e tests'
harness), for each repeat and in alternating order:

* **many**: ``--tables`` new tables (default 100) of mixed key shapes (an integer, a text and a composite primary
  key in turn) and skewed sizes (the i-th table ~1/(i+1) of the largest; ``--rows`` in all, default 2M; at least
  100 rows each), followed by ONE DAG ``history_stream_dag(tables=["<prefix>_*"])``: the tables by pattern;
* **one**: ONE table of the same ``--rows`` (integer key), ``history_stream_dag(table=...)``.

Each side's DAG is triggered once through the REST API, as the UI does: its first run (preflight -> the full
load -> the first increment -> the reconciliation of every table) is timed from the run's start to its end as
Airflow records them, and each task's own start to end (where the time goes). The template's defaults (chunk
sizes from each table's row estimate, readers chosen by size); the tables are created before the DAG file is
written (not timed). Target (issue 40): many <= 2x one.

Prints the figures; JSON in ``benchmarks/results/wholedb-<commit>-<time>.json``.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime
from pathlib import Path

import _support

FACTORY = "exactly_once_provider.templates.history_stream.history_stream_dag"
KEY_SHAPES = ("integer", "text", "composite")


def table_sizes(tables: int, rows: int, smallest: int = 100) -> list[int]:
    """Return skewed table sizes summing to ``rows``: the i-th ~1/(i+1) of the largest, at least ``smallest``."""
    weights = [1 / (i + 1) for i in range(tables)]
    sizes = [max(smallest, int(rows * w / sum(weights))) for w in weights]
    sizes[0] += rows - sum(sizes)
    return sizes


def create_table(cur, name: str, shape: str, rows: int) -> None:
    """Create ``name`` with a key of ``shape`` and fill it with ``rows`` rows (MariaDB's sequence engine)."""
    key = {
        "integer": ("id BIGINT NOT NULL", "PRIMARY KEY (id)", "seq"),
        "text": ("code VARCHAR(24) NOT NULL", "PRIMARY KEY (code)", "CONCAT('k', LPAD(seq, 12, '0'))"),
        "composite": ("a INT NOT NULL, b INT NOT NULL", "PRIMARY KEY (a, b)", "seq DIV 1000, seq MOD 1000"),
    }[shape]
    columns = {"integer": "id", "text": "code", "composite": "a, b"}[shape]
    cur.execute(
        f"CREATE TABLE {name} ({key[0]}, v INT NOT NULL, s VARCHAR(20) NOT NULL, amount DECIMAL(12,2) NOT NULL, "
        f"{key[1]})"
    )
    cur.execute(
        f"INSERT INTO {name} ({columns}, v, s, amount) SELECT {key[2]}, seq % 1000, CONCAT('s', seq), seq / 100 "
        f"FROM seq_1_to_{rows}"
    )


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return round((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 1)


def _first_run(stack, server, args, side: str, work: Path) -> dict:
    """Create the side's tables, write its DAG, trigger its first run; return the run's and its tasks' seconds."""
    from tests.airflow_support import write_template_dag

    client = server.client
    prefix = f"wd_{uuid.uuid4().hex[:6]}"
    conn = _support.connect_source(stack)
    cur = conn.cursor()
    if side == "many":
        sizes = table_sizes(args.tables, args.rows)
        names = [f"{prefix}_{i:03d}" for i in range(args.tables)]
        for i, (name, size) in enumerate(zip(names, sizes, strict=True)):
            create_table(cur, name, KEY_SHAPES[i % len(KEY_SHAPES)], size)
        which = {"tables": [f"{prefix}_*"]}
    else:
        sizes, names = [args.rows], [prefix]
        create_table(cur, prefix, "integer", args.rows)
        which = {"table": prefix}
    cur.execute("ANALYZE TABLE " + ", ".join(names))  # the row estimates the full load sizes its chunks from
    cur.fetchall()
    dag_id, root = f"eo_wholedb_{prefix}", work / prefix
    write_template_dag(
        server.dags,
        dag_id,
        FACTORY,
        {
            "dag_id": dag_id,
            "schema": stack.DB_NAME,
            **which,
            "pipeline": f"wd-{prefix}",
            "table_path": str(root / "{table}"),
            "checkpoint_location": str(root / "checkpoint"),
            "start_date": "2099-01-01T00:00:00+00:00",  # no scheduled run: the one run is triggered
            "spark_conf": stack.spark_conf(),  # the connector jars, as a user's Spark has them
            "retries": 0,
        },
    )
    client.wait_dag(dag_id, timeout=300)
    client.unpause(dag_id)
    print(f"  {side}: {len(names)} table(s), {sum(sizes):,} rows: run triggered", flush=True)
    run = client.trigger(dag_id)
    done = client.wait_run(dag_id, run, timeout=3600)
    tasks = {
        t["task_id"]: _seconds(t.get("start_date"), t.get("end_date"))
        for t in client.task_instances(dag_id, run)
        if t["state"] == "success"
    }
    result = {
        "side": side,
        "tables": len(names),
        "rows": sum(sizes),
        "run_s": _seconds(done.get("start_date"), done.get("end_date")),
        "tasks_s": tasks,
    }
    client.pause(dag_id)
    for name in names:
        cur.execute(f"DROP TABLE {name}")
    conn.close()
    _support.delete_topics(stack, [f"wd-{prefix}.{stack.DB_NAME}.{n}" for n in names])
    return result


def _text(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f}"


def main() -> None:
    args = _support.parse_args(
        __doc__,
        rows=2_000_000,
        repeats=1,
        extra=lambda p: p.add_argument("--tables", type=int, default=100),
    )
    stack = _support.start_stack()
    from tests.airflow_support import AirflowServer

    work = Path(os.environ.get("EO_BENCH_DIR", "/var/tmp/eo-bench")) / f"wholedb-{uuid.uuid4().hex[:6]}"
    work.mkdir(parents=True)
    result = _support.result_header("wholedb", vars(args))
    server = AirflowServer(stack, work / "airflow")
    server.start()
    runs = []
    started = time.monotonic()
    try:
        for repeat in range(args.repeats):
            for side in ("one", "many") if repeat % 2 == 0 else ("many", "one"):
                runs.append(_first_run(stack, server, args, side, work))
                print(f"  -> {runs[-1]}", flush=True)
    finally:
        server.stop()
    result["runs"] = runs
    result["seconds"] = round(time.monotonic() - started, 1)
    by_side = {side: [r["run_s"] for r in runs if r["side"] == side] for side in ("one", "many")}
    result["ratio_many_to_one"] = round(sum(by_side["many"]) / sum(by_side["one"]), 2)
    path_json = _support.write_result(result)
    tasks = sorted({t for r in runs for t in r["tasks_s"]}, key=lambda t: min(r["tasks_s"].get(t) or 0 for r in runs))
    _support.print_table(
        f"first run of the history -> stream template ({result['commit']}): {args.tables} tables vs one table, "
        f"{args.rows:,} rows each side; seconds (run start -> end, then each task's)",
        ["side", "tables", "run s", *tasks],
        [
            [r["side"], r["tables"], f"{r['run_s']:.1f}", *(_text(r["tasks_s"].get(t)) for t in tasks)]
            for r in sorted(runs, key=lambda r: r["side"], reverse=True)
        ],
    )
    print(f"\nmany / one: {result['ratio_many_to_one']}x (target <= 2x)\nJSON: {path_json}")


if __name__ == "__main__":
    main()
