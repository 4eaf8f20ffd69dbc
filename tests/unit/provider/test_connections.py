"""The one connection layer: Airflow connections -> Kafka, MySQL and PostgreSQL client settings, TLS included."""

from __future__ import annotations

import json
import os
import stat
from urllib.parse import parse_qs, urlsplit

import pytest

from exactly_once_provider.connections import (
    connect_kwargs,
    connectorx_tls_query,
    libpq_environment,
    mysql_connect_kwargs,
    pymysql_tls,
    read_secret_file,
    write_secret_file,
)
from exactly_once_provider.kafka_config import portable_kafka_config, spark_kafka_options
from exactly_once_provider.source.native_reader import connection_url
from exactly_once_provider.source.snapshot import ConnectionSettings

SASL_SSL_SCRAM = {
    "bootstrap.servers": "b1:9093,b2:9093",
    "security.protocol": "sasl_ssl",
    "sasl.mechanisms": "SCRAM-SHA-512",
    "sasl.username": "eo",
    "sasl.password": 'p"w\\MARKER',
    "ssl.ca.location": "/etc/eo/ca.pem",
    "client.id": "eo-client",
    "linger.ms": 5,
    "group.id": "g",
    "error_cb": print,
}


def _conn(monkeypatch, conn_id: str, body: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))


# ------------------------------------------------------------------------------------------------ Kafka


# The connection's reading itself: tests/unit/hooks/test_kafka_client.py.


def test_sasl_ssl_scram_maps_to_the_java_clients_options():
    assert spark_kafka_options(SASL_SSL_SCRAM) == {
        "kafka.bootstrap.servers": "b1:9093,b2:9093",
        "kafka.client.id": "eo-client",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="eo" password="p\\"w\\\\MARKER";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/etc/eo/ca.pem",
    }


