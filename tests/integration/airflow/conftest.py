"""The real Airflow these tests share: started for the first of them, stopped after the last (package scope).

A session fixture would keep its scheduler, triggerer, dag-processor and api-server polling for the rest of
the session on that xdist worker. ``make test`` hands these tests out first (tests/conftest.py), so each worker
runs its share back to back on one Airflow and stops it when it moves on.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def airflow_server(stack, tmp_path_factory):
    """A real Airflow (api-server, scheduler, dag-processor, triggerer; LocalExecutor; PostgreSQL metadata DB)."""
    from tests.airflow_support import AirflowServer

    server = AirflowServer(stack, tmp_path_factory.mktemp("airflow_server"))
    try:
        server.start()
        yield server
    finally:
        server.stop()
