"""Render a benchmark's JSON result as its Markdown table in docs/benchmarks.md (rewritten in place).

Usage: python benchmarks/results_table.py [RESULT.json ...]   (default: the newest result of each kind in
benchmarks/results/). A ``<kind>-*.json`` result's table goes between ``<!-- bench-<kind>:begin -->`` and
``<!-- bench-<kind>:end -->`` in docs/benchmarks.md (the fault matrix's, ``matrix``, in docs/reliability.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = (
    "history",
    "freshness",
    "freshness_tables",
    "freshness_dag",
    "increment",
    "wholedb",
    "capture",
    "producer",
    "full_load",
    "watermark",
    "spark_sinks",
    "reconcile",
    "commits_spark_sinks",
    "commits_freshness_dag",
    "matrix",
)
PAGES = {"matrix": "reliability.md"}


def _machine(result: dict) -> str:
    return (
        f"Commit `{result['commit']}`{' (uncommitted changes)' if result.get('dirty') else ''}, "
        f"started {result['started']}, nproc {result['nproc']}, load average before "
        f"{'/'.join(f'{x:.1f}' for x in result['loadavg_before'])}, after "
        f"{'/'.join(f'{x:.1f}' for x in result['loadavg_after'])}"
    )


def freshness_table(result: dict) -> str:
    """Return the Markdown for one freshness result: the latency percentiles and what was written and applied."""
    writer = result["writer"]
    return "\n".join(
        [
            f"{_machine(result)}; {result['rows']:,} rows, {writer['changes'] / writer['seconds']:,.0f} changes/s written "
            f"for {result['seconds']:.0f} s after a {result['warmup']:.0f} s warm-up, trigger every {result['interval']}"
            + (
                f", the capture committing every {result['capture_commit_ms']} ms."
                if "capture_commit_ms" in result
                else ", the capture committing every 1,000 ms."
            ),
            "",
            "| p50 s | p90 s | p99 s | max s | changes measured | applied changes/s | stream commits |",
            "|---|---|---|---|---|---|---|",
            f"| {result['p50_s']:.2f} | {result['p90_s']:.2f} | **{result['p99_s']:.2f}** | {result['max_s']:.2f} | "
            f"{result['measured']:,} | {result['applied_per_s']:,.0f} | {result['commits']} |",
            "",
        ]
    )


def freshness_dag_table(result: dict) -> str:
    """Return the Markdown for a freshness-under-Airflow result: per configuration, the latency percentiles."""
    lines = [
        f"{_machine(result)}; tables of {result['rows']:,} rows, written for {result['seconds']:.0f} s after a "
        f"{result['warmup']:.0f} s warm-up in {result['per_txn']}-row transactions (updates, deletes with the keys "
        f"inserted again, rolled-back updates), stream_interval {result['interval']}; {result['repeats']} repeat(s).",
        "",
        "| tables | changes/s written | p50 s | p90 s | p99 s | max s | p99 first / last third s | changes measured "
        "| stream commits per table |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        writer = r["writer"]
        lines.append(
            f"| {r['tables']} | {writer['changes'] / writer['seconds']:,.0f} | {r['p50_s']:.2f} | {r['p90_s']:.2f} | "
            f"**{r['p99_s']:.2f}** | {r['max_s']:.2f} | {r['p99_first_third_s']:.2f} / {r['p99_last_third_s']:.2f} | "
            f"{r['measured']:,} | {' / '.join(str(c) for c in r['commits_per_table'])} |"
        )
    return "\n".join(lines + [""])


def freshness_tables_table(result: dict) -> str:
    """Return the Markdown for a several-tables freshness result: per configuration run, the latency percentiles."""
    lines = [
        f"{_machine(result)}; {result['tables']} tables of {result['rows']:,} rows, {result['rate']:,.0f} changes/s "
        f"written for {result['seconds']:.0f} s after a {result['warmup']:.0f} s warm-up, trigger every "
        f"{result['interval']}, the capture committing every {result['capture_commit_ms']} ms; configurations "
        f"interleaved, {result['repeats']} repeat(s).",
        "",
        "| apply | tables changing | p50 s | p90 s | p99 s | max s | changes measured | stream commits per table |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        name = "one query per table" if r["queries"] == "per-table" else "one shared query"
        lines.append(
            f"| {name} | {r['busy_tables']} of {r['tables']} | {r['p50_s']:.2f} | {r['p90_s']:.2f} | "
            f"**{r['p99_s']:.2f}** | {r['max_s']:.2f} | {r['measured']:,} | "
            f"{' / '.join(str(c) for c in r['commits_per_table'])} |"
        )
    return "\n".join(lines + [""])


def capture_table(result: dict) -> str:
    """Return the Markdown for one capture result: per binlog size, rows/s of the raw read and the capture, and their ratio."""
    sizes = result.get("by_size") or [result]  # results before 2026-11-26: one size at the top level
    lines = [
        f"{_machine(result)}; median of {result['repeats']} interleaved runs per size.",
        "",
        "| row changes | reader | rows/s wall | runs | rows per CPU-second |",
        "|---:|---|---:|---|---:|",
    ]
    for size in sizes:
        for label, runs in size["runs"].items():
            lines.append(
                f"| {size['changes']:,} | {label} | {runs['median_wall']:,.0f} | "
                + " / ".join(f"{v:,.0f}" for v in runs["rows_per_s_wall"])
                + f" | {runs['median_cpu']:,.0f} |"
            )
        lines.append(
            f"| {size['changes']:,} | **ratio, setup included (target ≥ 0.8)** | **{size['ratio_wall']:.3f}** | | "
            f"**{size['ratio_cpu']:.3f}** |"
        )
    return "\n".join(lines + [""])


STEPS = ("preflight", "capture", "apply", "reconcile")


def increment_table(result: dict) -> str:
    """Return the Markdown for one increment result: wall and step seconds per table size and reconciliation."""
    lines = [
        f"{_machine(result)}; {result['changes']:,} source changes before each increment, median of "
        f"{result['repeats']} runs a kind (ABBA); `run` is the DAG run's start → end (its duration in the UI), "
        "`process` the whole `airflow dags test` process (CLI start, DAG parse and its in-process API server "
        "included), steps are the tasks' own start → end"
        + (
            "; drivers start from a class archive (`driver-class-archive-dir`)"
            if result.get("driver_class_archive_dir")
            else ""
        )
        + ".",
        "",
        "| rows | reconciliation | run s | process s | tasks s (sum) | " + " | ".join(f"{s} s" for s in STEPS) + " |",
        "|---" * (5 + len(STEPS)) + "|",
    ]
    for row in result["summary"]:
        tasks = row["tasks_s"]
        run = f"**{row['run_s']:.1f}**" if "run_s" in row else "–"
        lines.append(
            f"| {row['rows']:,} | {row['kind']} | {run} | {row['wall_s']:.1f} | {sum(tasks.values()):.1f} | "
            + " | ".join(f"{tasks.get(s, 0):.1f}" for s in STEPS)
            + " |"
        )
    return "\n".join(lines + [""])


def wholedb_table(result: dict) -> str:
    """Return the Markdown for a whole-database result: each side's first run and its tasks, and the ratio."""
    tasks = ["preflight", "choose_load", "full_load", "lag_gate", "capture", "apply", "reconcile"]
    lines = [
        f"{_machine(result)}; {result['repeats']} run(s) a side, interleaved; `run` is the DAG run's start → end under "
        "a real scheduler (its duration in the UI), the tasks their own start → end. **many / one: "
        f"{result['ratio_many_to_one']}x** (target ≤ 2x).",
        "",
        "| side | tables | rows | run s | " + " | ".join(f"{t} s" for t in tasks) + " |",
        "|---" * (4 + len(tasks)) + "|",
    ]
    for r in result["runs"]:
        lines.append(
            f"| {r['side']} | {r['tables']} | {r['rows']:,} | **{r['run_s']:.1f}** | "
            + " | ".join(f"{r['tasks_s'].get(t, 0):.1f}" for t in tasks)
            + " |"
        )
    return "\n".join(lines + [""])


