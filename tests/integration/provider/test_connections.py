"""The connection layer against the stack's real servers: TLS settings from the Extra reach the clients.

The stack's servers offer TLS and also admit the development user in plaintext: a connection that asks for TLS
gets an encrypted session and one that disables it gets a plaintext one -- which proves the Extra reaches the
client library and is honoured. (A plaintext server under a connection that requires TLS is refused:
tests/unit/provider/source/test_snapshot.py.)
"""

from __future__ import annotations

import json

import psycopg2
import pymysql
import pytest

from exactly_once_provider.connections import connect_kwargs
from exactly_once_provider.hooks.kafka_client import kafka_client_config
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.kafka.lag import group_offsets, stable_end_offsets
from exactly_once_provider.kafka_config import spark_kafka_options
from tests.kafka_support import new_topic


def _mysql(monkeypatch, stack, conn_id: str, extra: dict) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps(
            {
                "conn_type": "mysql",
                "host": stack.HOST,
                "port": stack.MARIADB_PORT,
                "login": stack.DB_USER,
                "password": stack.DB_PASSWORD,
                "schema": stack.DB_NAME,
                "extra": extra,
            }
        ),
    )


def _mysql_cipher(conn_id: str) -> str:
    with MySqlSourceHook(conn_id).cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        return cur.fetchone()[1]


def test_mysql_tls_settings_decide_whether_the_session_is_encrypted(stack, monkeypatch):
    _mysql(monkeypatch, stack, "mysql_tls_required", {"ssl_mode": "REQUIRED"})
    _mysql(
        monkeypatch,
        stack,
        "mysql_tls_verified",
        {"ssl": {"ca": str(stack.tls_files()["ca.pem"])}, "ssl_mode": "VERIFY_IDENTITY"},
    )
    _mysql(monkeypatch, stack, "mysql_tls_off", {"ssl_mode": "DISABLED"})
    _mysql(monkeypatch, stack, "mysql_tls_true", {"ssl": True})  # mysqlclient's ssl=True: REQUIRED
    assert _mysql_cipher("mysql_tls_required") and _mysql_cipher("mysql_tls_verified")
    assert _mysql_cipher("mysql_tls_true")
    assert _mysql_cipher("mysql_tls_off") == ""


def test_binlog_reader_settings_carry_tls(stack, monkeypatch):
    _mysql(monkeypatch, stack, "mysql_tls_ca", {"ssl": {"ca": "/nonexistent/ca.pem"}})
    settings = MySqlSourceHook("mysql_tls_ca").connection_settings().replication_settings()
    assert settings["ssl"] == {"ca": "/nonexistent/ca.pem", "verify_mode": True, "check_hostname": False}
    with pytest.raises(FileNotFoundError):  # PyMySQL loads the CA: the setting reached the client
        pymysql.connect(**settings)


def test_postgres_extras_reach_psycopg2(stack, airflow_connections, monkeypatch):
    body = json.loads(airflow_connections["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    monkeypatch.setenv("AIRFLOW_CONN_PG_TLS_REQUIRED", json.dumps({**body, "extra": {"sslmode": "require"}}))
    monkeypatch.setenv(
        "AIRFLOW_CONN_PG_TLS_OFF",
        json.dumps({**body, "extra": {"sslmode": "disable", "application_name": "eo-connections-test"}}),
    )
    applications = {}
    for conn_id, encrypted in (("pg_tls_required", True), ("pg_tls_off", False), ("postgres_default", True)):
        conn = psycopg2.connect(**connect_kwargs(conn_id, connect_timeout=10))
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT ssl, current_setting('application_name') FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                )
                ssl, applications[conn_id] = cur.fetchone()
        finally:
            conn.close()
        assert ssl is encrypted, conn_id
    assert applications["pg_tls_off"] == "eo-connections-test"


def test_kafka_clients_take_the_whole_connection(stack, airflow_connections):
    config = kafka_client_config("kafka_default")
    assert config["bootstrap.servers"] == f"{stack.HOST}:{stack.KAFKA_SECURE_PORT}"
    assert (config["security.protocol"], config["sasl.username"]) == ("SASL_SSL", stack.DB_USER)
    assert stable_end_offsets(config, ["eo-connections-missing"], missing_ok=True) == {}


def test_the_lag_sensors_clients_connect_as_the_writer_does(stack):
    """The lag sensor's admin and consumer take the whole connection (kafka_config.DROPPED): a TLS connection
    that trusts the broker by enable.ssl.certificate.verification=false, not by a CA, reaches the brokers. An
    allow-list of bootstrap.servers/security./sasl./ssl. dropped that setting, and the certificate check failed."""
    config = {k: v for k, v in stack.kafka_secure_client_config().items() if k != "ssl.ca.location"}
    config.update(
        {
            "enable.ssl.certificate.verification": "false",
            "client.id": "eo-lag-sensor-test",
            "linger.ms": 5,  # a producer setting, left out of the readers
            "group.id": "eo-not-the-readers-group",  # every reader uses its own
        }
    )
    topic = new_topic(f"{stack.HOST}:{stack.KAFKA_PORT}", prefix="eo-lag-clients")
    assert stable_end_offsets(config, [topic], timeout=10) == {topic: {0: 0}}
    assert group_offsets(config, "eo-lag-clients-group", [topic], timeout=10) == {topic: {0: -1001}}


def test_the_java_kafka_client_accepts_the_mapped_sasl_ssl_options(spark, tmp_path):
    """Spark's Kafka source gets these options: the real Java client parses the JAAS line and loads the CA."""
    import subprocess

    ca = tmp_path / "ca.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=eo-test",
            "-keyout",
            str(tmp_path / "ca.key"),
            "-out",
            str(ca),
        ],
        check=True,
        capture_output=True,
    )
    password = 'p"w\\MARKER'
    options = spark_kafka_options(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "eo",
            "sasl.password": password,
            "ssl.ca.location": str(ca),
        }
    )
    jvm = spark.sparkContext._jvm
    entry = jvm.org.apache.kafka.common.security.JaasConfig(
        "KafkaClient", options["kafka.sasl.jaas.config"]
    ).getAppConfigurationEntry("KafkaClient")[0]
    assert entry.getLoginModuleName() == "org.apache.kafka.common.security.scram.ScramLoginModule"
    assert (entry.getOptions().get("username"), entry.getOptions().get("password")) == ("eo", password)
    props = jvm.java.util.Properties()
    for key, value in options.items():
        props.setProperty(key.removeprefix("kafka."), value)
    for key in ("key.deserializer", "value.deserializer"):
        props.setProperty(key, "org.apache.kafka.common.serialization.ByteArrayDeserializer")
    # The constructor builds the SASL_SSL channel: it logs in (SCRAM) and loads the PEM truststore; no broker needed.
    jvm.org.apache.kafka.clients.consumer.KafkaConsumer(props).close()
    props.setProperty("ssl.truststore.location", str(tmp_path / "missing.pem"))
    with pytest.raises(Exception, match="missing.pem"):  # proof the constructor does load it
        jvm.org.apache.kafka.clients.consumer.KafkaConsumer(props)
