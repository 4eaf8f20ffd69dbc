"""The one helper that turns an Airflow postgres connection into psycopg2 arguments / the libpq environment."""

from __future__ import annotations

import json

from exactly_once_provider.connections import connect_kwargs, libpq_environment


def test_full_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PG_FULL", json.dumps(
        {"conn_type": "postgres", "host": "db", "port": 5433, "login": "u", "password": "s3cret", "schema": "d"}))
    assert connect_kwargs("pg_full", connect_timeout=10) == {
        "host": "db", "port": 5433, "dbname": "d", "user": "u", "password": "s3cret", "connect_timeout": 10}
    assert libpq_environment("pg_full") == {"PGHOST": "db", "PGPORT": "5433", "PGDATABASE": "d", "PGUSER": "u",
                                            "PGPASSWORD": "s3cret"}


def test_unset_fields_are_left_to_libpq_defaults(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PG_BARE", json.dumps({"conn_type": "postgres", "host": "db"}))
    assert connect_kwargs("pg_bare") == {"host": "db", "port": 5432, "dbname": None, "user": None, "password": None}
    assert libpq_environment("pg_bare") == {"PGHOST": "db", "PGPORT": "5432"}
