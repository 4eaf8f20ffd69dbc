"""The status page shows the newest reconciliation result of a pipeline, read from PostgreSQL."""

from __future__ import annotations

import json
import uuid

import psycopg2

from exactly_once_provider.plugins.discovery import PipelineSpec
from exactly_once_provider.plugins.status import MISMATCH, Connections, PipelineStatus, reconciliation_section
from exactly_once_provider.reconcile.results import _DDL, RESULT_TABLE


def _store(cur, name: str, status: str, missing: int) -> None:
    cur.execute(
        f"INSERT INTO {RESULT_TABLE} (name, dag_id, run_id, started_at, finished_at, status, source_rows, sink_rows,"
        " missing, extra, duplicate, changed, in_flight, cost) VALUES (%s, 'd', %s, now(), now(), %s, 10, %s,"
        " %s, 0, 0, 0, 0, %s)",
        (name, f"run-{status}", status, 10 - missing, missing, json.dumps({"full_scans": 2})),
    )


def test_the_newest_result_of_the_pipeline_is_shown_and_a_mismatch_turns_it_red(stack, airflow_connections):
    name = f"status-rec-{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(**Connections.postgres("postgres_default"))
    with conn, conn.cursor() as cur:
        cur.execute(_DDL)
        _store(cur, name, "clean", 0)
        _store(cur, name, "mismatch", 1)
        _store(cur, name + "-other", "clean", 0)
    conn.close()

    section = reconciliation_section(PipelineSpec(name), Connections())

    assert section.error is None
    assert [(r["result"], r["missing"], r["sink rows"], r["full scans"], r["run"]) for r in section.rows] == [
        ("mismatch", 1, 9, 2, "d run-mismatch")
    ]
    assert PipelineStatus(PipelineSpec(name), [section], lag=0).state == MISMATCH
