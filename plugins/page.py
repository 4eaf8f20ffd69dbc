"""Render the status overview as one self-contained HTML page (no build step, no external assets).

Each flow (:mod:`~exactly_once_provider.plugins.flows`: source table -> topics -> sinks) is a card: a coloured
badge (green ok, amber behind, red error or reconciliation mismatch, grey nothing committed yet), the figures
at a glance (freshness, lag, throughput, last reconciliation, position), two inline SVG charts (lag and rows/s
over the last sink commits), then its pipelines' cards, folded, one table per section. Every figure carries
``data-flow``/``data-figure`` or ``data-pipeline``, ``data-section`` and ``data-column``, and every chart its
points in ``data-points``, so a browser test (or a curious operator) can find them.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from exactly_once_provider.plugins.flow_card import duration, rate, render_flow
from exactly_once_provider.plugins.flows import Flow, group
from exactly_once_provider.plugins.status import (
    BEHIND,
    EMPTY,
    ERROR,
    MISMATCH,
    OK,
    Overview,
    PipelineStatus,
    Position,
    Section,
)

COLOURS = {
    OK: ("#1f7a3a", "#e6f4ea", "ok"),
    BEHIND: ("#8a5a00", "#fff4d6", "behind"),
    ERROR: ("#b42318", "#fde8e7", "error"),
    EMPTY: ("#555", "#eee", "nothing committed"),
    MISMATCH: ("#b42318", "#fde8e7", "reconciliation mismatch"),
}

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 20px;color:#1d2530;background:#fafbfc}
h1{font-size:20px;margin:0 0 4px} .meta{color:#5b6675;margin-bottom:14px}
.summary{border-collapse:collapse;margin-bottom:18px;background:#fff}
.summary td,.summary th{padding:5px 12px;border-bottom:1px solid #e3e7ec;text-align:left}
.card{background:#fff;border:1px solid #dfe3e8;border-left:6px solid var(--c);border-radius:6px;padding:10px 14px;margin:0 0 16px}
.card h2{font-size:17px;margin:0;display:inline-block} .found{color:#5b6675;font-size:12px;margin-left:8px}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;font-weight:600;font-size:12px;color:var(--c);background:var(--b);margin-left:8px}
h3{font-size:13px;margin:12px 0 4px;color:#33404f;text-transform:uppercase;letter-spacing:.03em}
table.t{border-collapse:collapse;min-width:60%;font-variant-numeric:tabular-nums}
table.t th{background:#f1f3f6;font-weight:600;text-align:left;padding:4px 8px;border-bottom:1px solid #d5dae0;white-space:nowrap}
table.t td{padding:4px 8px;border-bottom:1px solid #eef0f3;vertical-align:top;word-break:break-word}
table.t td.num,table.t th.num,.summary td.num{text-align:right;white-space:nowrap} td.lagbad{color:#8a5a00;font-weight:700} td.lagok{color:#1f7a3a;font-weight:700}
.err{color:#b42318;background:#fde8e7;padding:4px 8px;border-radius:4px;margin:4px 0}
.muted{color:#7a8594;font-size:12px;margin-top:8px} .note{color:#5b6675;font-size:12px}
.flow{background:#fff;border:1px solid #dfe3e8;border-left:6px solid var(--c);border-radius:6px;padding:10px 14px;margin:0 0 16px}
.flow h2{font-size:16px;margin:0;display:inline-block;font-weight:600} .arrow{color:#7a8594;margin:0 6px}
.figs{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0 6px}
.fig{border:1px solid #e3e7ec;border-radius:6px;padding:6px 12px;min-width:120px;background:#fafbfc}
.fig b{display:block;font-size:18px;font-variant-numeric:tabular-nums} .fig span{color:#5b6675;font-size:12px}
.charts{display:flex;flex-wrap:wrap;gap:18px;margin:4px 0} .chart{font-size:12px;color:#5b6675}
.chart svg{display:block;background:#fafbfc;border:1px solid #eef0f3;border-radius:4px}
details.pipes>summary{cursor:pointer;color:#33404f;font-size:13px;margin:8px 0 4px} .card{margin:8px 0}
details.tables>summary{cursor:pointer;color:#33404f;font-size:13px;margin:8px 0 4px} th.sort{cursor:pointer}
"""


# A click on a column head of a per-table table sorts its rows by that column (numbers as numbers; again: reversed).
SORT_SCRIPT = """
document.querySelectorAll('table.sortable th').forEach((th, i) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0], up = th.dataset.up !== '1';
  const key = r => { const t = r.cells[i].textContent.replace(/,/g, ''); return isNaN(t) || t === '' ? t : +t; };
  [...body.rows].sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (up ? 1 : -1))
    .forEach(r => body.appendChild(r));
  th.dataset.up = up ? '1' : '0';
}));
"""


