"""``airflow plugins`` (the real CLI, in a migrated AIRFLOW_HOME) lists the plugin with its app and view."""

from __future__ import annotations

import json


def test_airflow_plugins_lists_the_status_page(airflow_cli):
    result = airflow_cli("plugins", "--output", "json")
    assert result.returncode == 0, result.stderr[-3000:]
    plugins = {p["name"]: p for p in json.loads(result.stdout[result.stdout.index("[") :])}
    plugin = plugins["exactly_once"]
    assert plugin["source"].startswith("airflow-provider-exactly-once==")  # from the package's entry point
    assert "exactly_once_provider.plugins.plugin:ExactlyOncePlugin" in plugin["source"]
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/exactly-once"]
    assert [(v["href"], v["url_route"], v["destination"]) for v in plugin["external_views"]] == [
        ("exactly-once/", "exactly-once", "nav")
    ]
    assert "already registered" not in result.stdout + result.stderr
