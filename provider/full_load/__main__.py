"""Run a full load as a Spark application: ``spark-submit -m``-style or ``python -m exactly_once_provider.full_load``.

The source connection comes from Airflow's connection lookup (``AIRFLOW_CONN_<ID>`` or a secrets backend).
Prints the published handoff as one line: ``full-load-result: {json}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook

RESULT_PREFIX = "full-load-result: "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--sink", required=True, help="Delta table path")
    parser.add_argument("--staging")
    parser.add_argument("--chunk-rows", type=int, default=100_000)
    parser.add_argument("--chunks-per-job", type=int, default=2)
    parser.add_argument("--fetch-rows", type=int, default=10_000)
    parser.add_argument("--reader", choices=("native", "rows"), default="native")
    parser.add_argument("--full-reload", action="store_true")
    parser.add_argument("--mysql-conn-id", default=MySqlSourceHook.default_conn_name)
    parser.add_argument("--master", help="Spark master when not launched by spark-submit")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark setting key=value")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.appName(f"eo-full-load-{args.table}")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
    if args.master:
        builder = builder.master(args.master)
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    request = FullLoadRequest(schema=args.schema, table=args.table, sink_path=args.sink, staging_path=args.staging,
                              chunk_rows=args.chunk_rows, chunks_per_job=args.chunks_per_job,
                              fetch_rows=args.fetch_rows, reader=args.reader, full_reload=args.full_reload)
    result = run_full_load(spark, MySqlSourceHook(mysql_conn_id=args.mysql_conn_id), request)
    h = result.handoff
    print(RESULT_PREFIX + json.dumps({"rows": h.rows, "table_version": h.table_version, "chunks_read": result.chunks_read,
                      "chunks_resumed": result.chunks_resumed, "seconds": round(result.seconds, 3),
                      "min_position": str(h.min_position), "load_id": h.load_id}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
