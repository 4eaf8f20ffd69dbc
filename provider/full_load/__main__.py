"""Run a full load as a Spark application.

Two ways in:

* ``--spec <file>``: the driver of :class:`~exactly_once_provider.operators.full_load.MySqlFullLoadOperator`
  (submitted by spark-submit, locally or on a cluster's worker). The spec's ``params`` are the operator's
  :class:`~exactly_once_provider.full_load.job.FullLoadRequest` plus ``mysql_conn_id``, or ``requests`` (a list
  of them: several tables in this one application); the MySQL connection's settings come from the 0600 secrets
  file only, resolved by the operator (:func:`~exactly_once_provider.source.server.source_from_secrets`).
  The result goes to the spec's result file (``{"loads": [...]}`` for ``requests``: None for a table skipped).
* ``python -m exactly_once_provider.full_load --schema ... --table ... --sink ...`` on its own, with the source
  connection from Airflow's connection lookup (``AIRFLOW_CONN_<ID>`` or a secrets backend, read by
  :meth:`~exactly_once_provider.source.snapshot.ConnectionSettings.of_connection`), and, for a sink or
  staging area on S3, the ``aws`` connection ``--aws-conn-id`` the same way (read in this process, never a
  command-line value). Prints the published handoff as one line: ``full-load-result: {json}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from exactly_once_provider.full_load.job import (
    FullLoadRequest,
    FullLoadResult,
    Progress,
    result_json,
    run_full_load,
    run_full_loads,
)
from exactly_once_provider.source.server import MySqlSource, source_from_secrets
from exactly_once_provider.source.snapshot import ConnectionSettings

RESULT_PREFIX = "full-load-result: "
JOB = "full_load"
log = logging.getLogger("exactly_once_provider.full_load")


def request_from_json(params: dict[str, Any]) -> FullLoadRequest:
    """Return the :class:`FullLoadRequest` of a job spec's ``params`` (JSON has lists, not tuples)."""
    fields = {k: v for k, v in params.items() if k not in ("mysql_conn_id", "requests")}
    if fields.get("chunk_key") is not None:
        fields["chunk_key"] = tuple(fields["chunk_key"])
    return FullLoadRequest(**fields)


def result_to_json(result: FullLoadResult) -> dict[str, Any]:
    """Return what the operator needs of a finished load: the handoff and what this run did."""
    return result_json(
        result.handoff, result.already_published, result.chunks_read, result.chunks_resumed, result.seconds
    )


def _progress(p: Progress) -> None:  # the task log shows it: spark-submit's output goes there
    log.info(
        "full load %s: %d/%d chunks done, %d rows, %.0f rows/s",
        p.table,
        p.chunks_done,
        p.chunks_total,
        p.rows,
        p.rows_per_second,
    )


def _driver(spec, secrets) -> dict[str, Any]:
    from exactly_once_provider.spark_jobs.session import driver_session

    several = "requests" in spec.params
    requests = [request_from_json(r) for r in spec.params["requests"]] if several else [request_from_json(spec.params)]
    spark = driver_session(spec)
    try:
        results = run_full_loads(spark, source_from_secrets(secrets), requests, _progress)
    finally:
        spark.stop()
    if several:
        return {"loads": [None if r is None else result_to_json(r) for r in results]}
    return result_to_json(results[0])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--spec"] or any(a.startswith("--spec=") for a in argv[:1]):
        from exactly_once_provider.spark_jobs.driver import run_job

        return run_job(JOB, _driver, argv)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--sink", required=True, help="Delta table path")
    parser.add_argument("--staging")
    parser.add_argument("--chunk-rows", type=int, help="rows per chunk (default: sized from the row estimate)")
    parser.add_argument("--chunks-per-job", type=int, help="chunks per Spark job (default: the cores)")
    parser.add_argument("--fetch-rows", type=int, default=10_000)
    parser.add_argument("--reader", choices=("native", "rows"), default="native")
    parser.add_argument("--full-reload", action="store_true")
    parser.add_argument("--mysql-conn-id", default="mysql_default")
    parser.add_argument("--aws-conn-id", default="aws_default", help="the aws connection of an s3:// sink or staging")
    parser.add_argument("--master", help="Spark master when not launched by spark-submit")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark setting key=value")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from exactly_once_provider.spark_jobs.session import with_storage_conf
    from exactly_once_provider.storage.s3 import register_settings, settings_for

    register_settings(settings_for(args.aws_conn_id, args.sink, args.staging))
    builder = (
        SparkSession.builder.appName(f"eo-full-load-{args.table}")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    )
    if args.master:
        builder = builder.master(args.master)
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = with_storage_conf(builder).getOrCreate()
    request = FullLoadRequest(
        schema=args.schema,
        table=args.table,
        sink_path=args.sink,
        staging_path=args.staging,
        chunk_rows=args.chunk_rows,
        chunks_per_job=args.chunks_per_job,
        fetch_rows=args.fetch_rows,
        reader=args.reader,
        full_reload=args.full_reload,
    )
    source = MySqlSource(
        ConnectionSettings.of_connection(args.mysql_conn_id), f"MySQL connection {args.mysql_conn_id!r}"
    )
    result = run_full_load(spark, source, request)
    h = result.handoff
    print(
        RESULT_PREFIX
        + json.dumps(
            {
                "rows": h.rows,
                "table_version": h.table_version,
                "chunks_read": result.chunks_read,
                "chunks_resumed": result.chunks_resumed,
                "seconds": round(result.seconds, 3),
                "min_position": str(h.min_position),
                "load_id": h.load_id,
            }
        ),
        flush=True,
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
