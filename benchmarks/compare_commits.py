"""Benchmark two commits side by side: one benchmark script of each commit, interleaved, on the same stack.

Not a test. A renovation must not cost speed, and a benchmark of the new commit alone cannot say so: the
machine's state moves between sessions. This runs the SAME benchmark script from two git worktrees (the base
commit and the head commit, each with its own ``benchmarks/`` and its own provider code) alternately in ABBA
order on the running stack, and compares the figures each run wrote.

Each side imports its own provider: the commit's ``provider/``, ``hooks/``, ``operators/`` and ``plugins/`` are
copied into ``exactly_once_provider/`` of a per-commit directory put first on ``PYTHONPATH`` (spark-submit's
Python driver and every Airflow process inherit it); before the first run each side is checked to import its
own copy. The worktrees are removed at the end.

The figures are the numbers under the result's ``runs`` (lists are pooled over the runs of one side), filtered by
``--metrics`` (shell patterns over the dotted names); the table shows each side's median and head / base.

    .venv/bin/python benchmarks/compare_commits.py --base 34f1137 --repeat 2 -- \\
        bench_spark_sinks.py --records 500000 --sinks delta,delta-s3 --repeat 1
    .venv/bin/python benchmarks/compare_commits.py --base 34f1137 --metrics '*p50_s,*p99_s' -- \\
        bench_freshness_dag.py --configs 1:500 --seconds 120 --warmup 20

Writes ``benchmarks/results/commits_<benchmark>-<head>-<time>.json`` (with every run's own result inside);
``--render <that JSON> [--metrics ...]`` computes its table again from the runs it holds.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _support

REPO = _support.REPO
WORK = Path(os.environ.get("EO_COMPARE_HOME", "/var/tmp/eo-compare"))
# The card's folders and where each lives inside the one import package (setup.cfg's package_dir).
PACKAGE_DIRS = {"provider": "", "hooks": "hooks", "operators": "operators", "plugins": "plugins"}
DEFAULT_METRICS = {
    "bench_spark_sinks.py": "*rows_per_s",
    "bench_freshness_dag.py": "*p50_s,*p90_s,*p99_s,*applied_per_s,*apply_cpu_s_per_min",
}


def short_sha(rev: str) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def prepare(sha: str) -> tuple[Path, dict[str, str]]:
    """Check the commit out beside the repository and build its import package; return the tree and its env."""
    tree, package = WORK / sha, WORK / f"{sha}-pkg" / "exactly_once_provider"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=REPO, check=True)
    shutil.rmtree(package.parent, ignore_errors=True)
    for folder, inside in PACKAGE_DIRS.items():
        shutil.copytree(tree / folder, package / inside, dirs_exist_ok=True, symlinks=True)
    env = {**os.environ, "PYTHONPATH": str(package.parent)}
    found = subprocess.run(
        [sys.executable, "-c", "import exactly_once_provider as p; print(p.__file__)"],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not found.startswith(str(package)):  # the editable install must not win over the copy
        raise SystemExit(f"{sha}: exactly_once_provider imports from {found}, not from {package}")
    return tree, env


def run_side(sha: str, tree: Path, env: dict[str, str], script: str, args: list[str]) -> dict:
    """Run the commit's benchmark script once; return the result it wrote."""
    results = tree / "benchmarks" / "results"
    before = set(results.glob("*.json")) if results.exists() else set()
    print(f"\n[compare] {sha}: {script} {' '.join(args)}", flush=True)
    started = time.monotonic()
    subprocess.run([sys.executable, str(tree / "benchmarks" / script), *args], cwd=tree, env=env, check=True)
    written = sorted(set(results.glob("*.json")) - before)
    if len(written) != 1:
        raise SystemExit(f"{sha}: {script} wrote {len(written)} results, expected 1: {written}")
    result = json.loads(written[0].read_text())
    if result["commit"] != sha or result.get("dirty"):
        raise SystemExit(f"{sha}: the result names commit {result['commit']} (dirty={result.get('dirty')})")
    print(f"[compare] {sha}: {time.monotonic() - started:.0f}s", flush=True)
    return result


