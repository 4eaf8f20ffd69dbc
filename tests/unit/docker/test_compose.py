"""docker/compose.yaml parses and uses exactly the local stack's settings (ports aside)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, STACK


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())["services"]


def _kafka_env(settings: dict) -> dict:
    return {"KAFKA_" + key.upper().replace(".", "_"): value for key, value in settings.items()}


def test_single_broker_settings_match(compose):
    env = compose["kafka"]["environment"]
    assert _kafka_env(STACK.KAFKA_SINGLE_NODE_SETTINGS).items() <= env.items()
    assert env["KAFKA_HEAP_OPTS"] == f"-Xms{STACK.KAFKA_HEAP} -Xmx{STACK.KAFKA_HEAP}"
    assert compose["kafka"]["image"] == f"apache/kafka:{STACK.kafka_version()}"


def test_cluster_settings_match(compose):
    nodes = [compose[f"kafka-{i}"] for i in (1, 2, 3)]
    for index, node in enumerate(nodes, start=1):
        env = node["environment"]
        assert _kafka_env(STACK.KAFKA_CLUSTER_SETTINGS).items() <= env.items()
        assert env["KAFKA_NODE_ID"] == str(index)
        assert env["KAFKA_HEAP_OPTS"] == f"-Xms{STACK.KAFKA_CLUSTER_NODE_HEAP} -Xmx{STACK.KAFKA_CLUSTER_NODE_HEAP}"
        assert node["profiles"] == ["kafka-cluster"]


def test_mariadb_settings_match(compose):
    flags = {f"--{key.replace('_', '-')}={value}" for key, value in STACK.MARIADB_SETTINGS.items()}
    assert set(compose["mariadb"]["command"]) == flags
    assert compose["mariadb"]["image"] == "mariadb:10.11"


def test_postgres_settings_match(compose):
    command = compose["postgres"]["command"]
    settings = dict(arg.split("=", 1) for arg in command[2::2])
    assert settings == STACK.POSTGRES_SETTINGS


def test_spark_and_airflow_use_the_provider_image(compose):
    for name in ("spark-master", "spark-worker", "airflow"):
        assert compose[name]["build"]["dockerfile"] == "docker/Dockerfile"
    assert "--memory" in compose["spark-worker"]["command"]
    worker = compose["spark-worker"]["command"]
    assert worker[worker.index("--memory") + 1] == STACK.SPARK_WORKER_MEMORY
    assert worker[worker.index("--cores") + 1] == STACK.SPARK_WORKER_CORES
    assert compose["spark-master"]["environment"]["SPARK_DAEMON_MEMORY"] == STACK.SPARK_DAEMON_MEMORY


def test_airflow_connections_cover_the_local_stack_ones(compose):
    env = compose["airflow"]["environment"]
    local = STACK.connection_env()
    for key in (
        "AIRFLOW_CONN_KAFKA_DEFAULT",
        "AIRFLOW_CONN_MYSQL_DEFAULT",
        "AIRFLOW_CONN_POSTGRES_DEFAULT",
        "AIRFLOW_CONN_SPARK_DEFAULT",
    ):
        assert json.loads(env[key])["conn_type"] == json.loads(local[key])["conn_type"]


def test_dockerfile_installs_with_the_tested_constraints():
    dockerfile = (Path(REPO) / "docker" / "Dockerfile").read_text()
    assert "-c constraints.txt" in dockerfile
    assert "openjdk-17" in dockerfile