def test_plain_mtls_and_plaintext_map_too():
    plain = spark_kafka_options(
        {
            "bootstrap.servers": "b:9092",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "x",
        }
    )
    assert plain["kafka.sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule ")
    mtls = spark_kafka_options(
        {
            "bootstrap.servers": "b:9093",
            "security.protocol": "SSL",
            "ssl.keystore.location": "/k.p12",
            "ssl.keystore.password": "kp",
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    assert mtls["kafka.ssl.keystore.type"] == "PKCS12" and mtls["kafka.ssl.keystore.password"] == "kp"
    assert mtls["kafka.ssl.endpoint.identification.algorithm"] == ""
    assert spark_kafka_options({"bootstrap.servers": "b:9092"}) == {
        "kafka.bootstrap.servers": "b:9092",
        "kafka.security.protocol": "PLAINTEXT",
    }


@pytest.mark.parametrize(
    "extra, setting",
    [
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism='GSSAPI'"),
        ({"security.protocol": "SASL_SSL"}, "sasl.mechanism='GSSAPI'"),  # librdkafka's default mechanism
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "sasl.mechanism='OAUTHBEARER'"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u"}, "sasl.password"),
        (
            {"security.protocol": "SSL", "ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem"},
            "ssl.certificate.location",
        ),
        (
            {"security.protocol": "SSL", "enable.ssl.certificate.verification": "false"},
            "enable.ssl.certificate.verification",
        ),
        ({"socket.keepalive.enable": True}, "socket.keepalive.enable"),
        ({"security.protocol": "PLAINTEXT", "sasl.username": "u"}, "sasl"),
    ],
)
def test_settings_the_java_client_cannot_take_are_refused_by_name(extra, setting):
    with pytest.raises(ValueError, match=setting.replace(".", r"\.").replace("(", r"\(")):
        spark_kafka_options({"bootstrap.servers": "b:9093", **extra})


def test_portable_config_drops_observability_callbacks_only():
    assert portable_kafka_config(SASL_SSL_SCRAM) == {k: v for k, v in SASL_SSL_SCRAM.items() if k != "error_cb"}
    with pytest.raises(ValueError, match="oauth_cb"):
        portable_kafka_config({"bootstrap.servers": "b", "oauth_cb": print})


def test_secret_file_is_0600_and_refused_when_others_may_read_it(tmp_path):
    path = write_secret_file(str(tmp_path), {"kafka": {"sasl.password": "MARKER"}})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_secret_file(path) == {"kafka": {"sasl.password": "MARKER"}}
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="readable by others"):
        read_secret_file(path)


# ------------------------------------------------------------------------------------------------ MySQL


def test_mysql_tls_extras_reach_mysqlclient_pymysql_and_connectorx(monkeypatch):
    _conn(
        monkeypatch,
        "mysql_tls",
        {
            "conn_type": "mysql",
            "host": "db",
            "login": "u",
            "password": "MARKER",
            "schema": "s",
            "extra": {"ssl": json.dumps({"ca": "/ca.pem"}), "ssl_mode": "verify_identity"},
        },
    )
    kwargs = mysql_connect_kwargs("mysql_tls")
    assert kwargs == {
        "host": "db",
        "port": 3306,
        "user": "u",
        "passwd": "MARKER",
        "db": "s",
        "connect_timeout": 10,
        "ssl": {"ca": "/ca.pem"},
        "ssl_mode": "VERIFY_IDENTITY",
    }
    assert pymysql_tls(kwargs["ssl"], kwargs["ssl_mode"]) == {
        "ssl": {"ca": "/ca.pem", "verify_mode": True, "check_hostname": True}
    }
    settings = ConnectionSettings("db", 3306, "u", "MARKER", "s", ssl={"ca": "/ca.pem"}, ssl_mode="VERIFY_IDENTITY")
    assert settings.replication_settings()["ssl"]["check_hostname"] is True
    query = parse_qs(urlsplit(connection_url(settings)).query)
    assert (query["ssl-mode"], query["ssl-ca"]) == (["VERIFY_IDENTITY"], ["/ca.pem"])


def test_mysql_tls_modes():
    assert pymysql_tls(None, None) == {} and connectorx_tls_query(None, None) == {}
    assert pymysql_tls(None, "DISABLED") == {"ssl_disabled": True}
    assert pymysql_tls(None, "REQUIRED") == {"ssl": {"verify_mode": False, "check_hostname": False}}
    assert pymysql_tls({"ca": "/ca"}, None)["ssl"]["verify_mode"] is True  # a CA alone is verified, as mysqlclient
    assert connectorx_tls_query({"ca": "/ca"}, None) == {"ssl-mode": "VERIFY_CA", "ssl-ca": "/ca"}
    with pytest.raises(ValueError, match="ssl.cert"):
        connectorx_tls_query({"cert": "/c", "key": "/k"}, "REQUIRED")


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"ssl_mode": "sometimes"}, "ssl_mode='sometimes'"),
        ({"ssl": {"ca": "/ca", "verify": True}}, "ssl key 'verify'"),
        ({"ssl": ["/ca.pem"]}, "Extra ssl=\\['/ca.pem'\\]"),
        ({"iam": True}, "'iam'"),
        ({"unix_socket": "/run/mysqld/mysqld.sock"}, "'unix_socket'"),
        ({"client": "mysql-connector-python"}, "client='mysql-connector-python'"),
    ],
)
def test_mysql_extras_the_readers_cannot_honour_are_refused(monkeypatch, extra, message):
    _conn(monkeypatch, "mysql_bad", {"conn_type": "mysql", "host": "db", "extra": extra})
    with pytest.raises(ValueError, match=f"'mysql_bad'.*{message}"):
        mysql_connect_kwargs("mysql_bad")


def test_a_mysql_connection_without_host_is_refused(monkeypatch):
    # MySqlHook would take "localhost", which mysqlclient reads as its Unix socket: the readers connect over TCP.
    _conn(monkeypatch, "mysql_no_host", {"conn_type": "mysql", "login": "u"})
    with pytest.raises(ValueError, match="'mysql_no_host' has no host"):
        mysql_connect_kwargs("mysql_no_host")


# ------------------------------------------------------------------------------------------------ PostgreSQL


def test_full_connection(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_PG_FULL",
        json.dumps(
            {"conn_type": "postgres", "host": "db", "port": 5433, "login": "u", "password": "s3cret", "schema": "d"}
        ),
    )
    assert connect_kwargs("pg_full", connect_timeout=10) == {
        "host": "db",
        "port": 5433,
        "dbname": "d",
        "user": "u",
        "password": "s3cret",
        "connect_timeout": 10,
    }
    assert libpq_environment("pg_full") == {
        "PGHOST": "db",
        "PGPORT": "5433",
        "PGDATABASE": "d",
        "PGUSER": "u",
        "PGPASSWORD": "s3cret",
    }


