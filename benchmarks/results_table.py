"""Render a bench_history JSON result as the Markdown table of docs/benchmarks.md (rewritten in place).

Usage: python benchmarks/results_table.py [RESULT.json]   (default: the newest benchmarks/results/history-*.json)
The table goes between ``<!-- bench-history:begin -->`` and ``<!-- bench-history:end -->`` in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench-history:begin -->", "<!-- bench-history:end -->"


def table(result: dict) -> str:
    """Return the Markdown for one result: medians in ms per size, and the largest / smallest size ratio."""
    lines = [f"Commit `{result['commit']}`{' (uncommitted changes)' if result.get('dirty') else ''}, "
             f"started {result['started']}, nproc {result['nproc']}, load average before "
             f"{'/'.join(f'{x:.1f}' for x in result['loadavg_before'])}, after "
             f"{'/'.join(f'{x:.1f}' for x in result['loadavg_after'])}; median of {result['repeats']} "
             "interleaved runs (files: 5x as many), ms.", ""]
    for kind, unit in (("ledger", "records of other pipelines' history"), ("files", "published manifests")):
        sizes = list(result[kind])
        if not sizes:
            continue
        lines.append(f"| {kind}: what \\ {unit} | " + " | ".join(f"{int(s):,}" for s in sizes)
                     + f" | {int(sizes[-1]):,} / {int(sizes[0]):,} |")
        lines.append("|---" * (len(sizes) + 2) + "|")
        for name in result[kind][sizes[0]]:
            medians = [result[kind][s][name]["median_s"] * 1000 for s in sizes]
            lines.append(f"| {name} | " + " | ".join(f"{m:,.1f}" for m in medians)
                         + f" | **{medians[-1] / medians[0]:.2f}** |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    paths = [Path(a) for a in sys.argv[1:]] or sorted((REPO / "benchmarks" / "results").glob("history-*.json"),
                                                      key=lambda p: p.stat().st_mtime)[-1:]
    if not paths:
        raise SystemExit("No benchmarks/results/history-*.json: run make bench-history first.")
    page = REPO / "docs" / "benchmarks.md"
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{page} has no {BEGIN} ... {END} region.")
    head, rest = text.split(BEGIN, 1)
    body = table(json.loads(paths[0].read_text()))
    page.write_text(f"{head}{BEGIN}\n<!-- from {paths[0].relative_to(REPO)} -->\n{body}\n{END}{rest.split(END, 1)[1]}")
    print(body)


if __name__ == "__main__":
    main()
