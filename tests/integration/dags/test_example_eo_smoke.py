"""Airflow itself: the provider is registered and ``airflow dags test`` runs the smoke DAG on the stack."""

from __future__ import annotations

import json
import re


def test_provider_is_registered(airflow_cli):
    result = airflow_cli("providers", "get", "airflow-provider-exactly-once", "--output", "json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    info = info[0] if isinstance(info, list) else info
    assert info["Provider"] == "airflow-provider-exactly-once"
    from exactly_once_provider import __version__

    assert info["Version"] == __version__


def test_full_provider_info_lists_the_hook_modules(airflow_cli):
    result = airflow_cli("providers", "get", "airflow-provider-exactly-once", "--full", "--output", "json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)[0]
    modules = [module for hook in info["hooks"] for module in hook["python-modules"]]
    assert "exactly_once_provider.hooks.mysql_source" in modules


def test_smoke_dag_runs_against_mariadb(airflow_cli, stack):
    result = airflow_cli("dags", "test", "eo_smoke")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    match = re.search(r"Snapshot position on mariadb \S+: (binlog\.\d+):(\d+)", output)
    assert match, output[-5000:]
    assert "Binlog file " + match.group(1) + " is retained." in output
    # The run and both of its tasks succeeded (not merely "success" somewhere in the output).
    assert re.search(r"DagRun Finished: dag_id=eo_smoke, .*, state=success,", output), output[-5000:]
    assert len(re.findall(r"Task instance state updated .* new_state=success", output)) == 2, output[-5000:]
    # Credentials come from connections and never reach a log line.
    assert stack.DB_PASSWORD not in output
