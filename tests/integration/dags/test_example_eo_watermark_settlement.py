"""``airflow dags test`` of the settlement DAG: one batch per data interval; rerun returns it; reextract v2."""

from __future__ import annotations

import json
import uuid

import MySQLdb

from exactly_once_provider.kafka.offsets import read_committed_offset
from tests.kafka_support import new_topic, read_all


def test_settlement_dag_publishes_the_interval_once_and_reextract_publishes_version_2(airflow_cli, stack):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    table, topic, pipeline = f"settle_{uuid.uuid4().hex[:6]}", new_topic(bootstrap), f"settle-{uuid.uuid4().hex[:6]}"
    conn = MySQLdb.connect(
        host=stack.HOST,
        port=stack.MARIADB_PORT,
        user=stack.DB_USER,
        password=stack.DB_PASSWORD,
        database=stack.DB_NAME,
        autocommit=True,
        init_command="SET time_zone = '+00:00'",
    )
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {table} (id INT AUTO_INCREMENT PRIMARY KEY, amount INT, updated_at TIMESTAMP(6) "
        "NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6), KEY (updated_at))"
    )
    # `dags test` at 2026-11-21 02:00 Asia/Shanghai infers the interval that ends there: [11-19 18:00, 11-20 18:00) UTC.
    cur.execute("SET TIMESTAMP = UNIX_TIMESTAMP('2026-11-20 10:00:00')")
    cur.execute(f"INSERT INTO {table} (amount) VALUES (1), (2), (3)")
    cur.execute("SET TIMESTAMP = UNIX_TIMESTAMP('2026-11-20 18:00:00')")  # exactly the interval end: next window
    cur.execute(f"INSERT INTO {table} (amount) VALUES (4)")
    cur.execute("SET TIMESTAMP = DEFAULT")
    conf = {"table": table, "topic": topic, "pipeline": pipeline, "safety_lag": 1, "reextract": False}

    def run(**overrides):
        result = airflow_cli(
            "dags",
            "test",
            "eo_watermark_settlement",
            "2026-11-20T18:00:00+00:00",
            "--conf",
            json.dumps({**conf, **overrides}),
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-5000:]
        return output

    first = run()
    assert "v1 committed: [None, 2026-11-20 18:00:00.000000) upper from interval_end" in first, first[-5000:]
    assert "3 rows" in first
    cur.execute(f"UPDATE {table} SET amount = 10 WHERE id = 1")  # the source moves on
    rerun = run()
    assert "is already committed: [None, 2026-11-20 18:00:00.000000), 3 rows" in rerun, rerun[-5000:]
    again = run(reextract=True)
    assert "v2 committed: [None, 2026-11-20 18:00:00.000000) upper from recorded" in again, again[-5000:]
    assert "2 rows" in again  # row 1 now carries a newer cursor value: it belongs to a later window

    values = [json.loads(v) for v in read_all(bootstrap, topic)]
    data = [v for v in values if "marker" not in v]
    assert [v["row"]["amount"] for v in data] == [1, 2, 3, 2, 3]
    record = read_committed_offset({"bootstrap.servers": bootstrap}, pipeline, table, "eo-offsets")
    assert (record.batch_id, record.batch_version, record.records) == ("2026-11-20T18:00:00+00:00", 2, 2)
    assert record.offset["next_lower"] == "2026-11-20 18:00:00.000000"