def _cell(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else str(value)


def _position(value: Position) -> str:
    title = f"GTID {value.gtid}" if value.gtid else "no GTID recorded"
    return (
        f'<span class="pos" title="{escape(title)}" data-gtid="{escape(value.gtid or "")}">{escape(value.text)}</span>'
    )


def _section(pipeline: str, section: Section) -> str:
    parts = [f"<h3>{escape(section.title)}</h3>"]
    if section.error:
        parts.append(
            f'<div class="err" data-pipeline="{escape(pipeline)}" data-section="{section.slug}" '
            f'data-error="1">could not read: {escape(section.error)}</div>'
        )
    if section.rows:
        numeric = {
            c
            for c in section.columns
            if all(isinstance(r.get(c), int) and not isinstance(r.get(c), bool) for r in section.rows)
        }
        head = "".join(f"<th{' class=num' if c in numeric else ''}>{escape(c)}</th>" for c in section.columns)
        body = []
        for row in section.rows:
            cells = []
            for column in section.columns:
                value = row.get(column, "")
                classes = ["num"] if isinstance(value, int) and not isinstance(value, bool) else []
                if column == "lag" and isinstance(value, int):
                    classes.append("lagbad" if value else "lagok")
                cls = f' class="{" ".join(classes)}"' if classes else ""
                text = _position(value) if isinstance(value, Position) else escape(_cell(value))
                cells.append(
                    f'<td{cls} data-pipeline="{escape(pipeline)}" data-section="{section.slug}" '
                    f'data-column="{escape(column)}">{text}</td>'
                )
            body.append(f"<tr>{''.join(cells)}</tr>")
        parts.append(
            f'<table class="t" data-section="{section.slug}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>"
        )
    if section.note:
        parts.append(f'<div class="note">{escape(section.note)}</div>')
    return "".join(parts)


def _card(status: PipelineStatus) -> str:
    colour, background, label = COLOURS[status.state]
    name = status.spec.name
    shown = [s for s in status.sections if s.rows or s.error]
    empty = [s.title for s in status.sections if not (s.rows or s.error)]
    found = ", ".join(sorted(status.spec.found_in))
    dags = ", ".join(sorted(status.spec.dag_ids)) or "none"
    html = [
        f'<div class="card" id="pipeline-{escape(name)}" data-pipeline="{escape(name)}" '
        f'data-state="{status.state}" style="--c:{colour};--b:{background}">',
        f'<h2>{escape(name)}</h2><span class="badge">{label}</span>'
        f'<span class="found">found in: {escape(found)} · DAGs: {escape(dags)}</span>',
    ]
    html += [_section(name, s) for s in shown]
    if empty:
        html.append(f'<div class="muted">nothing recorded yet: {escape(" · ".join(empty))}</div>')
    html.append("</div>")
    return "".join(html)


def _summary(flows: list[Flow]) -> str:
    rows = []
    for f in flows:
        colour, background, label = COLOURS[f.state]
        name = escape(f.name)
        rows.append(
            f'<tr><td><a href="#flow-{name}">{name}</a></td>'
            f'<td><span class="badge" style="--c:{colour};--b:{background}">{label}</span></td>'
            f'<td class="num" data-pipeline="{name}" data-section="summary" data-column="lag">'
            f'{"" if f.lag is None else f.lag}</td><td class="num">{duration(f.freshness)}</td>'
            f'<td class="num">{rate(f.throughput)}</td></tr>'
        )
    return (
        '<table class="summary"><thead><tr><th>flow</th><th>state</th><th>total lag</th><th>freshness</th>'
        f"<th>throughput</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def render_page(overview: Overview, only: str | None = None) -> str:
    """
    Return the HTML page for ``overview``.

    :param overview: what was read.
    :param only: show the flow of this pipeline only (the operators' extra link asks for one).
    """
    flows = overview.flows or [Flow(g[0].spec.name, g) for g in group(overview.pipelines)]
    flows = [f for f in flows if only is None or f.has(only)]
    body = [
        f'<h1>Exactly-once pipelines</h1><div class="meta">read live at {escape(overview.read_at)} from '
        f"the offsets ledger, Kafka and the sinks in {overview.seconds:.2f} s · {len(overview.pipelines)} "
        f"pipelines in {len(overview.flows)} flows · reload to refresh</div>"
    ]
    body += [f'<div class="err">{escape(e)}</div>' for e in overview.errors]
    body += [f'<div class="note">{escape(n)}</div>' for n in overview.notes]
    if only is not None and not flows:
        body.append(
            f'<div class="err">No pipeline named {escape(only)!s} was found in the DAGs, the offsets '
            "ledger or the PostgreSQL offsets table.</div>"
        )
    if len(flows) > 1:
        body.append(_summary(flows))
    body += [render_flow(f, COLOURS, _card) for f in flows]
    script = f"<script>{SORT_SCRIPT}</script>" if any(f.tables for f in flows) else ""
    if overview.unresolved:
        items = "".join(f"<li>{escape(u)}</li>" for u in overview.unresolved)
        body.append(f'<div class="muted">Task arguments known only at run time (not shown):<ul>{items}</ul></div>')
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>Exactly-once pipelines</title>'
        f"<style>{STYLE}</style></head><body>{''.join(body)}{script}</body></html>"
    )
