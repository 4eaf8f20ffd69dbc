"""The reconciliation result table (PostgreSQL), read later by the UI plugin.

One row per reconciliation run::

    eo_reconciliation(
        id bigserial PRIMARY KEY, name text NOT NULL,          -- the pipeline / reconciliation name
        dag_id text, run_id text, task_id text, try_number int, -- where it ran (display only)
        started_at timestamptz NOT NULL, finished_at timestamptz NOT NULL,
        status text NOT NULL,                                   -- 'clean' | 'mismatch'
        source_rows bigint, sink_rows bigint, source_checksum text, sink_checksum text,
        missing int, extra int, duplicate int, changed int, in_flight int,
        dead_lettered int,                                      -- differing keys explained by open dead letters
        position jsonb,                                         -- CDC: captured P, snapshot S (see .position)
        cost jsonb,                                             -- queries, full scans, levels, seconds
        differences jsonb)                                      -- first 1000 differing keys {key, kind, ...}

Read the latest per name with :func:`latest_results`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import Any

from exactly_once_provider.reconcile.engine import MISMATCH_KINDS, Report

RESULT_TABLE = "eo_reconciliation"
MAX_STORED_DIFFERENCES = 1000

_DDL = f"""
CREATE TABLE IF NOT EXISTS {RESULT_TABLE} (
    id bigserial PRIMARY KEY, name text NOT NULL, dag_id text, run_id text, task_id text, try_number int,
    started_at timestamptz NOT NULL, finished_at timestamptz NOT NULL, status text NOT NULL,
    source_rows bigint, sink_rows bigint, source_checksum text, sink_checksum text,
    missing int, extra int, duplicate int, changed int, in_flight int,
    position jsonb, cost jsonb, differences jsonb, dead_lettered int)
"""
# a table created by a version without the column gets it (NULL in its older rows: not counted then)
_ADD_DEAD_LETTERED = f"ALTER TABLE {RESULT_TABLE} ADD COLUMN IF NOT EXISTS dead_lettered int"


def store_result(
    conn: Any,
    name: str,
    report: Report,
    started_at: datetime,
    finished_at: datetime,
    position: dict | None = None,
    where: dict | None = None,
) -> int:
    """Insert one result row (creating the table if missing); return its id.

    :param conn: an open psycopg2 connection (committed here).
    :param name: the reconciliation's name (usually the pipeline).
    :param report: the engine's report.
    :param started_at: when the comparison started.
    :param finished_at: when it finished.
    :param position: the CDC common position (``CommonPosition.to_json()``), if any.
    :param where: ``dag_id``, ``run_id``, ``task_id``, ``try_number`` for display.
    """
    where = where or {}
    s = report.summary()
    cost = {k: s[k] for k in ("queries", "full_scans", "levels", "seconds")}
    differences = [asdict(d) for d in report.differences[:MAX_STORED_DIFFERENCES]]
    with conn.cursor() as cur:
        cur.execute(_DDL)
        cur.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = %s"
            " AND column_name = 'dead_lettered'",
            (RESULT_TABLE,),
        )
        if cur.fetchone() is None:  # an ALTER only then: it locks the table against every reader while it waits
            cur.execute(_ADD_DEAD_LETTERED)
        cur.execute(
            f"INSERT INTO {RESULT_TABLE} (name, dag_id, run_id, task_id, try_number, started_at, finished_at,"
            " status, source_rows, sink_rows, source_checksum, sink_checksum, missing, extra, duplicate, changed,"
            " in_flight, dead_lettered, position, cost, differences) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s,"
            " %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (
                name,
                where.get("dag_id"),
                where.get("run_id"),
                where.get("task_id"),
                where.get("try_number"),
                started_at,
                finished_at,
                "clean" if report.clean else "mismatch",
                s["source_rows"],
                s["sink_rows"],
                s["source_checksum"],
                s["sink_checksum"],
                *(s[k] for k in MISMATCH_KINDS),
                s["in_flight"],
                s["dead_lettered"],
                json.dumps(position) if position else None,
                json.dumps(cost),
                json.dumps(differences),
            ),
        )
        row_id = cur.fetchone()[0]
    conn.commit()
    return row_id


def latest_clean(conn: Any, name: str) -> dict | None:
    """Return the newest clean result row of ``name`` (None if there is none)."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (RESULT_TABLE,))
        if cur.fetchone()[0] is None:
            return None
        cur.execute(
            f"SELECT * FROM {RESULT_TABLE} WHERE name = %s AND status = 'clean' ORDER BY id DESC LIMIT 1", (name,)
        )
        row = cur.fetchone()
        return dict(zip([c.name for c in cur.description], row)) if row else None


def latest_results(conn: Any, name: str | None = None) -> list[dict]:
    """Return the newest result row per name (or of ``name``), newest first; [] if none was stored yet."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (RESULT_TABLE,))
        if cur.fetchone()[0] is None:
            return []
        cur.execute(
            f"SELECT DISTINCT ON (name) * FROM {RESULT_TABLE}"
            + (" WHERE name = %s" if name else "")
            + " ORDER BY name, id DESC",
            (name,) if name else None,
        )
        columns = [c.name for c in cur.description]
        rows = [dict(zip(columns, row)) for row in cur.fetchall()]
    return sorted(rows, key=lambda r: r["id"], reverse=True)