def figures(node, prefix: str = "") -> dict[str, list[float]]:
    """Return the numbers under ``node`` by dotted name (a list of numbers is one figure's runs)."""
    found: dict[str, list[float]] = {}
    if isinstance(node, bool):
        return found
    if isinstance(node, (int, float)):
        return {prefix: [float(node)]}
    if isinstance(node, list) and node and all(isinstance(v, (int, float)) for v in node):
        return {prefix: [float(v) for v in node]}
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if isinstance(value, dict) and "tables" in value and "rate" in value:  # a freshness configuration
            key = f"{value['tables']}x{value['rate']:g}/s"
        for name, values in figures(value, f"{prefix}.{key}" if prefix else str(key)).items():
            found.setdefault(name, []).extend(values)
    return found


def _runs_text(values: list[float]) -> str:
    return " / ".join(f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" for v in values)


def table(result: dict, patterns: list[str]) -> tuple[str, list[str], list[list]]:
    """Pool each side's figures over its runs (``result["runs"]``); return the title, headers and rows of medians."""
    base, head = result["base"], result["head"]
    pooled: dict[str, dict[str, list[float]]] = {}
    for sha, results in result["runs"].items():
        pooled[sha] = {}
        for one in results:
            for name, values in figures(one).items():
                if any(fnmatch.fnmatch(name, p.strip()) for p in patterns):
                    pooled[sha].setdefault(name, []).extend(values)
    result["figures"] = pooled
    rows = []
    for name in sorted(pooled[head].keys() & pooled[base].keys()):
        old, new = statistics.median(pooled[base][name]), statistics.median(pooled[head][name])
        rows.append(
            [
                name,
                old,
                _runs_text(pooled[base][name]),
                new,
                _runs_text(pooled[head][name]),
                new / old if old else float("nan"),
            ]
        )
    return (
        f"`{result['script']} {' '.join(result['arguments'])}` from commit {head} and from {base}, "
        f"{result['repeats']} run(s) a side interleaved (ABBA) on the same stack",
        ["figure", f"{base} (median)", "runs", f"{head} (median)", "runs", f"{head} / {base}"],
        rows,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="the commit to compare against")
    parser.add_argument("--head", default="HEAD", help="the commit measured (default HEAD)")
    parser.add_argument("--repeat", type=int, default=2, help="runs a side, in ABBA order")
    parser.add_argument("--metrics", help="comma-separated patterns over the figures' dotted names")
    parser.add_argument("--keep", action="store_true", help="keep the worktrees")
    parser.add_argument("--render", help="render the table of a comparison's JSON again (e.g. with other --metrics)")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- bench_x.py [its arguments]")
    args = parser.parse_args()
    if args.render:
        path = Path(args.render)
        result = json.loads(path.read_text())
        title, headers, rows = table(result, (args.metrics or DEFAULT_METRICS.get(result["script"], "*")).split(","))
        _support.print_table(title, headers, rows)
        result["table"] = {"title": title, "headers": headers, "rows": rows}
        path.write_text(json.dumps(result, indent=1) + "\n")
        return 0
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    if not bench:
        parser.error("name the benchmark script after --, e.g. -- bench_spark_sinks.py --records 500000")
    if not args.base:
        parser.error("--base names the commit to compare against")
    script, bench_args = bench[0], bench[1:]
    patterns = (args.metrics or DEFAULT_METRICS.get(script, "*")).split(",")
    base, head = short_sha(args.base), short_sha(args.head)
    sides = {sha: prepare(sha) for sha in (head, base)}
    result = _support.result_header(
        f"commits_{Path(script).stem.removeprefix('bench_')}",
        {"base": base, "head": head, "script": script, "arguments": bench_args, "repeats": args.repeat},
    )
    # The measured commit and its state are the worktrees' (each run's result is checked to name its commit, clean),
    # whatever the tree this script runs from is at.
    result["commit"], result["dirty"] = head, False
    runs: dict[str, list[dict]] = {head: [], base: []}
    try:
        for run in range(args.repeat):
            for sha in (head, base) if run % 2 == 0 else (base, head):
                runs[sha].append(run_side(sha, *sides[sha], script, bench_args))
    finally:
        if not args.keep:
            for sha in sides:
                subprocess.run(["git", "worktree", "remove", "--force", str(WORK / sha)], cwd=REPO, check=False)
                shutil.rmtree(WORK / f"{sha}-pkg", ignore_errors=True)
    result["runs"] = {sha: [one["runs"] for one in results] for sha, results in runs.items()}
    _support.report(result, *table(result, patterns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
