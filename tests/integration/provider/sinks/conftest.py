"""Fixtures of the sink tests against the real PostgreSQL."""

from __future__ import annotations

import uuid

import psycopg2
import pytest


@pytest.fixture
def schema(stack):
    """psycopg2 connection arguments whose ``search_path`` is a new, empty schema (dropped afterwards): the sink's
    shared tables (offsets, windows, current-table state) are this test's alone."""
    name = f"sinks_{uuid.uuid4().hex[:8]}"
    params = dict(
        host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER, password=stack.DB_PASSWORD
    )
    admin = psycopg2.connect(**params)
    admin.autocommit = True
    admin.cursor().execute(f"CREATE SCHEMA {name}")
    yield {**params, "options": f"-c search_path={name}"}
    admin.cursor().execute(f"DROP SCHEMA {name} CASCADE")
    admin.close()