def test_unset_fields_are_left_to_libpq_defaults(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PG_BARE", json.dumps({"conn_type": "postgres", "host": "db"}))
    assert connect_kwargs("pg_bare") == {"host": "db", "port": None, "dbname": None, "user": None, "password": None}
    assert libpq_environment("pg_bare") == {"PGHOST": "db"}  # the port too: 5432, PGPORT or the Extra service's


def test_postgres_tls_extras_reach_psycopg2_and_the_libpq_environment(monkeypatch):
    _conn(
        monkeypatch,
        "pg_tls",
        {
            "conn_type": "postgres",
            "host": "db",
            "login": "u",
            "password": "MARKER",
            "extra": {
                "sslmode": "verify-full",
                "sslrootcert": "/ca.pem",
                "sslcert": "/c.pem",
                "sslkey": "/k.pem",
                "connect_timeout": 5,
                "cursor": "dictcursor",
                "sqlalchemy_scheme": "postgresql",
            },
        },
    )
    kwargs = connect_kwargs("pg_tls", connect_timeout=10)
    assert {k: kwargs[k] for k in ("sslmode", "sslrootcert", "sslcert", "sslkey")} == {
        "sslmode": "verify-full",
        "sslrootcert": "/ca.pem",
        "sslcert": "/c.pem",
        "sslkey": "/k.pem",
    }
    assert kwargs["connect_timeout"] == 5  # the connection's own setting wins over the caller's default
    assert "cursor" not in kwargs and "sqlalchemy_scheme" not in kwargs  # PostgresHook's options, not libpq's
    env = libpq_environment("pg_tls")
    assert (env["PGSSLMODE"], env["PGSSLROOTCERT"], env["PGSSLCERT"], env["PGSSLKEY"], env["PGCONNECT_TIMEOUT"]) == (
        "verify-full",
        "/ca.pem",
        "/c.pem",
        "/k.pem",
        "5",
    )


def test_postgres_settings_without_an_environment_variable_are_refused_for_the_job(monkeypatch):
    _conn(monkeypatch, "pg_keepalive", {"conn_type": "postgres", "host": "db", "extra": {"keepalives_idle": 30}})
    assert connect_kwargs("pg_keepalive")["keepalives_idle"] == 30
    with pytest.raises(ValueError, match="'pg_keepalive'.*'keepalives_idle'"):
        libpq_environment("pg_keepalive")


def test_a_refusal_no_retry_can_pass_is_decided_at_once_and_an_unreachable_broker_is_waited_for():
    from exactly_once_provider.connections import _decisive_refusal, _kafka_refusal

    config = {"bootstrap.servers": "b:9095", "sasl.username": "eo", "sasl.mechanism": "SCRAM-SHA-512"}
    login = ["sasl_ssl://b:9095/bootstrap: SASL authentication error: Authentication failed during authentication"]
    assert "refused the login of user 'eo'" in _decisive_refusal(config, login)
    certificate = ["SSL handshake failed: error:0A000086:SSL routines::certificate verify failed"]
    assert "not signed by a CA this connection trusts" in _decisive_refusal(config, certificate)
    # a broker that is down or restarting may answer on librdkafka's next try: check_kafka_access keeps waiting
    down = ["b:9095/bootstrap: Connect to ipv4#127.0.0.1:9095 failed: Connection refused"]
    assert _decisive_refusal(config, down) is None
    assert "no broker answers at bootstrap.servers='b:9095'" in _kafka_refusal(config, down, "no answer in 20s")


# ------------------------------------------------------------------------------------- parity with the providers
# Neither provider returns the connect arguments through public API, so ours are written in connections.py; these
# read each connection both ways and compare. The hooks' private methods serve here only as the reference.

# What MySqlHook hands mysqlclient that the product sets itself (utf8mb4, its own cursors).
_MYSQL_HOOK_ONLY = {"charset", "use_unicode", "cursorclass"}

MYSQL_CONNECTIONS = {
    "defaults": {"host": "db"},
    "fields": {"host": "db", "port": 3307, "login": "u", "password": "MARKER", "schema": "s"},
    "ssl-dict": {
        "host": "db",
        "extra": {"ssl": {"ca": "/ca.pem", "cert": "/c.pem", "key": "/k.pem", "cipher": "AES256-SHA"}},
    },
    "ssl-json-text": {"host": "db", "extra": {"ssl": json.dumps({"ca": "/ca.pem", "check_hostname": True})}},
    "ssl-capath-mode": {"host": "db", "extra": {"ssl": {"capath": "/certs"}, "ssl_mode": "VERIFY_CA"}},
    "ssl-true": {"host": "db", "extra": {"ssl": True}},  # mysqlclient: ssl=True is ssl_mode=REQUIRED
    "ssl-false": {"host": "db", "extra": {"ssl": False, "ssl_mode": "DISABLED"}},
    "connect-timeout": {"host": "db", "extra": {"connect_timeout": "3"}},
    "hook-options": {"host": "db", "extra": {"charset": "utf8", "cursor": "SSDictCursor", "ssl_mode": "PREFERRED"}},
}


def _mysql_hook_config(conn_id: str) -> dict:
    from airflow.providers.mysql.hooks.mysql import MySqlHook

    hook = MySqlHook(mysql_conn_id=conn_id)
    return hook._get_conn_config_mysql_client(hook.get_connection(conn_id))


def _as_mysqlclient_takes_it(config: dict) -> dict:
    """Return ``config`` without what only one side sets, in the one form of what mysqlclient reads alike."""
    config = {k: v for k, v in config.items() if k not in _MYSQL_HOOK_ONLY and k != "connect_timeout"}
    config["user"] = config.get("user") or ""  # None and "" both mean libmysqlclient's default user
    if config.get("ssl") is True:
        del config["ssl"]
        config.setdefault("ssl_mode", "REQUIRED")
    return config


@pytest.mark.parametrize("fields", MYSQL_CONNECTIONS.values(), ids=MYSQL_CONNECTIONS)
def test_a_mysql_connection_reads_as_mysqlhook_reads_it(monkeypatch, fields):
    _conn(monkeypatch, "mysql_parity", {"conn_type": "mysql", **fields})
    ours, theirs = mysql_connect_kwargs("mysql_parity"), _mysql_hook_config("mysql_parity")
    assert _as_mysqlclient_takes_it(ours) == _as_mysqlclient_takes_it(theirs)
    # Beyond the hook (it passes no timeout): the Extra's, else 10 seconds.
    assert ours["connect_timeout"] == int(fields.get("extra", {}).get("connect_timeout", 10))
    assert "connect_timeout" not in theirs


def test_a_lower_case_ssl_mode_is_read_as_mysql_clients_read_it(monkeypatch):
    # mysqlclient knows "VERIFY_CA" only (MySqlHook passes the text on, and the connection then fails).
    _conn(monkeypatch, "mysql_mode_case", {"conn_type": "mysql", "host": "db", "extra": {"ssl_mode": "verify-ca"}})
    assert mysql_connect_kwargs("mysql_mode_case")["ssl_mode"] == "VERIFY_CA"


POSTGRES_CONNECTIONS = {
    "defaults": {"host": "db"},
    "fields": {"host": "db", "port": 5433, "login": "u", "password": "MARKER", "schema": "d"},
    "tls": {
        "host": "db",
        "extra": {"sslmode": "verify-full", "sslrootcert": "/ca.pem", "sslcert": "/c.pem", "sslkey": "/k.pem"},
    },
    "libpq": {"host": "db", "extra": {"connect_timeout": 5, "keepalives_idle": 30, "application_name": "eo"}},
    "service": {"extra": {"service": "ledger"}},  # host and port from the service file
    "hook-options": {
        "host": "db",
        "extra": {
            "cursor": "dictcursor",
            "sqlalchemy_scheme": "postgresql",
            "sqlalchemy_query": {"application_name": "x"},
            "aws_conn_id": "aws_x",
            "redshift": False,
            "sslmode": "require",
        },
    },
}


def _postgres_hook_args(monkeypatch, conn_id: str) -> dict:
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    captured: dict = {}
    monkeypatch.setattr(PostgresHook, "_create_connection", lambda self, conn_args: captured.update(conn_args))
    PostgresHook(postgres_conn_id=conn_id).get_conn()
    return captured


def _as_psycopg_takes_it(args: dict) -> dict:
    """Return ``args`` without None (psycopg leaves it out) and the hook's cursor class (the product picks its own)."""
    return {k: v for k, v in args.items() if v is not None and k not in ("cursor_factory", "row_factory")}


@pytest.mark.parametrize("fields", POSTGRES_CONNECTIONS.values(), ids=POSTGRES_CONNECTIONS)
def test_a_postgres_connection_reads_as_postgreshook_reads_it(monkeypatch, fields):
    _conn(monkeypatch, "pg_parity", {"conn_type": "postgres", **fields})
    ours, theirs = connect_kwargs("pg_parity"), _postgres_hook_args(monkeypatch, "pg_parity")
    assert _as_psycopg_takes_it(ours) == _as_psycopg_takes_it(theirs)
    assert ours.keys() >= {"host", "port", "dbname", "user", "password"}


def test_postgres_token_authentication_is_refused(monkeypatch):
    _conn(monkeypatch, "pg_iam", {"conn_type": "postgres", "host": "db", "extra": {"iam": True}})
    with pytest.raises(ValueError, match="'pg_iam'.*'iam'"):
        connect_kwargs("pg_iam")
