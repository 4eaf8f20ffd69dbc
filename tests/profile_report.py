"""Print where a test run's time went: by kind of cost, by test file, and the slowest tests (``make test-profile``).

Reads the JUnit XML that ``make test`` writes to ``.test-results/`` (each test's timed intervals are in its
``profile`` property: ``tests/profiling.py``). A test's time is split without double counting, each second going
to the first kind in this order that covers it:

    airflow start/stop > stack > spark session > spark app start-up > spark app work > airflow wait > sleep > own work

A spark-submit's first ``--spark-start`` seconds are its start-up (JVM, session, jars); the default is the
10th percentile of the run's spark-submit durations (the shortest applications are little but their start).
Times are worker-seconds: with N pytest workers the wall time of a part is about their sum divided by N.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ORDER = [
    "airflow start/stop",
    "stack",
    "spark session",
    "spark app start",
    "spark app work",
    "airflow wait",
    "sleep",
    "own work",
]
KIND = {
    "airflow_start": "airflow start/stop",
    "airflow_stop": "airflow start/stop",
    "stack": "stack",
    "spark_session": "spark session",
    "airflow_wait": "airflow wait",
    "sleep": "sleep",
}


def read_cases(paths: list[Path]) -> list[dict]:
    cases = []
    for path in paths:
        root = ET.parse(path).getroot()
        for case in root.iter("testcase"):
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                if case.find(tag) is not None:
                    outcome = tag
            cases.append(
                {
                    "part": path.stem,
                    "file": _module_path(case.get("classname", "")),
                    "name": case.get("name"),
                    "time": float(case.get("time") or 0),
                    "outcome": outcome,
                    "spans": json.loads(props.get("profile") or "[]"),
                }
            )
    return cases


def _module_path(classname: str) -> str:
    """``tests.unit.test_x.TestY`` -> ``tests/unit/test_x.py`` (the module is the first ``test_`` part)."""
    parts = classname.split(".")
    for index, part in enumerate(parts):
        if part.startswith("test_"):
            return "/".join(parts[: index + 1]) + ".py"
    return "/".join(parts) + ".py"


def spark_start_estimate(cases: list[dict]) -> float:
    durations = sorted(e - s for c in cases for kind, s, e in c["spans"] if kind == "spark_app" and e > s)
    if not durations:
        return 0.0
    return durations[max(0, len(durations) // 10 - 1)] if len(durations) >= 10 else durations[0]


def attribute(case: dict, spark_start: float) -> dict[str, float]:
    """Split one test's time into the kinds of ORDER (exclusive; the rest is its own work)."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for kind, start, end in case["spans"]:
        if kind == "spark_app":
            spans["spark app start"].append((start, min(end, start + spark_start)))
            if end > start + spark_start:
                spans["spark app work"].append((start + spark_start, end))
        else:
            spans[KIND[kind]].append((start, end))
    taken: list[tuple[float, float]] = []
    result = {}
    for kind in ORDER[:-1]:
        merged = _union(spans.get(kind, []))
        result[kind] = sum(_minus(merged, taken))
        taken = _union(taken + merged)
    result["own work"] = max(0.0, case["time"] - sum(result.values()))
    return result


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _minus(spans: list[tuple[float, float]], taken: list[tuple[float, float]]) -> list[float]:
    """Lengths of ``spans`` (merged) outside ``taken`` (merged)."""
    lengths = []
    for start, end in spans:
        length = end - start
        for t_start, t_end in taken:
            length -= max(0.0, min(end, t_end) - max(start, t_start))
        lengths.append(length)
    return lengths


def table(headers: list[str], rows: list[list], out) -> None:
    text = [[str(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in text) for i in range(len(headers))]
    for index, row in enumerate(text):
        out.write(
            "| "
            + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
            + " |\n"
        )
        if index == 0:
            out.write(
                "|" + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|\n"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="JUnit XML files (default: .test-results/*.xml)")
    parser.add_argument("--spark-start", type=float, help="seconds of a spark-submit counted as its start-up")
    parser.add_argument("--top", type=int, default=25, help="how many files and tests to list")
    args = parser.parse_args(argv)
    paths = args.paths or sorted(Path(".test-results").glob("*.xml"))
    if not paths:
        print("no JUnit XML: run make test first (it writes .test-results/*.xml)", file=sys.stderr)
        return 2
    cases = read_cases(paths)
    spark_start = args.spark_start if args.spark_start is not None else spark_start_estimate(cases)
    out = sys.stdout
    apps = [e - s for c in cases for kind, s, e in c["spans"] if kind == "spark_app"]
    out.write(
        f"{len(cases)} tests in {', '.join(str(p) for p in paths)}; worker-seconds; "
        f"{len(apps)} spark-submits (median {statistics.median(apps) if apps else 0:.1f} s), "
        f"start-up counted as the first {spark_start:.1f} s of each\n\n"
    )
    by_case = [(case, attribute(case, spark_start)) for case in cases]
    total = sum(c["time"] for c in cases) or 1.0

    out.write("By kind of cost\n\n")
    rows = []
    for kind in ORDER:
        seconds = sum(a[kind] for _, a in by_case)
        rows.append([kind, f"{seconds:,.0f}", f"{100 * seconds / total:.1f} %"])
    rows.append(["total", f"{total:,.0f}", "100 %"])
    table(["kind", "seconds", "share"], rows, out)

    out.write(f"\nBy test file (top {args.top})\n\n")
    files: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    apps_per_file: dict[str, int] = defaultdict(int)
    for case, split in by_case:
        counts[case["file"]] += 1
        apps_per_file[case["file"]] += sum(1 for kind, _, _ in case["spans"] if kind == "spark_app")
        files[case["file"]]["total"] += case["time"]
        for kind, seconds in split.items():
            files[case["file"]][kind] += seconds
    short = {
        "airflow start/stop": "airflow",
        "spark session": "session",
        "spark app start": "app start",
        "spark app work": "app work",
        "airflow wait": "af wait",
    }
    rows = [
        [name, counts[name], apps_per_file[name], f"{f['total']:.0f}", *[f"{f[kind]:.0f}" for kind in ORDER]]
        for name, f in sorted(files.items(), key=lambda kv: -kv[1]["total"])[: args.top]
    ]
    table(["file", "tests", "apps", "seconds", *[short.get(k, k) for k in ORDER]], rows, out)

    out.write(f"\nSlowest tests (top {args.top})\n\n")
    rows = [
        [
            f"{case['file']}::{case['name']}",
            case["outcome"],
            f"{case['time']:.0f}",
            *[f"{split[kind]:.0f}" for kind in ORDER],
        ]
        for case, split in sorted(by_case, key=lambda cs: -cs[0]["time"])[: args.top]
    ]
    table(["test", "outcome", "seconds", *[short.get(k, k) for k in ORDER]], rows, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