def _cell(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:,.0f}"


def generic_table(result: dict) -> str:
    """Return the Markdown of a result written through ``_support.report``: its title and table as printed."""
    table = result["table"]
    # The load after a run is mostly the run itself (broker, Spark, database on 2 cores); other work shows before it.
    quiet = result.get("repeats", 3) >= 3 and result["loadavg_before"][0] < 2
    lines = [
        f"{_machine(result)}. {table['title']}."
        + (
            ""
            if quiet
            else " **Not a valid ratio: fewer than 3 repeats, or the machine was busy when it started "
            "(1-min load average 2 or more).**"
        ),
        "",
        "| " + " | ".join(table["headers"]) + " |",
        "|---" + "|---:" * (len(table["headers"]) - 1) + "|",
    ]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table["rows"]]
    return "\n".join(lines + [""])


def matrix_table(result: dict) -> str:
    """Return the Markdown for one fault-matrix result: a line per scenario, its runs summed."""
    lines = [
        f"{_machine(result)}; {result['runs']} run(s) of every scenario, {result['minutes']:.0f} min in all.",
        "",
        "| scenario | runs | rows per run | lost | duplicated | result | mean s |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, s in result["scenarios"].items():
        rows = (
            "-"
            if not s["rows"]
            else (str(s["rows"][0]) if min(s["rows"]) == max(s["rows"]) else f"{min(s['rows'])}-{max(s['rows'])}")
        )
        verdict = f"pass {s['passed']}/{s['runs']}" if s["ok"] else f"**FAIL** {s['runs'] - s['passed']}/{s['runs']}"
        lines.append(
            f"| {name} | {s['runs']} | {rows} | {s['lost']} | {s['duplicated']} | {verdict} | {s['mean_s']:.0f} |"
        )
    return "\n".join(lines + [""])


def table(result: dict) -> str:
    """Return the Markdown for one result: medians in ms per size, and the largest / smallest size ratio."""
    lines = [
        f"{_machine(result)}; median of {result['repeats']} interleaved runs (files: 5x as many, Delta: 3x), ms.",
        "",
    ]
    for kind, unit in (
        ("ledger", "records of other pipelines' history"),
        ("files", "published manifests"),
        ("delta (local)", "commits in the log"),
        ("delta (minio)", "commits in the log"),
        ("postgres", "rows of other pipelines"),
    ):
        sizes = list(result.get(kind, {}))
        if not sizes:
            continue
        lines.append(
            f"| {kind}: what \\ {unit} | "
            + " | ".join(f"{int(s):,}" for s in sizes)
            + f" | {int(sizes[-1]):,} / {int(sizes[0]):,} |"
        )
        lines.append("|---" * (len(sizes) + 2) + "|")
        for name in result[kind][sizes[0]]:
            medians = [result[kind][s][name]["median_s"] * 1000 for s in sizes]
            lines.append(
                f"| {name} | " + " | ".join(f"{m:,.1f}" for m in medians) + f" | **{medians[-1] / medians[0]:.2f}** |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    results = REPO / "benchmarks" / "results"
    paths = [Path(a).resolve() for a in sys.argv[1:]] or [
        newest[-1]
        for kind in KINDS
        # By the UTC time in the name (<kind>-<commit>-<time>.json): a fresh clone gives every file the same mtime.
        if (newest := sorted(results.glob(f"{kind}-*.json"), key=lambda p: p.stem.rsplit("-", 1)[-1]))
    ]
    if not paths:
        raise SystemExit("No benchmarks/results/*.json: run make bench (or one make bench-* target) first.")
    for path in paths:
        result = json.loads(path.read_text())
        kind = result.get("benchmark", "history")
        page = REPO / "docs" / PAGES.get(kind, "benchmarks.md")
        text = page.read_text()
        begin, end = f"<!-- bench-{kind}:begin -->", f"<!-- bench-{kind}:end -->"
        if begin not in text or end not in text:
            raise SystemExit(f"{page} has no {begin} ... {end} region.")
        body = (
            {
                "freshness": freshness_table,
                "freshness_tables": freshness_tables_table,
                "freshness_dag": freshness_dag_table,
                "increment": increment_table,
                "wholedb": wholedb_table,
                "matrix": matrix_table,
                "capture": capture_table,
            }.get(kind)
            or (generic_table if "table" in result else table)
        )(result)
        import plots  # here, not at the top: tests/faults/matrix.py imports this module from the repository root

        image = plots.draw(kind, result)
        if image is not None:
            body += f"\n![bench-{kind}, commit {result['commit']}](images/{image.name})\n"
        head, rest = text.split(begin, 1)
        page.write_text(f"{head}{begin}\n<!-- from {path.relative_to(REPO)} -->\n{body}\n{end}{rest.split(end, 1)[1]}")
        print(body)


if __name__ == "__main__":
    main()
