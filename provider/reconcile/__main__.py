"""The reconciliation of a Delta sink as a Spark application: ``spark-submit .../reconcile/__main__.py --spec <file>``.

Submitted by :class:`~exactly_once_provider.operators.reconcile.ReconcileOperator`. The spec's ``params``: the
sink spec, the source table, its key and compared columns, the captured position (CDC), the engine's settings
and ``mysql_conn_id``, whose connection's settings come from the 0600 secrets file only, resolved by the operator
(:func:`~exactly_once_provider.source.server.source_from_secrets`). The Delta side is pinned at the
table's current version before the source snapshot opens; the report goes to the result file.
"""

from __future__ import annotations

import sys
from typing import Any

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.positions import parse_position
from exactly_once_provider.reconcile import sides
from exactly_once_provider.reconcile.keys import Key
from exactly_once_provider.reconcile.run import compare, report_to_json, sink_spec_from_json
from exactly_once_provider.sinks import delta_commit
from exactly_once_provider.source.server import source_from_secrets
from exactly_once_provider.spark_jobs.driver import run_job
from exactly_once_provider.spark_jobs.spec import JobSpec

JOB = "reconcile"


def _driver(job: JobSpec, secrets: dict) -> dict[str, Any]:
    from exactly_once_provider.spark_jobs.session import driver_session, register_storage

    register_storage(secrets)  # a Delta sink on s3://: its settings, for the log reads and for Spark's s3a
    p = job.params
    spec = sink_spec_from_json(p["sink"])
    key, columns = Key.of([Column(**c) for c in p["key"]]), [Column(**c) for c in p["columns"]]
    spark = driver_session(job)
    sink_side = None
    pending: list[str] = []
    try:
        scope = [tuple(r) for r in p["scope"]] if p.get("scope") is not None else None
        version = delta_commit.newest_version(spec.location)  # pinned BEFORE the source snapshot opens
        if p.get("find_pending") and version >= 0:  # the default column list: leave out what no record holds
            pending = sides.columns_not_held(spark, spec, key, columns, version)
            columns = [c for c in columns if c.name not in pending]
        sink_side = sides.delta_side(spark, spec, key, columns, scope, version if version >= 0 else None)
        report, common = compare(
            source_from_secrets(secrets),
            sink_side,
            p["schema"],
            p["table"],
            key,
            columns,
            p["source_filter"],
            parse_position(p["captured"]) if p["captured"] else None,
            fanout=p["fanout"],
            max_segments=p["max_segments"],
            leaf_width=p["leaf_width"],
            scope=scope,
        )
    finally:
        if sink_side is not None:
            sink_side.close()
        spark.stop()
    return {
        "report": report_to_json(report),
        "position": common.to_json() if common else None,
        "pending_columns": pending,
    }


if __name__ == "__main__":
    sys.exit(run_job(JOB, _driver, sys.argv[1:]))
