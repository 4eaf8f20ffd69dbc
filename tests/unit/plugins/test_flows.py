"""Flows: a producer and the streams reading its topics on one card; the history from a Delta commit log; the
charts, figures and position as the page shows them."""

from __future__ import annotations

import json
import re

from exactly_once_provider.plugins.discovery import PipelineSpec, SinkSpec
from exactly_once_provider.plugins.flow_card import duration, rate, sparkline
from exactly_once_provider.plugins.flows import Flow, Point, delta_history, group
from exactly_once_provider.plugins.page import render_page
from exactly_once_provider.plugins.status import (
    Overview,
    PipelineStatus,
    Position,
    Section,
    _offset_text,
)
from tests.unit.plugins.test_status import _delta_commit


def _status(name, topics=(), sources=(), sinks=(), sections=(), lag=0):
    spec = PipelineSpec(name, topics=set(topics), sources=set(sources), sinks=set(sinks), found_in={"dag"})
    return PipelineStatus(spec, list(sections), lag)


def test_pipelines_sharing_a_topic_are_one_flow_producer_first():
    capture = _status("shop", topics={"shop.eo.orders"}, sources={"eo.orders"})
    apply = _status("shop-apply", topics={"shop.eo.orders"}, sinks={SinkSpec("delta", "/lake/orders")})
    other = _status("settle", topics={"eo-pay"}, sources={"eo.pay"})
    alone = _status("reconcile-only")
    flows = {tuple(s.spec.name for s in g) for g in group([apply, other, capture, alone])}
    assert flows == {("shop", "shop-apply"), ("settle",), ("reconcile-only",)}
    # A database's tables: each table's reconciliation joins the card of the flow whose topic it checks.
    tables = [_status(f"shop.t{i}") for i in range(3)]
    for i, status in enumerate(tables):
        status.spec.checked_topics = {f"shop.eo.t{i}"}
    capture.spec.topics |= {f"shop.eo.t{i}" for i in range(3)}
    grouped = {tuple(s.spec.name for s in g) for g in group([*tables, apply, capture])}
    assert grouped == {("shop", "shop-apply", "shop.t0", "shop.t1", "shop.t2")}


def test_delta_history_reads_the_pipelines_markers_oldest_first(tmp_path):
    table = tmp_path / "t"
    marker = lambda batch, before, offsets: {
        "eo_stream:p": {  # noqa: E731
            "pipeline": "p",
            "checkpoint_id": "c",
            "batch_id": batch,
            "offsets": offsets,
            "rows_before": before,
        }
    }
    _delta_commit(table, 0, marker(0, 0, {"t": {"0": 10}}), rows=10, timestamp=1_000_000)
    _delta_commit(table, 1, {"eo_stream:other": {"batch_id": 0}}, rows=99, timestamp=1_001_000)
    _delta_commit(table, 2, marker(1, 10, {"t": {"0": 40}}), rows=30, timestamp=1_010_000)
    _delta_commit(table, 3, marker(2, 40, {"t": {"0": 45}}), rows=5, timestamp=1_020_000)
    assert delta_history(str(table), "p") == [
        (1000.0, 10, {"t": {"0": 10}}),
        (1010.0, 40, {"t": {"0": 40}}),
        (1020.0, 45, {"t": {"0": 45}}),
    ]
    assert [h[1] for h in delta_history(str(table), "p", limit=2)] == [40, 45]


def test_binlog_offsets_show_as_file_colon_position_with_the_gtid():
    shown = _offset_text({"format": 1, "file": "binlog.000001", "pos": 18146205, "gtid": "0-1-77", "tables": []})
    assert shown == Position("binlog.000001:18146205", "0-1-77") and str(shown) == "binlog.000001:18146205"
    ledger = Section("ledger", "Committed", ("offset",), rows=[{"offset": shown}])
    html = render_page(Overview([_status("shop", sections=[ledger])], [], [], [], "now"))
    assert '<span class="pos" title="GTID 0-1-77" data-gtid="0-1-77">binlog.000001:18146205</span>' in html
    assert "{" not in re.sub(r"<style>.*</style>", "", html, flags=re.S)  # no JSON on the page


