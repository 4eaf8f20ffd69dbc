"""Session fixtures: the real local stack, Airflow connections and a throwaway AIRFLOW_HOME.

Unit tests use none of these. Integration tests request ``stack``, which brings the services up if they
are down (reusing a running stack) and FAILS the test when a service cannot be reached: nothing is skipped.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import airflow.sdk.exceptions  # noqa: F401 - see below
import pytest

from tests import profiling
from tests.profiling import pytest_runtest_makereport, pytest_runtest_protocol  # noqa: F401 - its hooks

REPO = Path(__file__).resolve().parents[1]
# Airflow sets up its logging when first imported (above, at collection): a test whose code imports Airflow
# lazily (the Spark drivers run in this process import none, but a sink they open may) would otherwise lose
# caplog's handler mid-test, however the suite is cut.


def _load_stack_module():
    spec = importlib.util.spec_from_file_location("eo_local_stack", REPO / "docker" / "local" / "stack.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


STACK = _load_stack_module()

# Where each test's time goes (make test-profile): the fixed costs are timed into the JUnit XML.
profiling.install(STACK)


def pytest_collection_modifyitems(items):
    """Mark tests by folder so ``-m unit`` / ``-m integration`` / ``-m faults`` select them; order them.

    ``make test`` runs every test but the ``exclusive`` ones (they restart a shared service or change a server
    global: marked one by one) on two xdist workers with ``--dist loadgroup`` and no group marks: each test is
    its own unit, handed to the next free worker in this order. The longest tests (``e2e``, then ``slow``) come
    first, so no worker is left alone with a long test at the end. (xdist 3.8 cannot add a group to a node id
    under pytest 9: ``xdist_group`` marks have no effect here.)
    """
    for item in items:
        parts = Path(item.fspath).relative_to(REPO / "tests").parts
        if parts[0] in ("unit", "integration", "faults"):
            item.add_marker(getattr(pytest.mark, parts[0]))
    rank = {
        id(item): 0 if item.get_closest_marker("e2e") else 1 if item.get_closest_marker("slow") else 2 for item in items
    }
    items.sort(key=lambda item: rank[id(item)])  # stable: the rest keeps the collection order


@pytest.fixture(scope="session")
def stack():
    """The running local stack (Kafka, MariaDB, PostgreSQL; Spark connector jars resolved).

    Every Spark driver JVM the session starts (spark-submit, the operators' hook, pyspark) gets the stack's class
    archive and C1 only through ``SPARK_SUBMIT_OPTS``: it starts in half the CPU time and computes the same.
    """
    STACK.up()
    if "SharedArchiveFile" not in os.environ.get("SPARK_SUBMIT_OPTS", ""):
        os.environ["SPARK_SUBMIT_OPTS"] = " ".join(
            filter(None, [os.environ.get("SPARK_SUBMIT_OPTS"), STACK.spark_test_java_options()])
        )
    return STACK


@pytest.fixture(scope="session")
def airflow_connections(stack):
    """Point Airflow connections (``AIRFLOW_CONN_*``) at the stack for this whole session."""
    env = stack.connection_env()
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory, airflow_connections):
    """A migrated SQLite AIRFLOW_HOME with dags/ as DAG folder; returns the env for ``airflow`` CLI calls."""
    home = tmp_path_factory.mktemp("airflow_home")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }
    migrate = subprocess.run([_airflow(), "db", "migrate"], env=env, capture_output=True, text=True)
    assert migrate.returncode == 0, f"airflow db migrate failed:\n{migrate.stdout}\n{migrate.stderr}"
    return env


def _airflow() -> str:
    return str(Path(sys.executable).parent / "airflow")


@pytest.fixture(scope="session")
def airflow_cli(airflow_home):
    """Run an ``airflow`` CLI command in the session's AIRFLOW_HOME; returns the CompletedProcess."""

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([_airflow(), *args], env=airflow_home, capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture(scope="session")
def spark(stack):
    """A local[2] SparkSession with the Kafka and Delta connectors from the stack's resolved jars; it reaches the
    stack's MinIO through s3a (the jars on the class path, the settings of the test's own session)."""
    from pyspark.sql import SparkSession

    logging.getLogger("py4j").setLevel(logging.WARNING)  # its __del__ logs after pytest closed capture
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("eo-tests")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    )
    for key, value in {**stack.spark_conf(s3=True), **stack.minio_settings().hadoop_conf()}.items():
        builder = builder.config(key, value)
    started = time.monotonic()
    session = builder.getOrCreate()
    profiling.record("spark_session", started, time.monotonic())
    yield session
    session.stop()


@pytest.fixture
def fault_outcome(request):
    """Record a fault scenario's oracle figures (rows, lost, duplicated) for the matrix table.

    Every test in tests/faults calls it once with what its oracle counted. ``make faults-matrix`` sets
    ``EO_FAULT_REPORT`` to a JSON-lines file and prints scenario x runs x rows x lost x duplicated x result;
    without it the call only logs. The test still asserts lost == duplicated == 0 itself.
    """
    import json

    def record(*, rows: int, lost: int, duplicated: int, scenario: str | None = None) -> None:
        line = {
            "scenario": scenario or request.node.name,
            "nodeid": request.node.nodeid,
            "rows": rows,
            "lost": lost,
            "duplicated": duplicated,
            "run": os.environ.get("EO_FAULT_RUN"),
        }
        logging.getLogger("eo.faults").info("fault outcome %s", line)
        path = os.environ.get("EO_FAULT_REPORT")
        if path:
            with open(path, "a", encoding="utf-8") as report:
                report.write(json.dumps(line) + "\n")

    return record
