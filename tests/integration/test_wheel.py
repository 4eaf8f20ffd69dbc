"""The wheel a user pip-installs holds the whole provider, templates included, and builds both DAG templates.

The wheel is built the way a release is (``uv build``: an sdist, then the wheel from that sdist) from a copy
of what a fresh clone holds, and installed with its dependencies (pinned by constraints.txt, so uv links
them from its cache) into a clean venv that knows nothing of this checkout. No services are needed; the
test is slow (about a minute: the install of Airflow and Spark into the venv).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.packaging_support import PACKAGE, REPO, clean_copy, shipped_modules

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(400)]

UV = str(Path(sys.executable).parent / "uv")

# Builds both templates with minimal arguments (no connection is read while a DAG is built) and prints their
# shape. Run in the wheel's venv and, for comparison, in this checkout's.
BUILD_TEMPLATES = r"""
import json, sys
import pendulum
import exactly_once_provider.templates as templates
from exactly_once_provider.templates.history_stream import history_stream_dag
from exactly_once_provider.templates.settlement import settlement_dag

start = pendulum.datetime(2026, 1, 1, tz="UTC")
dags = [
    history_stream_dag(dag_id="wheel_history", schema="shop", table="orders", key_column="id", pipeline="w1",
                       table_path="/nonexistent/table",
                       checkpoint_location="/nonexistent/ck1", start_date=start),
    settlement_dag(dag_id="wheel_settlement", table="payments", cursor_column="updated_at", group_by=["currency"],
                   sum_columns=["amount"], pipeline="w2", topic="w2-topic", sink_path="/nonexistent/windows",
                   checkpoint_location="/nonexistent/ck2", report_table="wheel_report", start_date=start),
]
print(json.dumps({
    "templates": templates.__file__,
    "dags": {dag.dag_id: {"tasks": {t.task_id: type(t).__module__ + "." + type(t).__qualname__
                                    for t in dag.tasks},
                          "edges": sorted([t.task_id, d] for t in dag.tasks for d in t.downstream_task_ids)}
             for dag in dags},
}))
"""

# The example DAG files of dags/ (they import the templates from the package) parse against the wheel.
LOAD_EXAMPLES = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({"dags": sorted(bag.dag_ids), "errors": bag.import_errors}))
"""


def _run(*cmd: str, **kwargs) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result.stdout


def _json_line(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = clean_copy(work / "clone")
    _run(UV, "build", "--quiet", "--out-dir", str(work / "dist"), str(source))
    (built,) = (work / "dist").glob("*.whl")
    return built


@pytest.fixture(scope="module")
def wheel_venv(wheel, tmp_path_factory):
    """A clean venv with the wheel and its dependencies; returns its python and an env for running it."""
    work = tmp_path_factory.mktemp("wheel_venv")
    venv = work / "venv"
    _run(UV, "venv", "--quiet", "-p", sys.executable, str(venv))
    python = str(venv / "bin" / "python")
    install = [UV, "pip", "install", "--quiet", "-p", python, "-c", str(REPO / "constraints.txt"), str(wheel)]
    # Offline first: setup put every dependency in uv's cache. Online, an index that answers without caching
    # headers makes uv fetch pyspark's 470 MB sdist again and build it anew (1.4 GB of cache, a minute) each time.
    if subprocess.run([*install, "--offline"], capture_output=True).returncode != 0:
        _run(*install)
    home = work / "airflow"
    home.mkdir()
    # Nothing of this checkout or of the test's own environment (PYTHONPATH, AIRFLOW_*, connections).
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AIRFLOW", "PYTHON", "EO_", "VIRTUAL_ENV"))
    }
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PATH": f"{venv / 'bin'}:{env.get('PATH', '')}",
        }
    )
    yield {"python": python, "venv": venv, "env": env, "cwd": str(work)}
    shutil.rmtree(venv, ignore_errors=True)  # 1.3 GB of links into uv's cache; pytest keeps old tmp dirs


def test_wheel_holds_every_module_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    expected = shipped_modules()
    for module in (
        "hooks/kafka_producer.py",
        "operators/spark_stream.py",
        "plugins/plugin.py",
        "templates/history_stream.py",
        "templates/settlement.py",
        "triggers/consumer_lag.py",
    ):
        assert f"{PACKAGE}/{module}" in expected  # guards the derivation from setup.cfg itself
    assert {n for n in names if n.endswith(".py")} == set(expected)
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {PACKAGE}
    assert f"provider_info = {PACKAGE}.provider_info:get_provider_info" in entry_points
    assert f"exactly_once = {PACKAGE}.plugins.plugin:ExactlyOncePlugin" in entry_points


def test_templates_build_from_the_installed_wheel(wheel_venv):
    # -I: isolated, so neither the working directory nor PYTHONPATH can put this checkout on sys.path.
    installed = _json_line(
        _run(wheel_venv["python"], "-I", "-c", BUILD_TEMPLATES, env=wheel_venv["env"], cwd=wheel_venv["cwd"])
    )
    assert installed["templates"].startswith(str(wheel_venv["venv"])), installed["templates"]
    assert "site-packages" in installed["templates"]

    history = installed["dags"]["wheel_history"]["tasks"]
    assert {"preflight", "full_load", "capture", "apply", "reconcile"} <= set(history)
    settlement = installed["dags"]["wheel_settlement"]["tasks"]
    assert {"extract_window", "load_window", "reconcile_window", "settlement_report"} <= set(settlement)
    assert all(
        path.startswith(PACKAGE)
        for path in [*history.values(), *settlement.values()]
        if not path.startswith("airflow.")
    )

    # The same DAGs as the checkout builds: the wheel ships the templates as they are here.
    from_checkout = _json_line(
        _run(
            sys.executable,
            "-c",
            BUILD_TEMPLATES,
            cwd=REPO,
            env={**os.environ, "AIRFLOW_HOME": wheel_venv["env"]["AIRFLOW_HOME"]},
        )
    )
    assert installed["dags"] == from_checkout["dags"]


def test_example_dags_parse_against_the_installed_wheel(wheel_venv):
    loaded = _json_line(
        _run(
            wheel_venv["python"],
            "-I",
            "-c",
            LOAD_EXAMPLES,
            str(REPO / "dags"),
            env=wheel_venv["env"],
            cwd=wheel_venv["cwd"],
        )
    )
    assert loaded["errors"] == {}
    assert {"eo_history_stream", "eo_settlement"} <= set(loaded["dags"])


def test_airflow_in_the_venv_finds_the_provider_and_its_plugin(wheel_venv):
    airflow = str(wheel_venv["venv"] / "bin" / "airflow")
    providers = _run(
        airflow,
        "providers",
        "get",
        "airflow-provider-exactly-once",
        "-o",
        "json",
        env=wheel_venv["env"],
        cwd=wheel_venv["cwd"],
    )
    assert "airflow-provider-exactly-once" in providers
    plugins = _run(airflow, "plugins", "-o", "json", env=wheel_venv["env"], cwd=wheel_venv["cwd"])
    assert '"exactly_once"' in plugins