def test_flow_card_shows_the_figures_and_both_charts():
    capture = _status("shop", topics={"shop.eo.orders"}, sources={"eo.orders"})
    apply = _status("shop-apply", topics={"shop.eo.orders"}, sinks={SinkSpec("delta", "/lake/orders")}, lag=12)
    flow = Flow(
        "shop",
        [capture, apply],
        sources=["eo.orders"],
        topics=["shop.eo.orders"],
        sinks=["delta /lake/orders"],
        lag=12,
        freshness=42.0,
        throughput=150.0,
        reconciliation={"result": "clean", "finished at": "2026-11-25T10:00:00+00:00"},
        position=Position("binlog.000001:18146205", "0-1-77"),
        history=[Point(1000, 10, 0), Point(1010, 40, 5, 3.0), Point(1020, 45, 12, 0.5)],
    )
    html = render_page(Overview([capture, apply], [], [], [], "now", [flow], 0.5), only="shop-apply")
    assert html.count('<div class="flow"') == 1 and 'data-state="behind"' in html
    assert "eo.orders" in html and "shop.eo.orders" in html and "delta /lake/orders" in html
    figures = dict(re.findall(r'data-figure="(\w+)"[^>]*><b>([^<]*)</b>', html))
    assert figures == {
        "freshness": "42 s",
        "lag": "12",
        "throughput": "150 rows/s",
        "reconciliation": "clean",
        "dead_letters": "—",  # no store holds letters of the flow
        "position": "binlog.000001:18146205",
    }
    assert 'data-figure="position" title="GTID 0-1-77"' in html
    charts = dict(re.findall(r'data-chart="(\w+)" data-points="([^"]*)"', html))
    assert json.loads(charts["lag"].replace("&quot;", '"')) == [[1000, 0], [1010, 5], [1020, 12]]
    assert json.loads(charts["rows_per_second"].replace("&quot;", '"')) == [[1010, 3.0], [1020, 0.5]]
    assert html.count("<svg") == 2 and html.count("<polyline") == 2
    assert html.count('<div class="card"') == 2  # both pipelines' details, folded inside the flow


def test_a_chart_needs_two_commits_and_units_read_well():
    assert "no chart yet" in sparkline("f", "lag", [1.0], [3], "lag") and "<svg" not in sparkline(
        "f", "lag", [1.0], [3], "lag"
    )
    assert (duration(None), duration(0), duration(75), duration(600), duration(7200)) == (
        "—",
        "0 s",
        "75 s",
        "10 min",
        "2.0 h",
    )
    assert (rate(None), rate(2.345), rate(12345.6)) == ("—", "2.3 rows/s", "12,346 rows/s")


def test_a_producer_in_a_flow_points_at_the_streams_for_its_lag():
    from exactly_once_provider.plugins.flows import build

    lag = Section("lag", "Kafka end offsets and consumer lag", ("topic",), note="No streaming job: lag is not known.")
    capture = _status("shop", topics={"shop.eo.orders"}, sources={"eo.orders"}, sections=[lag])
    apply = _status("shop-apply", topics={"shop.eo.orders"}, sinks={SinkSpec("postgres", "orders")})
    [flow] = build([capture, apply], consumer_for=None)
    assert lag.note == "The lag of this flow is measured at the sinks of shop-apply."
    assert flow.notes == ["postgres sink orders: keeps its newest commit only, no history"]
    assert (flow.freshness, flow.lag, flow.history) == (0.0, 0, [])
    iceberg = _status("shop-lake", topics={"shop.eo.orders"}, sinks={SinkSpec("iceberg", "lake.orders")})
    [flow] = build([capture, iceberg], consumer_for=None)
    assert flow.notes == ["iceberg sink lake.orders: its commit history is not charted yet"]  # it has one


