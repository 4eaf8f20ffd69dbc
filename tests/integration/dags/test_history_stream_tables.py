"""The history -> stream template with several tables through ``airflow dags test``: orders (integer key),
lines (two-column key) and accounts (text key) in ONE DAG: a full load each, one capture, one apply
application, a reconciliation each. Writers change all three in shared transactions between the runs; each
reconciliation is CLEAN and each current table, read here with delta-rs, equals its source table row by row.
"""

from __future__ import annotations

import re
import uuid

import pytest

from tests.integration.spark_jobs.test_kafka_to_sink_multi_table import TABLES, _delta_rs_rows, _seed, _writer
from tests.mysql_support import assert_same_rows, connect, source_rows
from tests.template_support import TemplateDag

pytestmark = [pytest.mark.e2e, pytest.mark.dags_test, pytest.mark.timeout(3600)]


def _clean(output: str, pipeline: str, names: dict[str, str]) -> None:
    for name in names.values():
        found = re.search(rf"reconciliation {re.escape(pipeline)}\.{name} \(.*\): (CLEAN|MISMATCH)", output)
        assert found and found.group(1) == "CLEAN", (name, output[-5000:])


def test_three_tables_any_key_in_one_dag(airflow_home, stack, tmp_path):
    import threading

    suffix = uuid.uuid4().hex[:6]
    names = {prefix: f"{prefix}_{suffix}" for prefix in TABLES}
    pipeline = f"hst-{suffix}"
    conn = connect(stack)
    cur = conn.cursor()
    for prefix, name in names.items():
        cur.execute(f"CREATE TABLE `{name}` {TABLES[prefix][0]}")
    _seed(cur, names)
    dag = TemplateDag(
        airflow_home,
        tmp_path / "dags",
        f"eo_hst_{suffix}",
        "exactly_once_provider.templates.history_stream.history_stream_dag",
        {
            "dag_id": f"eo_hst_{suffix}",
            "schema": stack.DB_NAME,
            "tables": list(names.values()),
            "pipeline": pipeline,
            "table_path": str(tmp_path / "lake" / "{table}"),
            "checkpoint_location": str(tmp_path / "checkpoints" / "{table}"),
            "start_date": "2026-01-01T00:00:00+00:00",
            "chunk_rows": 100,
            "spark_conf": stack.spark_conf(),
            "retries": 0,
        },
    )
    first = dag.test()  # three full loads, the first increment of all three
    _clean(first, pipeline, names)
    for name in names.values():
        assert f"published {stack.DB_NAME}.{name}: " in first, (name, first[-4000:])

    stop, errors = threading.Event(), []
    stop.set()  # each writer: its minimum of transactions across the three tables
    writers = [threading.Thread(target=_writer, args=(stack, names, seed, stop, errors)) for seed in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(300)
    assert not errors, errors
    second = dag.test()  # an increment: no full load, the changes of all three tables
    assert "rows as Delta version" not in second, "a plain rerun must not load the tables again"
    _clean(second, pipeline, names)
    for prefix, name in names.items():
        _, columns, key = TABLES[prefix]
        path = str(tmp_path / "lake" / name)
        assert_same_rows(_delta_rs_rows(path, columns, key), source_rows(stack, name, columns), columns)
        cur.execute(f"DROP TABLE `{name}`")
    conn.close()
