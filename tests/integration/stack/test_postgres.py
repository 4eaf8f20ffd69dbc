"""PostgreSQL answers through Airflow's standard ``postgres`` connection, with transactional semantics."""

from __future__ import annotations

import uuid

from airflow.providers.postgres.hooks.postgres import PostgresHook


def test_postgres_connection_commits_and_rolls_back(stack, airflow_connections):
    hook = PostgresHook(postgres_conn_id="postgres_default")
    table = f"smoke_{uuid.uuid4().hex[:8]}"
    conn = hook.get_conn()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
            cur.execute(f"INSERT INTO {table} VALUES (1)")
        conn.commit()
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {table} VALUES (2)")
        conn.rollback()
        with conn.cursor() as cur:
            cur.execute(f"SELECT id FROM {table} ORDER BY id")
            assert [row[0] for row in cur.fetchall()] == [1]
            cur.execute(f"DROP TABLE {table}")
        conn.commit()
    finally:
        conn.close()