def test_a_flow_of_several_tables_shows_one_sortable_row_per_table():
    from exactly_once_provider.plugins.flows import table_rows

    tables = ("eo.orders", "eo.lines", "eo.users")
    capture = _status("shop", topics={f"shop.{t}" for t in tables}, sources=set(tables))
    sink_rows = [
        {"sink": "delta", "location": f"/lake/{t}", "commit": f"version {i}", "rows in sink": 10 * (i + 1)}
        | {"next offsets": {f"shop.{t}": {"0": 5}}}
        for i, t in enumerate(tables[:2])  # users: no commit yet
    ]
    lag = [{"topic": f"shop.{t}", "partition": 0, "lag": n} for t, n in zip(tables, (0, 7, 3), strict=True)]
    apply = _status(
        "shop-apply",
        topics={f"shop.{t}" for t in tables},
        sinks={SinkSpec("delta", f"/lake/{t}") for t in tables},
        sections=[Section("sink", "Last sink commit", (), rows=sink_rows), Section("lag", "lag", (), rows=lag)],
    )
    reconciled = []
    for t, result in (("eo.orders", "clean"), ("eo.lines", "mismatch")):
        status = _status(f"shop.{t.split('.')[1]}", sections=[Section("reconciliation", "r", (), rows=[])])
        status.sections[0].rows.append({"result": result, "finished at": "2026-11-28T10:00:00+00:00"})
        status.spec.checked_topics = {f"shop.{t}"}
        reconciled.append(status)
    rows = {r["table"]: r for r in table_rows([capture, apply, *reconciled])}
    assert rows["eo.orders"] == {
        "table": "eo.orders",
        "rows in sink": 10,
        "lag": 0,
        "freshness (s)": 0,  # no lag: fresh; a lagging table's is filled in from Kafka by build()
        "last commit": "version 0",
        "last reconciliation": "clean",
        "reconciled at": "2026-11-28T10:00:00+00:00",
    }
    assert (rows["eo.lines"]["lag"], rows["eo.lines"]["last reconciliation"]) == (7, "mismatch")
    assert (rows["eo.users"]["rows in sink"], rows["eo.users"]["lag"], rows["eo.users"]["freshness (s)"]) == (
        None,
        3,
        None,
    )
    assert table_rows([capture]) and not table_rows([_status("one", sources={"eo.orders"})])  # one table: none
    flow = Flow("shop", [capture, apply, *reconciled], tables=list(rows.values()))
    html = render_page(Overview([capture, apply, *reconciled], [], [], [], "now", [flow], 0.5))
    assert html.count('<tr data-table="') == 3 and "3 tables" in html and "table.sortable" in html
    assert '<td class="num lagbad" data-column="lag">7</td>' in html


def test_a_flows_open_dead_letters_add_up_over_its_stores_and_the_newest_error_is_on_the_card():
    from exactly_once_provider.plugins.flows import build

    def sections(count: int, at: str, error: str) -> list[Section]:
        counts = Section("dead_letters", "Dead letters (open)", ("sink", "store", "open letters", "newest at"))
        counts.rows = [{"sink": "postgres", "store": "s", "open letters": count, "newest at": at}]
        errors = Section("dead_letter_errors", "Newest dead letters", ("store", "record", "error class"))
        errors.rows = [{"store": "s", "record": "t/0@7", "error class": error, "dead-lettered at": at}]
        return [counts, errors]

    capture = _status("shop", topics={"shop.eo.orders"}, sources={"eo.orders"})
    delta = _status("shop-apply", topics={"shop.eo.orders"}, sinks={SinkSpec("delta", "/lake/orders")})
    delta.sections = sections(2, "2026-11-29T00:01:00+00:00", "invalid_utf8")
    pg = _status("shop-apply-postgres", topics={"shop.eo.orders"}, sinks={SinkSpec("postgres", "orders")})
    pg.sections = sections(3, "2026-11-29T00:02:00+00:00", "nul_character")
    [flow] = build([capture, delta, pg], consumer_for=None)
    assert (flow.dead_letters, flow.newest_letter["error class"]) == (5, "nul_character")
    html = render_page(Overview([capture, delta, pg], [], [], [], "now", [flow], 0.5))
    assert re.search(r'data-figure="dead_letters" title="newest: nul_character at t/0@7, [^"]+"><b>5</b>', html)


def test_a_lagging_table_of_a_database_gets_its_own_freshness(monkeypatch):
    import time

    from exactly_once_provider.plugins import flows

    tables = ("eo.orders", "eo.lines")
    capture = _status("shop", topics={f"shop.{t}" for t in tables}, sources=set(tables))
    lag = [
        {"topic": "shop.eo.orders", "partition": 0, "end offset": 5, "sink next offset": 5, "lag": 0},
        {"topic": "shop.eo.lines", "partition": 0, "end offset": 9, "sink next offset": 2, "lag": 7},
    ]
    apply = _status(
        "shop-apply",
        topics={f"shop.{t}" for t in tables},
        sinks={SinkSpec("postgres", "orders")},
        sections=[Section("lag", "lag", (), rows=lag)],
        lag=7,
    )
    asked = []

    def unapplied_since(consumer, lagging, wait=2.0):
        asked.extend(lagging)
        return {("shop.eo.lines", 0): time.time() - 42}  # the first unapplied record's source commit

    monkeypatch.setattr(flows, "unapplied_since", unapplied_since)
    [flow] = flows.build([capture, apply], consumer_for=lambda conn_id: object())
    shown = {r["table"]: r["freshness (s)"] for r in flow.tables}
    assert asked == [("shop.eo.lines", 0, 2)] and shown["eo.orders"] == 0 and 41 <= shown["eo.lines"] <= 43
    assert 41 <= flow.freshness <= 43  # the flow's: its stalest table's
