"""Reconciliation on the real stack: MariaDB source vs PostgreSQL and Delta sinks.

A table with DECIMAL, DATETIME(6), TIMESTAMP, DATE, VARCHAR (with NULLs and non-ASCII), BLOB and BIGINT is
copied to the sinks by the test itself (an independent path), then single-row differences are planted. The
operator must name each differing key, cost at most 3 full scans when nothing differs, and store its result.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal

import psycopg2
import pytest

from exactly_once_provider.full_load import handoff
from exactly_once_provider.operators.reconcile import ReconcileOperator, ReconciliationMismatch
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.reconcile.results import latest_results
from exactly_once_provider.reconcile.sides import version_of
from exactly_once_provider.sinks import delta_commit
from tests import spark_job_support as jobs
from tests.mysql_support import connect

ROWS = 5_000
COLUMNS = ("id", "amount", "currency", "note", "created", "updated", "day", "blob_col", "big")


def _row(i: int) -> tuple:
    return (
        i,
        Decimal(i % 9973) / 100,
        ("EUR", "USD", "CNY")[i % 3],
        None if i % 7 == 0 else f"n{i}-é",
        dt.datetime(2026, 11, 20, 10, 0, 0, (i * 37) % 1_000_000),
        dt.datetime(2026, 11, 21, 1, 2, 3),
        dt.date(2026, 1, 1) + dt.timedelta(days=i % 300),
        bytes([i % 256, 7]),
        i * 1_000_003,
    )


def _pg(stack):
    return psycopg2.connect(
        host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER, password=stack.DB_PASSWORD
    )


@pytest.fixture(scope="module")
def source(stack):
    table = f"rec_{uuid.uuid4().hex[:8]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, currency CHAR(3),"
        " note VARCHAR(40) CHARACTER SET utf8mb4, created DATETIME(6), updated TIMESTAMP NULL,"
        " day DATE, blob_col BLOB, big BIGINT)"
    )
    rows = [_row(i) for i in range(1, ROWS + 1)]
    cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)", rows)
    conn.close()
    return table, rows


def _postgres_copy(stack, name: str, rows: list[tuple]) -> str:
    conn = _pg(stack)
    with conn, conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE {name} (id bigint PRIMARY KEY, amount numeric(12,2), currency text, note text,"
            " created timestamp, updated timestamp, day date, blob_col bytea, big bigint)"
        )
        cur.executemany(
            f"INSERT INTO {name} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [r[:7] + (psycopg2.Binary(r[7]), r[8]) for r in rows],
        )
    conn.close()
    return name


def _operator(table: str, **kwargs) -> ReconcileOperator:
    return ReconcileOperator(task_id="reconcile", name=f"test-{table}", table=table, **kwargs)


def test_a_source_column_the_postgres_table_lacks_yet_is_pending_not_an_error(stack, airflow_connections, source):
    """An ADD COLUMN its apply has not reached (the PostgreSQL current table): compared without it, reported."""
    table, rows = source
    sink = _postgres_copy(stack, f"{table}_nobig", rows)
    conn = _pg(stack)
    with conn, conn.cursor() as cur:
        cur.execute(f"ALTER TABLE {sink} DROP COLUMN big")
        cur.execute(f"UPDATE {sink} SET note = 'wrong' WHERE id = 12")
    conn.close()
    result = _operator(table, sink="postgres", sink_table=sink, fail_on_mismatch=False).execute({})
    assert result["pending_columns"] == ["big"], result
    assert [(d["key"], d["kind"]) for d in result["differences"]] == [(12, "changed")], result
    with pytest.raises(ValueError, match="has no column"):  # named by the caller: it must be on the sink
        _operator(table, sink="postgres", sink_table=sink, columns=["id", "big"]).execute({})


def test_postgres_sink_clean_costs_at_most_three_full_scans_and_is_stored(stack, airflow_connections, source):
    table, rows = source
    sink = _postgres_copy(stack, f"{table}_clean", rows)
    result = _operator(table, sink="postgres", sink_table=sink).execute({})
    assert result["clean"] and result["source_rows"] == result["sink_rows"] == ROWS
    assert result["source_checksum"] == result["sink_checksum"]
    assert result["full_scans"] <= 3, result  # measured: 1 grouped scan per side
    print(f"reconcile clean {ROWS} rows: {result['queries']} queries, {result['full_scans']} full scans")
    conn = _pg(stack)
    stored = latest_results(conn, f"test-{table}")
    conn.close()
    assert stored[0]["status"] == "clean" and stored[0]["source_rows"] == ROWS


def test_postgres_sink_names_each_planted_difference(stack, airflow_connections, source):
    table, rows = source
    sink = _postgres_copy(stack, f"{table}_diff", rows)
    conn = _pg(stack)
    with conn, conn.cursor() as cur:
        cur.execute(f"UPDATE {sink} SET amount = amount + 0.01 WHERE id = 4242")  # changed value
        cur.execute(f"UPDATE {sink} SET note = NULL WHERE id = 4243")  # changed to NULL
        cur.execute(f"DELETE FROM {sink} WHERE id = 4001")  # missing row
        cur.execute(f"INSERT INTO {sink} (id, amount) VALUES (7500, 1)")  # extra row
    conn.close()
    op = _operator(table, sink="postgres", sink_table=sink)
    with pytest.raises(
        ReconciliationMismatch, match="4001 \\(missing\\), 4242 \\(changed\\), 4243 \\(changed\\), 7500 \\(extra\\)"
    ):
        op.execute({})
    report = _operator(table, sink="postgres", sink_table=sink, fail_on_mismatch=False).execute({})
    assert [(d["key"], d["kind"]) for d in report["differences"]] == [
        (4001, "missing"),
        (4242, "changed"),
        (4243, "changed"),
        (7500, "extra"),
    ]
    assert report["full_scans"] <= 3


@pytest.mark.parametrize("reader", ["spark", "delta-rs"])
def test_delta_sink_finds_a_changed_row_and_a_duplicate(stack, airflow_connections, spark, source, tmp_path, reader):
    # delta-rs: the rows are hashed in Python; a clean comparison of every other key proves the Python canonical
    # text equals MariaDB's for each of these types (decimal, text with non-ASCII, DATETIME(6), TIMESTAMP, DATE,
    # BLOB, BIGINT)
    table, rows = source
    sink_rows = [r[:7] + (bytearray(r[7]), r[8]) for r in rows]
    sink_rows[998] = sink_rows[998][:2] + ("GBP",) + sink_rows[998][3:]  # key 999: changed currency
    sink_rows.append(sink_rows[3455])  # key 3456 twice
    frame = spark.createDataFrame(
        sink_rows,
        "id long, amount decimal(12,2), currency string, note string, created timestamp_ntz,"
        " updated timestamp, day date, blob_col binary, big long",
    )
    path = str(tmp_path / "delta")
    frame.write.format("delta").save(path)
    found = _operator(
        table,
        sink="delta",
        sink_path=path,
        fail_on_mismatch=False,
        delta_reader=reader,
        spark_conf=jobs.task_spark_conf(stack),
    ).execute({})
    assert [(d["key"], d["kind"]) for d in found["differences"]] == [(999, "changed"), (3456, "duplicate")]
    assert found["sink_rows"] == ROWS + 1 and found["full_scans"] <= 3, found


def test_cdc_view_compares_at_the_common_position_without_stopping_writers(stack, airflow_connections, spark, tmp_path):
    """Base table + CDC changes (after images in JSON, tombstones); source changes after P are in flight."""
    table = f"rec_cdc_{uuid.uuid4().hex[:8]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, amount DECIMAL(10,2), currency CHAR(3))")
    cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, 'EUR')", [(i, i) for i in range(1, 1001)])
    cur.execute("SHOW MASTER STATUS")
    file, pos = cur.fetchone()[:2]
    base = str(tmp_path / "base")
    marker = handoff.marker(
        "load-1",
        stack.DB_NAME,
        table,
        ("id",),
        [{"index": 0, "lower": None, "upper": None, "file": file, "pos": pos, "rows": 1000}],
    )
    base_frame = spark.createDataFrame(
        [(i, Decimal(i), "EUR") for i in range(1, 1001)], "id int, amount decimal(10,2), currency string"
    )
    delta_commit.commit_with_marker(base_frame, base, marker, "eo-full-load-load-1", 1)
    # Changes the "capture" applied after P (versions above the snapshot's), and one change from before the
    # snapshot (left from before a full reload): the snapshot already has its successor, so the base row wins.
    cur.execute(f"UPDATE {table} SET amount = 55 WHERE id = 5")
    cur.execute(f"DELETE FROM {table} WHERE id = 6")
    cur.execute(f"INSERT INTO {table} VALUES (1001, 1001, 'USD')")
    after = version_of(BinlogPosition(file, pos)) + 1
    changes = [
        ("5", after, False, json.dumps({"op": "u", "after": {"id": 5, "amount": "55.00", "currency": "EUR"}})),
        ("6", after + 1, True, json.dumps({"op": "d", "before": {"id": 6, "amount": "6.00", "currency": "EUR"}})),
        ("1001", after + 2, False, json.dumps({"op": "c", "after": {"id": 1001, "amount": 1001, "currency": "USD"}})),
        ("8", after - 100, False, json.dumps({"op": "u", "after": {"id": 8, "amount": "0.00", "currency": "EUR"}})),
    ]
    changes_path = str(tmp_path / "changes")
    spark.createDataFrame(changes, "pk string, source_version long, deleted boolean, record_value string").write.format(
        "delta"
    ).save(changes_path)
    # The handoff position P is before those three changes; the writer keeps going after them too.
    cur.execute(f"UPDATE {table} SET amount = 77 WHERE id = 7")
    conn.close()
    op = _operator(
        table,
        sink="delta",
        sink_path=changes_path,
        base_path=base,
        sink_json_column="record_value",
        sink_json_path="after",
        sink_key_json_paths=["after.id", "before.id"],
        sink_deleted_column="deleted",
        sink_version_column="source_version",
        full_load_path=base,
        fail_on_mismatch=False,
        spark_conf=jobs.task_spark_conf(stack),
    )  # the driver needs the Delta jars
    result = op.execute({})
    kinds = {d["key"]: d["kind"] for d in result["differences"]}
    # 5, 6, 1001 match through the changes, 8 through the base row; 7 changed after P: in flight.
    assert kinds == {7: "in_flight"}, result
    assert result["clean"] and result["position"]["in_flight_keys"] == 4
