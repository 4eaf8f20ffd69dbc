"""The connection layer against the stack's real servers: TLS settings from the Extra reach the clients.

The stack serves plaintext (securing it is issue 19): a connection that requires TLS must be refused there,
and one that does not must still work -- which proves the Extra reaches the client library and is honoured.
"""

from __future__ import annotations

import json

import psycopg2
import pymysql
import pytest

from exactly_once_provider.connections import connect_kwargs, kafka_client_config, spark_kafka_options
from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.kafka.lag import stable_end_offsets


def _mysql(monkeypatch, stack, conn_id: str, extra: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "mysql", "host": stack.HOST, "port": stack.MARIADB_PORT, "login": stack.DB_USER,
         "password": stack.DB_PASSWORD, "schema": stack.DB_NAME, "extra": extra}))


def test_mysql_connection_requiring_tls_is_refused_by_a_plaintext_server(stack, monkeypatch):
    _mysql(monkeypatch, stack, "mysql_tls_required", {"ssl_mode": "REQUIRED"})
    with pytest.raises(SourceConfigurationError, match="require encryption .* not encrypted"):
        MySqlSourceHook("mysql_tls_required").server_info()
    _mysql(monkeypatch, stack, "mysql_tls_preferred", {"ssl_mode": "PREFERRED"})
    assert MySqlSourceHook("mysql_tls_preferred").server_info().is_mariadb


def test_binlog_reader_settings_carry_tls(stack, monkeypatch):
    _mysql(monkeypatch, stack, "mysql_tls_ca", {"ssl": {"ca": "/nonexistent/ca.pem"}})
    settings = MySqlSourceHook("mysql_tls_ca").connection_settings().replication_settings()
    assert settings["ssl"] == {"ca": "/nonexistent/ca.pem", "verify_mode": True, "check_hostname": False}
    with pytest.raises(FileNotFoundError):  # PyMySQL loads the CA: the setting reached the client
        pymysql.connect(**settings)


def test_postgres_extras_reach_psycopg2(stack, airflow_connections, monkeypatch):
    body = json.loads(airflow_connections["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    monkeypatch.setenv("AIRFLOW_CONN_PG_TLS_REQUIRED", json.dumps({**body, "extra": {"sslmode": "require"}}))
    monkeypatch.setenv("AIRFLOW_CONN_PG_TLS_OFF", json.dumps(
        {**body, "extra": {"sslmode": "disable", "application_name": "eo-connections-test"}}))
    with pytest.raises(psycopg2.OperationalError, match="SSL"):
        psycopg2.connect(**connect_kwargs("pg_tls_required", connect_timeout=10))
    with psycopg2.connect(**connect_kwargs("pg_tls_off")) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_setting('application_name')")
        assert cur.fetchone()[0] == "eo-connections-test"
    conn.close()


def test_kafka_clients_take_the_whole_connection(stack, airflow_connections):
    config = kafka_client_config("kafka_default")
    assert config["bootstrap.servers"] == f"{stack.HOST}:{stack.KAFKA_PORT}"
    assert stable_end_offsets(config, ["eo-connections-missing"], missing_ok=True) == {}


def test_the_java_kafka_client_accepts_the_mapped_sasl_ssl_options(spark, tmp_path):
    """Spark's Kafka source gets these options: the real Java client parses the JAAS line and loads the CA."""
    import subprocess

    ca = tmp_path / "ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=eo-test",
                    "-keyout", str(tmp_path / "ca.key"), "-out", str(ca)], check=True, capture_output=True)
    password = 'p"w\\MARKER'
    options = spark_kafka_options({"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_SSL",
                                   "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "eo",
                                   "sasl.password": password, "ssl.ca.location": str(ca)})
    jvm = spark.sparkContext._jvm
    entry = jvm.org.apache.kafka.common.security.JaasConfig(
        "KafkaClient", options["kafka.sasl.jaas.config"]).getAppConfigurationEntry("KafkaClient")[0]
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
