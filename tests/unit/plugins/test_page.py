"""The HTML page: one card per pipeline, figures findable by data attributes, errors visible, text escaped."""

from __future__ import annotations

import re

from exactly_once_provider.plugins.discovery import PipelineSpec
from exactly_once_provider.plugins.page import render_page
from exactly_once_provider.plugins.status import Overview, PipelineStatus, Section


def _overview():
    lag = Section(
        "lag",
        "Kafka end offsets and consumer lag",
        ("topic", "partition", "end offset", "lag"),
        rows=[{"topic": "t", "partition": 0, "end offset": 90, "lag": 12}],
    )
    broken = Section("sink", "Last sink commit", ("sink",), error="OperationalError: <no route>")
    return Overview(
        pipelines=[
            PipelineStatus(PipelineSpec("orders", found_in={"dag"}), [lag], lag=12),
            PipelineStatus(PipelineSpec("pay<x>", found_in={"ledger"}), [broken], lag=0),
        ],
        unresolved=["d.t: '{{ ds }}' is known only when a run renders it"],
        errors=["ledger down"],
        notes=[],
        read_at="2026-11-21T00:00:00+00:00",
    )


def test_each_pipeline_is_a_card_with_state_and_figures():
    html = render_page(_overview())

    assert re.search(r'<div class="card" id="pipeline-orders" data-pipeline="orders" data-state="behind"', html)
    assert 'data-state="error"' in html
    assert re.search(r'data-pipeline="orders" data-section="lag" data-column="lag">12</td>', html)
    assert 'class="num lagbad"' in html  # lag > 0 stands out
    assert "could not read: OperationalError: &lt;no route&gt;" in html
    assert "pay&lt;x&gt;" in html and "pay<x>" not in html
    assert "ledger down" in html and "known only when a run renders it" in html
    assert html.count('class="summary"') == 1


def test_one_pipeline_only_or_a_clear_message():
    assert render_page(_overview(), only="orders").count('<div class="card"') == 1
    assert "No pipeline named nope was found" in render_page(_overview(), only="nope")
