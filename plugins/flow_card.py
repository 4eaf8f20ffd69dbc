"""Render one flow (:class:`~exactly_once_provider.plugins.flows.Flow`) as a card: the path, the figures at a
glance, two inline SVG charts, then its pipelines' cards (folded)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from html import escape

from exactly_once_provider.plugins.flows import Flow

WIDTH, HEIGHT, PAD = 280, 64, 4


def duration(seconds: float | None) -> str:
    """Return ``seconds`` as ``0 s``, ``42 s``, ``7 min``, ``3.5 h`` (``—`` when unknown)."""
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def rate(value: float | None) -> str:
    """Return rows per second with a sensible precision (``—`` when unknown)."""
    if value is None:
        return "—"
    return f"{value:,.0f} rows/s" if value >= 100 else f"{value:.1f} rows/s"


def sparkline(flow: str, chart: str, times: list[float], values: list[float | None], label: str) -> str:
    """Return an inline SVG line chart of ``values`` over ``times`` (epoch seconds), its points in
    ``data-points`` and its newest value in the caption.

    :param flow: the flow's name (``data-flow``).
    :param chart: ``lag`` or ``rows_per_second`` (``data-chart``).
    :param times: the commits' times, oldest first.
    :param values: one value per commit (None: unknown, left out).
    :param label: the caption.
    """
    known = [(t, v) for t, v in zip(times, values) if v is not None]
    data = escape(json.dumps([[round(t, 3), v] for t, v in known]))
    head = f'<div class="chart" data-flow="{escape(flow)}" data-chart="{chart}" data-points="{data}">{escape(label)}'
    if len(known) < 2:
        return f'{head}<div class="note">{len(known)} commit{"s" * (len(known) != 1)}: no chart yet</div></div>'
    t0, t1 = known[0][0], known[-1][0]
    top = max(v for _, v in known) or 1
    x = lambda t: PAD + (WIDTH - 2 * PAD) * ((t - t0) / (t1 - t0) if t1 > t0 else 1)
    y = lambda v: HEIGHT - PAD - (HEIGHT - 2 * PAD) * v / top
    points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in known)
    last_t, last_v = known[-1]
    since = datetime.fromtimestamp(t0, UTC).strftime("%H:%M:%S")
    shown = "{:,.0f}" if all(float(v).is_integer() for _, v in known) else "{:,.1f}"
    return (
        f"{head}: newest {shown.format(last_v)}, max {shown.format(top)} · {len(known)} commits since {since} UTC"
        f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}"><polyline fill="none" stroke="#2f6fb3" stroke-width="1.6" '
        f'points="{points}"/><circle cx="{x(last_t):.1f}" cy="{y(last_v):.1f}" r="2.6" fill="#2f6fb3"/></svg></div>'
    )


def _figure(flow: str, figure: str, value: str, label: str, title: str = "") -> str:
    hover = f' title="{escape(title)}"' if title else ""
    return (
        f'<div class="fig" data-flow="{escape(flow)}" data-figure="{figure}"{hover}><b>{value}</b>'
        f"<span>{escape(label)}</span></div>"
    )


def _tables(flow: Flow) -> str:
    """Return the flow's per-table table (a database: one row per table), sortable by any column."""
    from exactly_once_provider.plugins.flows import TABLE_COLUMNS

    head = "".join(f'<th class="sort" title="sort by {escape(c)}">{escape(c)}</th>' for c in TABLE_COLUMNS)
    body = []
    for row in flow.tables:
        cells = []
        for column in TABLE_COLUMNS:
            value = row.get(column)
            classes = "num" if isinstance(value, int) else ""
            if column == "lag" and isinstance(value, int):
                classes += " lagbad" if value else " lagok"
            if column == "last reconciliation" and value == "mismatch":
                classes += " lagbad"
            cells.append(
                f'<td class="{classes.strip()}" data-column="{escape(column)}">'
                f"{'—' if value is None else escape(f'{value:,}' if isinstance(value, int) else str(value))}</td>"
            )
        body.append(f'<tr data-table="{escape(row["table"])}">{"".join(cells)}</tr>')
    return (
        f'<details class="tables" open><summary>{len(flow.tables)} tables</summary>'
        f'<table class="t sortable" data-flow="{escape(flow.name)}" data-section="tables"><thead><tr>{head}</tr>'
        f"</thead><tbody>{''.join(body)}</tbody></table></details>"
    )


def render_flow(flow: Flow, colours: dict, pipeline_card: Callable) -> str:
    """Return the card of ``flow``.

    :param flow: the flow.
    :param colours: ``state -> (colour, background, label)``.
    :param pipeline_card: renders one member pipeline's card.
    """
    colour, background, label = colours[flow.state]
    arrow = '<span class="arrow">→</span>'
    path = arrow.join(escape(", ".join(part)) for part in (flow.sources, flow.topics, flow.sinks) if part)
    recon = flow.reconciliation
    position = flow.position
    figures = [
        _figure(
            flow.name,
            "freshness",
            duration(flow.freshness),
            "freshness (since the source commit of the oldest unapplied change)",
        ),
        _figure(flow.name, "lag", "—" if flow.lag is None else f"{flow.lag:,}", "lag (records)"),
        _figure(flow.name, "throughput", rate(flow.throughput), "throughput (sink commits)"),
        _figure(
            flow.name,
            "reconciliation",
            escape(recon["result"]) if recon else "—",
            f"last reconciliation {recon['finished at']}" if recon else "no reconciliation",
        ),
        _figure(
            flow.name,
            "dead_letters",
            "—" if flow.dead_letters is None else f"{flow.dead_letters:,}",
            "open dead letters",
            (
                f"newest: {flow.newest_letter['error class']} at {flow.newest_letter['record']}, "
                f"{flow.newest_letter['dead-lettered at']}"
                if flow.newest_letter
                else ""
            ),
        ),
        _figure(
            flow.name,
            "position",
            escape(position.text) if position else "—",
            "committed position",
            f"GTID {position.gtid}" if position and position.gtid else "",
        ),
    ]
    times = [p.at for p in flow.history]
    charts = sparkline(
        flow.name, "lag", times, [p.lag for p in flow.history], "lag at each sink commit (records)"
    ) + sparkline(
        flow.name, "rows_per_second", times, [p.rows_per_second for p in flow.history], "rows/s between sink commits"
    )
    members = ", ".join(m.spec.name for m in flow.members)
    tables = _tables(flow) if flow.tables else ""
    notes = "".join(f'<div class="note">{escape(n)}</div>' for n in flow.notes)
    return (
        f'<div class="flow" id="flow-{escape(flow.name)}" data-flow="{escape(flow.name)}" '
        f'data-state="{flow.state}" style="--c:{colour};--b:{background}"><h2>{path or escape(flow.name)}</h2>'
        f'<span class="badge">{label}</span><span class="found">pipelines: {escape(members)}</span>'
        f'<div class="figs">{"".join(figures)}</div><div class="charts">{charts}</div>{notes}{tables}'
        f'<details class="pipes"><summary>pipelines, offsets, sink commits</summary>'
        f"{''.join(pipeline_card(m) for m in flow.members)}</details></div>"
    )
