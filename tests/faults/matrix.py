"""The full fault matrix: every tests/faults scenario, matrix variants included, N times; prints one table.

Usage (``make faults-matrix RUNS=3``)::

    python tests/faults/matrix.py [--runs N] [--report FILE] [-- extra pytest args, e.g. -k zombie]

Each run is a pytest session over tests/faults (``-m "not soak"``: the ``matrix`` variants are included), split like
``make test``: the scenarios that share the stack on ``--workers`` xdist workers, then the ``exclusive`` ones alone.
Every fault test reports what its oracle counted through the ``fault_outcome`` fixture into the JSON-lines
file named by ``EO_FAULT_REPORT``; pass/fail comes from pytest's JUnit XML. The table has one line per
scenario: runs, rows checked per run, lost and duplicated summed over the runs, passes, mean seconds.
The exit status is non-zero if any run of any scenario failed or counted a lost or duplicated row.

The outcome is also written as ``benchmarks/results/matrix-<commit>-<time>.json`` (commit, machine, load, every
scenario's figures); ``python benchmarks/results_table.py`` renders the newest one into docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks._support import result_header, write_result  # noqa: E402
from benchmarks.results_table import matrix_table  # noqa: E402

NO_TESTS_COLLECTED = 5  # pytest's exit code when the selection is empty


@dataclass
class Scenario:
    """What the runs of one test (one parametrisation) produced."""

    runs: int = 0
    passed: int = 0
    seconds: float = 0.0
    rows: list[int] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0
    reported: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.passed == self.runs and self.reported == self.runs and self.lost == self.duplicated == 0


def junit_results(path: Path) -> list[tuple[str, str, float, str | None]]:
    """Return (nodeid, name, seconds, failure message or None) for every test case of a JUnit XML file."""
    results = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        if not case.get("name") or not case.get("classname"):
            continue  # an interrupted session's placeholder entry
        module = case.get("classname", "").replace(".", "/")
        nodeid = f"{module}.py::{case.get('name')}"
        problem = next((case.find(tag) for tag in ("failure", "error", "skipped") if case.find(tag) is not None), None)
        message = None if problem is None else f"{problem.tag}: {(problem.get('message') or '')[:200]}"
        results.append((nodeid, case.get("name"), float(case.get("time") or 0), message))
    return results


def run_once(
    index: int, report: Path, pytest_args: list[str], workers: int
) -> list[tuple[str, str, float, str | None]]:
    """Run the fault suite once, as ``make test`` does; return its JUnit results.

    With more than one worker the run has two parts: the scenarios that kill only their own processes on
    ``workers`` pytest-xdist workers, then the ``exclusive`` ones (they kill or restart a shared service) alone.
    """
    parts = (
        [("all", "not soak", [])]
        if workers < 2
        else [
            ("parallel", "not soak and not exclusive", ["-n", str(workers), "--dist", "loadgroup"]),
            ("exclusive", "not soak and exclusive", []),
        ]
    )
    env = {**os.environ, "EO_FAULT_REPORT": str(report), "EO_FAULT_RUN": str(index)}
    results = []
    for part, markers, part_args in parts:
        junit = report.with_name(f"{report.stem}-run{index}-{part}.xml")
        command = [
            sys.executable,
            "-m",
            "pytest",
            "tests/faults",
            "-m",
            markers,
            "-p",
            "no:cacheprovider",
            "-q",
            *part_args,
            f"--junitxml={junit}",
            *pytest_args,
        ]
        started = time.monotonic()
        print(f"[faults-matrix] run {index} ({part}): {' '.join(command[2:])}", flush=True)
        completed = subprocess.run(command, cwd=REPO, env=env)
        print(
            f"[faults-matrix] run {index} ({part}) ended with exit code {completed.returncode} after "
            f"{time.monotonic() - started:.0f}s",
            flush=True,
        )
        if completed.returncode == NO_TESTS_COLLECTED:
            continue  # e.g. -k selected only exclusive scenarios: this part had nothing to run
        if not junit.exists():
            raise SystemExit(f"pytest wrote no {junit}: the run could not start (exit code {completed.returncode})")
        results += junit_results(junit)
    return results


def earlier_runs(report: Path) -> list[list[tuple[str, str, float, str | None]]]:
    """Return the JUnit results of an earlier matrix run's files next to ``report``, one list per run."""
    runs: dict[int, list] = defaultdict(list)
    for xml in report.parent.glob(f"{report.stem}-run*.xml"):
        index = int(re.match(r"-run(\d+)", xml.stem.removeprefix(report.stem)).group(1))
        runs[index] += junit_results(xml)
    return [runs[index] for index in sorted(runs)]


