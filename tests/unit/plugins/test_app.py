"""The page's routes refuse anonymous callers through Airflow's own dependency (no token: 401)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from exactly_once_provider.plugins.app import create_app


def test_anonymous_api_callers_get_401_and_no_data():
    client = TestClient(create_app())
    for path in ("/api/pipelines", "/"):
        response = client.get(path, headers={"accept": "application/json"})
        assert response.status_code == 401, path
        assert response.json() == {"detail": "Not authenticated"}
    assert client.get("/api/pipelines", headers={"Authorization": "Basic eDp5"}).status_code == 401
