"""Draw a benchmark result as docs/images/bench-<kind>.png (matplotlib), named by its commit; used by results_table.py."""

from __future__ import annotations

from pathlib import Path

IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"


def bars(result: dict) -> tuple[list[str], list[float], str] | None:
    """Return (labels, values, axis label) to draw for a result, or None when it has nothing to draw."""
    if "plot" in result:  # a table written through _support.report: one numeric column of it
        column = result["plot"]["column"]
        rows = [row for row in result["table"]["rows"] if isinstance(row[column], (int, float))]
        return [str(row[0]) for row in rows], [float(row[column]) for row in rows], result["plot"]["label"]
    kind = result.get("benchmark", "history")
    if kind == "capture":
        sizes = result.get("by_size") or [result]
        return (
            [f"{size['changes']:,} changes: {label}" for size in sizes for label in size["runs"]],
            [r["median_wall"] for size in sizes for r in size["runs"].values()],
            "rows/s, wall (median)",
        )
    if kind == "freshness":
        return (
            ["p50", "p90", "p99", "max"],
            [result[f"{q}_s"] for q in ("p50", "p90", "p99", "max")],
            "source commit -> visible, seconds",
        )
    if kind == "freshness_tables":
        return (
            [f"{r['queries']} query, {r['busy_tables']} of {r['tables']} tables changing" for r in result["runs"]],
            [r["p99_s"] for r in result["runs"]],
            "p99 source commit -> visible, seconds",
        )
    if kind == "freshness_dag":
        return (
            [f"{r['tables']} table(s), {r['rate']:,.0f} changes/s" for r in result["runs"]],
            [r["p99_s"] for r in result["runs"]],
            "p99 source commit -> visible under Airflow, seconds",
        )
    if kind == "increment":
        return (
            [f"{row['rows']:,} rows, {row['kind']} reconciliation" for row in result["summary"]],
            [row["wall_s"] for row in result["summary"]],
            "one increment, wall seconds (median)",
        )
    if kind == "wholedb":
        return (
            [f"{r['side']}: {r['tables']} table(s), {r['rows']:,} rows" for r in result["runs"]],
            [r["run_s"] for r in result["runs"]],
            "first run of the template under Airflow, seconds",
        )
    if kind == "history":  # per candidate: its median at the largest history over the smallest (flat = 1)
        labels, values = [], []
        for part in ("ledger", "files", "delta (local)", "delta (minio)", "postgres"):
            sizes = list(result.get(part, {}))
            for name in result[part][sizes[0]] if sizes else ():
                labels.append(f"{part}: {name}")
                values.append(result[part][sizes[-1]][name]["median_s"] / result[part][sizes[0]][name]["median_s"])
        return labels, values, "median at the largest history / at the smallest"
    return None


def draw(kind: str, result: dict) -> Path | None:
    """Write the plot of ``result`` and return its path (None if the result has nothing to plot)."""
    drawn = bars(result)
    if drawn is None:
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display: make bench runs headless
    import matplotlib.pyplot as plt

    labels, values, axis = drawn
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(labels) + 1.4))
    ax.barh(range(len(labels)), values, color="#4c72b0")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()  # the table's order, top to bottom
    for y, value in enumerate(values):
        ax.text(value, y, f" {value:,.0f}" if value >= 10 else f" {value:.3f}", va="center", fontsize=7)
    ax.margins(x=0.15)  # room for the value printed after the longest bar
    if min(values) > 0 and max(values) / min(values) > 100:
        ax.set_xscale("log")  # e.g. history: flat reads at ~1 beside old scans at 1,000x
    ax.set_xlabel(axis)
    ax.set_title(
        f"bench-{kind}: commit {result['commit']}{' (dirty)' if result.get('dirty') else ''}, "
        f"{result['started']}, {result.get('repeats', '?')} repeat(s), nproc {result['nproc']}, load {result['loadavg_before'][0]:.1f}"
        f" -> {result['loadavg_after'][0]:.1f}",
        fontsize=8,
    )
    fig.tight_layout()
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / f"bench-{kind}.png"
    # No timestamp in the PNG: an unchanged result redraws the same bytes.
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path