def collect(results_per_run: list[list[tuple[str, str, float, str | None]]], report: Path) -> dict[str, Scenario]:
    """Join the pytest results with the oracle lines of the report file."""
    scenarios: dict[str, Scenario] = defaultdict(Scenario)
    names: dict[str, str] = {}
    for results in results_per_run:
        for nodeid, name, seconds, failure in results:
            scenario = scenarios[nodeid]
            names[name] = nodeid
            scenario.runs += 1
            scenario.seconds += seconds
            if failure is None:
                scenario.passed += 1
            else:
                scenario.failures.append(failure)
    lines = report.read_text().splitlines() if report.exists() else []
    for line in lines:
        outcome = json.loads(line)
        nodeid = outcome.get("nodeid") or names.get(outcome["scenario"], outcome["scenario"])
        scenario = scenarios[nodeid]
        scenario.reported += 1
        scenario.rows.append(int(outcome["rows"]))
        scenario.lost += int(outcome["lost"])
        scenario.duplicated += int(outcome["duplicated"])
    return dict(scenarios)


def result(scenarios: dict[str, Scenario], runs: int, pytest_args: list[str], header: dict) -> dict:
    """Return the JSON result of a matrix run: every scenario's runs, passes, rows, lost, duplicated, mean seconds."""
    return {
        **header,
        "runs": runs,
        "pytest_args": pytest_args,
        "scenarios": {
            nodeid.removeprefix("tests/faults/"): {
                "runs": s.runs,
                "passed": s.passed,
                "reported": s.reported,
                "rows": s.rows,
                "lost": s.lost,
                "duplicated": s.duplicated,
                "ok": s.ok,
                "mean_s": round(s.seconds / max(s.runs, 1), 1),
                "failures": s.failures[:3],
            }
            for nodeid, s in sorted(scenarios.items())
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=int(os.environ.get("RUNS") or 3))
    parser.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("TEST_WORKERS") or 2),
        help="pytest-xdist workers for the scenarios that share the stack (1: one session per run)",
    )
    parser.add_argument("--report", type=Path, help="the JSON-lines outcome file (default: a new temp file)")
    parser.add_argument(
        "--table-only",
        action="store_true",
        help="print the table of an earlier run from --report and its -run<N>.xml files",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.table_only and not args.report:
        parser.error("--table-only needs --report")
    report = args.report or Path(tempfile.mkdtemp(prefix="eo-faults-matrix-")) / "outcomes.jsonl"
    started = time.monotonic()
    header = result_header("matrix", {})
    if args.table_only:
        results = earlier_runs(report)
    else:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.unlink(missing_ok=True)
        results = [run_once(index, report, args.pytest_args, args.workers) for index in range(1, args.runs + 1)]
    scenarios = collect(results, report)
    print(
        f"\nFault matrix: {len(results)} run(s), {len(scenarios)} scenarios, "
        f"{(time.monotonic() - started) / 60:.1f} min; outcomes in {report}\n"
    )
    outcome = {
        **result(scenarios, len(results), args.pytest_args, header),
        "minutes": round((time.monotonic() - started) / 60, 1),
        "loadavg_after": os.getloadavg(),
    }
    print(matrix_table(outcome))
    if not args.table_only:
        path = write_result(outcome)
        print(
            f"\nresult: {path.relative_to(REPO)} (python benchmarks/results_table.py puts it into docs/reliability.md)"
        )
    failed = {nodeid: s for nodeid, s in scenarios.items() if not s.ok}
    for nodeid, s in sorted(failed.items()):
        print(f"\n{nodeid}: " + "; ".join(s.failures[:3] or ["no fault_outcome line / lost or duplicated rows"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
