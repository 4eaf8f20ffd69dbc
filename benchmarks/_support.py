"""What the source benchmarks share: arguments, the local stack, the source connection, timing, the table.

A benchmark script runs as ``python benchmarks/bench_x.py``, so this directory is first on ``sys.path`` and
``import _support`` finds this module; importing it puts the repository root on ``sys.path`` too (for
``tests.conftest``, the one loader of docker/local/stack.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args(
    doc: str, rows: int = 100_000, repeats: int = 3, extra: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    """
    Parse ``--rows`` and ``--repeats`` (plus what ``extra`` adds); the description is the docstring's first line.

    :param doc: the benchmark module's docstring.
    :param rows: the default of ``--rows``.
    :param repeats: the default of ``--repeats``.
    :param extra: adds more arguments to the parser.
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--repeats", type=int, default=repeats)
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    if args.rows <= 0 or args.repeats <= 0:
        parser.error("--rows and --repeats must be positive")
    return args


def start_stack(only: Sequence[str] | None = None) -> Any:
    """Bring the local stack (or the ``only`` services) up, export its Airflow connections, return the stack module."""
    logging.basicConfig(level=logging.WARNING)
    from tests.conftest import STACK as stack  # the one loader of docker/local/stack.py

    stack.up(**({"only": tuple(only)} if only else {}))
    os.environ.update(stack.connection_env())
    return stack


RESULTS = REPO / "benchmarks" / "results"


def result_header(benchmark: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Return the start of a result: the benchmark, commit (and whether the tree differs), nproc, load, settings."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    # The code measured, not the results an earlier benchmark of the same `make bench` just wrote.
    dirty = bool(
        subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--",
                "provider",
                "hooks",
                "operators",
                "benchmarks",
                ":(exclude)benchmarks/results",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
        ).stdout.strip()
    )
    return {
        "benchmark": benchmark,
        "commit": commit,
        "dirty": dirty,
        "nproc": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **settings,
    }


def write_result(result: dict[str, Any]) -> Path:
    """Add the load average after the run and write ``benchmarks/results/<benchmark>-<commit>-<time>.json``."""
    result["loadavg_after"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{result['benchmark']}-{result['commit']}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def connect_source(stack: Any) -> Any:
    """Return an autocommit MySQLdb connection to the stack's MariaDB (UTC session, utf8mb4)."""
    from tests.mysql_support import connect

    return connect(stack)


def delete_topics(stack: Any, topics: Sequence[str]) -> None:
    """Delete the throwaway topics a benchmark wrote (the broker frees their files a minute later)."""
    if not topics:
        return
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"})
    for future in admin.delete_topics(sorted(set(topics)), operation_timeout=30).values():
        future.result(60)


@dataclass
class Runs:
    """The rates one candidate reached, run by run: wall clock and the CPU time of this process."""

    label: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def measure(self, work: Callable[[], int]) -> int:
        """Run ``work`` (it returns the rows it handled) and record its rows/s; return the rows."""
        wall, cpu = time.perf_counter(), time.process_time()
        rows = work()
        self.add(rows, time.perf_counter() - wall, time.process_time() - cpu)
        return rows

    def add(self, rows: int, wall_seconds: float, cpu_seconds: float) -> None:
        """Record one run that handled ``rows`` in the given wall and CPU seconds."""
        self.wall.append(rows / wall_seconds)
        self.cpu.append(rows / cpu_seconds if cpu_seconds > 0 else float("inf"))

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


def runs_text(values: Sequence[float]) -> str:
    """Return every run's figure, e.g. ``"19,730 / 19,965 / 18,273"``."""
    return " / ".join(f"{v:,.0f}" for v in values)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """
    Print a titled table: the first column left-aligned, the others right-aligned.

    Floats print with thousands separators (``1,234``) unless below 10 (ratios: ``0.812``).

    :param title: the line above the table.
    :param headers: the column names.
    :param rows: the cells, one sequence per row.
    """

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 10 else f"{value:,.0f}"
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = " | ".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(headers, widths)))
    print()
    print(title)
    print(line)
    print("-" * len(line))
    for row in cells:
        print(" | ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(row, widths))))


def report(
    result: dict[str, Any],
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    plot: dict[str, Any] | None = None,
) -> Path:
    """
    Print the table, keep it in the result (``results_table.py`` renders it into docs/benchmarks.md) and write it.

    :param result: the result started by :func:`result_header`.
    :param title: the line above the table.
    :param headers: the column names.
    :param rows: the cells (numbers stay numbers in the JSON).
    :param plot: what ``results_table.py`` draws: ``{"column": i, "label": "msgs/s"}`` plots column ``i`` of
        every row whose cell there is a number, as horizontal bars.
    """
    print_table(title, headers, rows)
    result["table"] = {"title": title, "headers": list(headers), "rows": [list(row) for row in rows]}
    if plot is not None:
        result["plot"] = plot
    path = write_result(result)
    print(f"\nJSON: {path}")
    return path
