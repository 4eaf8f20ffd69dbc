"""Operator: the settlement report of one window (rows and sums per group), replaced atomically in PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from exactly_once_provider import lineage
from exactly_once_provider import lineage_facets as facets
from exactly_once_provider.connections import postgres_connection
from exactly_once_provider.full_load.columns import table_columns
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.operators.spark_submit import PackagedSparkJobOperator
from exactly_once_provider.plugins.links import PipelineStatusLink
from exactly_once_provider.spark_jobs.packages import S3A_PACKAGES, SPARK_PACKAGES


class SettlementReportOperator(facets.OpenLineageMixin, PackagedSparkJobOperator):
    """
    Summarise one settled window of a window-mode Delta sink into a PostgreSQL report table.

    Reads the window's rows (``window_id``; the newest version is the only one the sink keeps) from the JSON
    ``record_value`` (``row`` object of the watermark records), groups them by ``group_by`` and writes per group
    the row count and the sum of each ``sum_columns`` column. The window's report rows are deleted and
    inserted in ONE PostgreSQL transaction, so a rerun or a re-extract replaces them: one copy per window.
    The sums run as a Spark application through the Spark connection (cluster deploy mode supported); the
    groups come back in a small result file. A retry runs the read-only job again (``durable`` is off).

    Report table (created if missing): ``window_id text, window_version int, <group_by> text, rows bigint,
    <column>_sum numeric, reported_at timestamptz``, primary key ``(window_id, <group_by>)``.

    :param window_id: the window (``<pipeline>/<source_partition>/<batch_id>``).
    :param sink_path: the window-mode Delta table: a local path or ``s3://bucket/prefix`` (read through ``s3a``).
    :param report_table: the PostgreSQL report table.
    :param source_table: the source table (``schema.table`` or ``table``), for the sum columns' scales.
    :param group_by: columns to group by, e.g. ``["currency"]``.
    :param sum_columns: numeric columns to sum, e.g. ``["amount"]``.
    :param mysql_conn_id: the source ``mysql`` connection (column types only).
    :param postgres_conn_id: the ``postgres`` connection of the report table.
    :param spark_conn_id: the ``spark`` connection (see
        :class:`~exactly_once_provider.operators.spark_submit.PackagedSparkJobOperator` for the other Spark
        arguments).
    :param spark_conf: extra Spark settings.
    :param aws_conn_id: the standard ``aws`` connection of a ``sink_path`` on S3 (credentials, ``endpoint_url``);
        they reach the driver in its owner-only secrets file, never the command line.
    :param sink_pipeline: the window load's pipeline (``on_bad_record="dead_letter"``): the report then says how
        many of the window's records were dead-lettered (the sink's window state, read without Spark), in the
        task log and the XCom (``dead_letters``); the window settled without them (docs/dead-letters.md).

    An ``AssetAlias`` among the task's ``outlets`` receives the report table's Asset, named by its OpenLineage
    URI ``postgres://host:port/database/schema/table`` (known from the connection only when the task runs).
    """

    template_fields: Sequence[str] = ("window_id", "sink_path", "report_table")
    operator_extra_links = (PipelineStatusLink(),)
    job_name = "settlement_report"
    job_module = "exactly_once_provider.spark_jobs.settlement_report"

    def __init__(
        self,
        *,
        window_id: str,
        sink_path: str,
        report_table: str,
        source_table: str,
        group_by: Sequence[str],
        sum_columns: Sequence[str],
        mysql_conn_id: str = "mysql_default",
        postgres_conn_id: str = "postgres_default",
        spark_conn_id: str = "spark_default",
        spark_conf: dict[str, str] | None = None,
        aws_conn_id: str = "aws_default",
        sink_pipeline: str | None = None,
        **kwargs: Any,
    ) -> None:
        # The groups exist only in this try's result file: a retry runs the read-only job again.
        kwargs.setdefault("durable", False)
        super().__init__(spark_conn_id=spark_conn_id, conf=spark_conf, **kwargs)
        self.window_id, self.sink_path, self.report_table, self.source_table = (
            window_id,
            sink_path,
            report_table,
            source_table,
        )
        self.group_by, self.sum_columns = list(group_by), list(sum_columns)
        self.mysql_conn_id, self.postgres_conn_id = mysql_conn_id, postgres_conn_id
        self.spark_conn_id, self.spark_conf = spark_conn_id, spark_conf or {}
        self.aws_conn_id, self._s3 = aws_conn_id, None
        self.sink_pipeline = sink_pipeline

    @property
    def status_pipeline(self) -> str:
        """The extract's pipeline (the first part of ``<pipeline>/<source_partition>/<batch_id>``): its flow card."""
        return str(self.window_id).split("/", 1)[0]

    def _scales(self) -> dict[str, int]:
        hook = MySqlSourceHook(self.mysql_conn_id)
        schema, _, table = self.source_table.rpartition(".")
        schema = schema or hook.get_connection(self.mysql_conn_id).schema
        with hook.cursor() as cur:
            columns = {c.name: c for c in table_columns(cur, schema, table)}
        missing = [c for c in (*self.group_by, *self.sum_columns) if c not in columns]
        if missing:
            raise ValueError(f"Columns {missing} are not in {schema}.{table} (it has {list(columns)}).")
        numeric = ("decimal", "tinyint", "smallint", "mediumint", "int", "bigint")
        wrong = [c for c in self.sum_columns if columns[c].data_type not in numeric]
        if wrong:
            raise ValueError(f"sum_columns {wrong} are not DECIMAL or integer columns: sums must be exact.")
        return {c: int(columns[c].scale or 0) for c in self.sum_columns}

    def job_params(self, context: Any) -> dict[str, Any]:
        if not self.window_id or not self.group_by:
            raise ValueError("window_id and group_by must be non-empty.")
        return {
            "sink_path": self.sink_path,
            "window_id": self.window_id,
            "group_by": self.group_by,
            "sum_columns": self.sum_columns,
            "scales": self._scales(),
        }

    def _s3_settings(self):
        """Return the S3 settings of ``aws_conn_id`` for a ``sink_path`` on S3 (read once per run), else None."""
        if self._s3 is None:
            from exactly_once_provider.storage.s3 import settings_for

            self._s3 = settings_for(self.aws_conn_id, self.sink_path)
        return self._s3

    def job_secrets(self) -> dict[str, Any]:
        return {"s3": self._s3_settings().to_json()} if self._s3_settings() is not None else {}

    def default_packages(self) -> tuple[str, ...]:
        return SPARK_PACKAGES + (S3A_PACKAGES if self._s3_settings() is not None else ())

    def job_result(self, result: Any, context: Any) -> dict[str, Any]:
        groups = [{**g, **{c: Decimal(g[c]) for c in self.sum_columns if g.get(c) is not None}} for g in result or []]
        if not groups:
            self.log.warning("Window %s has no rows in %s: the report is empty.", self.window_id, self.sink_path)
        written = self._replace(groups)
        header = [*self.group_by, "rows", *(f"{c}_sum" for c in self.sum_columns)]
        self.log.info(
            "settlement report of %s (version %s):\n%s",
            self.window_id,
            written["window_version"],
            "\n".join("  " + "  ".join(f"{str(v):>14}" for v in line) for line in [header] + written["lines"]),
        )
        if self.sink_pipeline:
            written["dead_letters"] = self._dead_letters()
            if written["dead_letters"]:
                self.log.info(
                    "Window %s settled with %d dead-lettered record(s), not in its rows above: they are in the "
                    "dead-letter store of %s (docs/dead-letters.md).",
                    self.window_id,
                    written["dead_letters"],
                    self.sink_pipeline,
                )
        self._name_report_asset(context)
        self.openlineage_result = written
        return written

    def _dead_letters(self) -> int:
        """Return the window's dead-lettered records, as the sink's window state counts them (its newest commit)."""
        from exactly_once_provider.sinks.delta import DeltaSink

        state = DeltaSink(self.sink_path, self.sink_pipeline, s3=self._s3_settings()).committed()
        window = (state.extra.get("windows") or {}).get(self.window_id, {}) if state else {}
        return int(window.get("dead_letters", 0))

    def _name_report_asset(self, context: Any) -> None:
        """Add the report table's Asset (its OpenLineage URI, from the connection) to each AssetAlias outlet."""
        from airflow.sdk import Asset, AssetAlias

        aliases = [o for o in self.outlets if isinstance(o, AssetAlias)]
        if not aliases:
            return
        uri = lineage.postgres_table_of(self.postgres_conn_id, self.report_table).asset_uri
        for alias in aliases:
            context["outlet_events"][alias].add(Asset(uri=uri))
            self.log.info("report Asset %s added to the alias %s", uri, alias.name)

    def openlineage_datasets(self, result: dict | None) -> tuple[list, list]:
        """The window-mode Delta table in; the report table out (one row per group of the window)."""
        source = lineage.storage_path(self.sink_path)
        report = lineage.postgres_table_of(self.postgres_conn_id, self.report_table)
        fields = [
            ("window_id", "text"),
            ("window_version", "int"),
            *((c, "text") for c in self.group_by),
            ("rows", "bigint"),
            *((f"{c}_sum", "numeric") for c in self.sum_columns),
            ("reported_at", "timestamptz"),
        ]
        table = self.sink_path
        if self._s3_settings() is not None:  # the log is read through the connection's settings
            from exactly_once_provider.storage import open_storage

            table = open_storage(self.sink_path, self._s3_settings())
        inputs = [facets.input_dataset(source, self.lineage_fields(source.name, lambda: facets.delta_fields(table)))]
        if result is None:
            return inputs, [facets.output_dataset(report, fields)]
        commit = facets.CommitFacet(window={"batch_id": self.window_id, "batch_version": result["window_version"]})
        return inputs, [facets.output_dataset(report, fields, rows=result["groups"], commit=commit)]

    def _replace(self, groups: list[dict]) -> dict[str, Any]:
        from psycopg2 import sql

        conn = postgres_connection(self.postgres_conn_id)
        table = sql.Identifier(*self.report_table.split("."))
        group_cols = [sql.Identifier(c) for c in self.group_by]
        sum_cols = [sql.Identifier(f"{c}_sum") for c in self.sum_columns]
        version = max((g["v"] for g in groups), default=0)
        lines = []
        try:
            with conn, conn.cursor() as cur:
                cur.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {t} (window_id text NOT NULL, window_version int NOT NULL, {g},"
                        " rows bigint NOT NULL, {s}, reported_at timestamptz NOT NULL DEFAULT now(),"
                        " PRIMARY KEY (window_id, {k}))"
                    ).format(
                        t=table,
                        g=sql.SQL(", ").join(sql.SQL("{} text").format(c) for c in group_cols),
                        s=sql.SQL(", ").join(sql.SQL("{} numeric").format(c) for c in sum_cols),
                        k=sql.SQL(", ").join(group_cols),
                    )
                )
                # One transaction: the window's previous report disappears exactly when the new one appears.
                cur.execute(sql.SQL("DELETE FROM {} WHERE window_id = %s").format(table), (self.window_id,))
                for g in sorted(groups, key=lambda g: [str(g[c]) for c in self.group_by]):
                    values = [g[c] for c in self.group_by] + [g["eo_rows"]] + [g[c] for c in self.sum_columns]
                    cur.execute(
                        sql.SQL("INSERT INTO {t} (window_id, window_version, {c}) VALUES (%s, %s, {p})").format(
                            t=table,
                            c=sql.SQL(", ").join(group_cols + [sql.Identifier("rows")] + sum_cols),
                            p=sql.SQL(", ").join(sql.Placeholder() * len(values)),
                        ),
                        [self.window_id, version, *values],
                    )
                    lines.append(values)
        finally:
            conn.close()
        return {
            "window_id": self.window_id,
            "window_version": version,
            "groups": len(lines),
            "rows": sum(int(line[len(self.group_by)]) for line in lines),
            "lines": [[str(v) for v in line] for line in lines],
        }
