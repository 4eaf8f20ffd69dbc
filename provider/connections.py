"""The one connection layer: Airflow connections -> the settings of every client of the product.

* **Kafka** -- :func:`check_kafka_access`: a connection's settings tried on its brokers, a refusal named with its
  fix. The settings themselves are built in one place,
  :meth:`~exactly_once_provider.hooks.kafka_client.KafkaClientHook.client_config`, and each client role keeps its
  share by the one rule of :mod:`exactly_once_provider.kafka_config`.
* **MySQL/MariaDB** -- :func:`mysql_connect_kwargs`: the ``mysql`` connection read as the MySQL provider's
  ``MySqlHook`` reads it for mysqlclient (Extra ``ssl`` dict, ``ssl_mode``); :func:`pymysql_tls` and
  :func:`connectorx_tls_query` give the same TLS settings to the binlog reader (PyMySQL) and the native reader
  (connectorx).
* **PostgreSQL** -- :func:`connect_kwargs` for ``psycopg2.connect`` in this process, and
  :func:`libpq_environment` (``PG*`` variables) for the Spark job: the ``postgres`` connection read as the
  PostgreSQL provider's ``PostgresHook`` reads it (every Extra key is a libpq parameter: ``sslmode``,
  ``sslrootcert``...).

The MySQL and PostgreSQL readings are written here because neither provider has a public API that returns the
connect arguments: ``MySqlHook`` builds them in a private method (``_get_conn_config_mysql_client``),
``PostgresHook`` inside ``get_conn``, which connects (and may fetch a cloud token first). The unit tests read
connections both ways, through those hooks, and compare (``tests/unit/provider/test_connections.py``); ours
differ only where the product must: TCP always, no token authentication, its own charset and cursors, and a
MySQL ``connect_timeout``.

Secrets reach a Spark job through its environment (PostgreSQL) or a file only its owner may read
(:func:`write_secret_file`, Kafka), never through a command line or a log line; :data:`SPARK_REDACTION_REGEX`
keeps them out of Spark's UI and event log should one be echoed there.

Airflow is imported inside the functions that read connections: the Spark driver imports this module for
:func:`read_secret_file` only.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from exactly_once_provider.kafka_config import admin_config

# ------------------------------------------------------------------------------------------------ Kafka

# Spark redacts a configuration entry or data source option whose key OR value matches (Utils.redact):
# Spark's default pattern plus the Kafka client's secret-bearing settings (the JAAS line holds the password).
SPARK_REDACTION_REGEX = r"(?i)secret|password|passwd|token|access[.]?key|jaas|sasl[.]|ssl[.].*(key|password)"


def check_kafka_access(config: dict[str, Any], kafka_config_id: str, timeout: float = 20.0) -> Any:
    """Reach the brokers with a connection's settings; when they refuse, raise an error that says what to fix.

    librdkafka reports a wrong password, an untrusted broker certificate or a plaintext client on a TLS listener
    only as "Broker transport failure" after its timeout, with the cause in its error callback and log lines:
    this reads them and names the cause. One metadata request when everything is right.

    :param config: the connection's confluent-kafka settings
        (:meth:`~exactly_once_provider.hooks.kafka_client.KafkaClientHook.client_config`); the admin client
        keeps what :func:`~exactly_once_provider.kafka_config.admin_config` keeps.
    :param kafka_config_id: the connection id, for the message.
    :param timeout: seconds to wait for the brokers.
    :return: the connected AdminClient, for the caller's next admin requests (no second handshake).
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from exactly_once_provider.errors import ServiceAccessError

    causes: list[str] = []
    admin = AdminClient(
        {**admin_config(config), "error_cb": lambda err: causes.append(err.str()), "logger": _CollectingLogger(causes)}
    )
    # not list_topics(): a full listing costs what the cluster holds (provider/kafka/topics.py)
    answer = admin.describe_cluster(request_timeout=timeout)
    deadline = time.monotonic() + timeout + 5
    while True:
        try:
            answer.result(0.2)
            return admin
        except KafkaException as err:
            failure = err.args[0].str()
            break
        except concurrent.futures.TimeoutError:
            if time.monotonic() > deadline:
                failure = f"no answer in {timeout:.0f}s"
                break
        admin.poll(0)  # deliver the error callbacks and log lines that name the cause
        # A refused login or certificate will not pass on a retry: say so now, not after librdkafka's timeout.
        refusal = _decisive_refusal(config, causes)
        if refusal:
            raise ServiceAccessError(f"Kafka connection {kafka_config_id!r}: {refusal}")
    admin.poll(0.5)
    raise ServiceAccessError(f"Kafka connection {kafka_config_id!r}: {_kafka_refusal(config, causes, failure)}")


def kafka_authorization_error(err: Any, kafka_config_id: str, config: dict[str, Any], what: str) -> Any:
    """Return the :class:`~exactly_once_provider.errors.ServiceAccessError` for a Kafka authorization failure.

    Returns None when ``err`` (a ``KafkaError``) is not one: the caller re-raises the original.

    :param err: the client's error.
    :param kafka_config_id: the connection id, for the message.
    :param config: the connection's settings (for the user name).
    :param what: the resource the call needed, e.g. ``"Write on topic 't' and transactional id 'x'"``.
    """
    from confluent_kafka import KafkaError

    from exactly_once_provider.errors import ServiceAccessError

    denied = {
        KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
        KafkaError.GROUP_AUTHORIZATION_FAILED: "consumer group",
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
        KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    }
    code = err.code() if hasattr(err, "code") else None
    if code not in denied:
        return None
    user = config.get("sasl.username") or "the connection's principal"
    return ServiceAccessError(
        f"Kafka connection {kafka_config_id!r}: user {user!r} has no ACL on the {denied[code]} this task needs "
        f"({what}); the broker answered {err.name()}. Grant the principal User:{user} those operations "
        "(kafka-acls --add --allow-principal ...), or use a connection whose user has them."
    )


@contextmanager
def explain_kafka_denials(kafka_config_id: str, config: dict[str, Any], what: str) -> Iterator[None]:
    """Turn the broker's authorization failures inside the block into an error naming the connection and the ACLs.

    Any other error passes unchanged.

    :param kafka_config_id: the connection id, for the message.
    :param config: the connection's settings (for the user name).
    :param what: the operations the block needs, e.g. ``"Create and Describe on topic 't'"``.
    """
    try:
        yield
    except Exception as exc:
        error = getattr(exc, "error", None) or (exc.args[0] if exc.args else None)
        denied = kafka_authorization_error(error, kafka_config_id, config, what)
        if denied is None:
            raise
        raise denied from None


class _CollectingLogger(logging.Logger):
    """A librdkafka ``logger`` that keeps the lines (they name TLS and SASL causes) instead of printing them."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("exactly_once_provider.kafka_access")
        self._lines = lines

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        self._lines.append(str(msg) % args if args else str(msg))


def _kafka_refusal(config: dict[str, Any], causes: list[str], failure: str) -> str:
    decisive = _decisive_refusal(config, causes)
    if decisive:
        return decisive
    text = " ".join(causes)
    if "Connection refused" in text or "resolve" in text.lower():
        return (
            f"no broker answers at bootstrap.servers={config.get('bootstrap.servers')!r} "
            f"({_last_cause(causes)}). Check the address and that the cluster is up."
        )
    return f"the brokers cannot be reached ({failure}; {_last_cause(causes) or 'no further detail'})."


def _decisive_refusal(config: dict[str, Any], causes: list[str]) -> str | None:
    """The fix for a refusal that no retry can pass (login, certificate, TLS or protocol), or None."""
    text = " ".join(causes)
    protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
    user = config.get("sasl.username")
    if "SASL authentication error" in text or "Authentication failed" in text:
        return (
            f"the brokers refused the login of user {user!r} ({config.get('sasl.mechanism', 'SASL')}: invalid "
            "credentials). Fix sasl.username/sasl.password in the connection's Extra, or create the user on "
            "the cluster."
        )
    if "certificate verify failed" in text:
        return (
            "the broker's TLS certificate is not signed by a CA this connection trusts (certificate verify "
            f"failed; ssl.ca.location={config.get('ssl.ca.location')!r}). Put the CA that signed the brokers' "
            "certificates in ssl.ca.location."
        )
    if "SSL" in text and "handshake" in text.lower():
        return (
            f"the TLS handshake with the brokers failed ({_last_cause(causes)}). Check the connection's ssl.* settings."
        )
    if "APIVERSION_QUERY" in text and "closed by peer" in text and protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        return (
            f"the brokers closed the connection at the first request: their listener expects another protocol "
            f"than security.protocol={protocol} (TLS or SASL?). Set security.protocol (e.g. SASL_SSL) and the "
            "matching sasl.*/ssl.* settings in the connection's Extra."
        )
    return None


def _last_cause(causes: list[str]) -> str:
    return next((cause for cause in reversed(causes) if "brokers are down" not in cause), "")


def _bool(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def spark_redaction_regex(user_regex: str | None = None) -> str:
    """Return ``spark.redaction.regex`` covering the Kafka and database secrets, and ``user_regex`` if set."""
    return f"{user_regex}|{SPARK_REDACTION_REGEX}" if user_regex else SPARK_REDACTION_REGEX


def write_secret_file(directory: str, payload: dict[str, Any], prefix: str = "eo-secrets-") -> str:
    """Write ``payload`` as JSON to a new file in ``directory`` only its owner can read (0600); return its path.

    The caller deletes it when the job that reads it has ended.

    :param directory: where to create the file (the job must be able to read it there).
    :param payload: the settings.
    :param prefix: the file name's prefix.
    """
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".json", dir=directory)  # created 0600, never existed
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle)
    return path


def read_secret_file(path: str) -> dict[str, Any]:
    """Read a file written by :func:`write_secret_file`; refuse it when others may read it.

    :param path: the file.
    """
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"Secrets file {path} is readable by others (mode {oct(mode & 0o777)}): it must be 0600.")
    with open(path) as handle:
        return json.load(handle)


# ------------------------------------------------------------------------------------------------ MySQL

_MYSQL_SSL_MODES = ("DISABLED", "PREFERRED", "REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY")
_MYSQL_SSL_KEYS = ("ca", "capath", "cert", "key", "cipher", "check_hostname")


def mysql_connect_kwargs(mysql_conn_id: str) -> dict[str, Any]:
    """Return the MySQLdb (mysqlclient) connect arguments of the Airflow ``mysql`` connection ``mysql_conn_id``.

    Read as the MySQL provider's ``MySqlHook`` reads a connection for mysqlclient: ``host``, ``port`` (default
    3306), ``user``, ``passwd``, ``db``; Extra ``ssl`` (a dict, or its JSON text: ``ca``, ``cert``, ``key``,
    ``capath``, ``cipher``, ``check_hostname``; ``true``: ``ssl_mode`` ``REQUIRED``), ``ssl_mode``
    (``DISABLED`` ... ``VERIFY_IDENTITY``, any case). Beyond the hook: Extra ``connect_timeout`` (default 10
    seconds; the hook passes none, and an unreachable server would hold a task for the OS's TCP timeout). The
    product sets charset, cursors, time zone and autocommit itself and always connects over TCP; Extras that
    would change that (``iam``, ``unix_socket``, ``client``) are refused, and so is a connection without host
    (the hook's ``localhost`` means the Unix socket to mysqlclient).

    :param mysql_conn_id: the ``mysql`` connection.
    """
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(mysql_conn_id)
    extra = conn.extra_dejson
    if not conn.host:
        raise ValueError(f"Connection {mysql_conn_id!r} has no host; set the MySQL server's host.")
    for refused in ("iam", "unix_socket"):
        if extra.get(refused):
            raise ValueError(
                f"Connection {mysql_conn_id!r}: Extra {refused!r} is not supported by this provider's "
                "readers; remove it."
            )
    if extra.get("client", "mysqlclient") != "mysqlclient":
        raise ValueError(
            f"Connection {mysql_conn_id!r}: Extra client={extra['client']!r}; the readers use "
            "mysqlclient conventions (Extra 'ssl', 'ssl_mode'): remove 'client'."
        )
    kwargs: dict[str, Any] = {
        "host": conn.host,
        "port": int(conn.port or 3306),
        "user": conn.login or "",
        "passwd": conn.password or "",
        "db": conn.schema or "",
        "connect_timeout": int(extra.get("connect_timeout", 10)),
    }
    ssl = extra.get("ssl")
    if isinstance(ssl, str):  # Extra given as URL parameters arrives as text (as MySqlHook handles it)
        ssl = json.loads(ssl)
    if ssl is True:  # mysqlclient (>= 2.2.4) takes ssl=True for ssl_mode=REQUIRED: said as such here
        ssl = None
        kwargs["ssl_mode"] = "REQUIRED"
    if ssl:
        if not isinstance(ssl, dict):
            raise ValueError(
                f"Connection {mysql_conn_id!r}: Extra ssl={ssl!r}; give a dict of {', '.join(_MYSQL_SSL_KEYS)} "
                "(or true for ssl_mode REQUIRED)."
            )
        unknown = sorted(set(ssl) - set(_MYSQL_SSL_KEYS))
        if unknown:  # mysqlclient ignores an unknown key: a misspelt "ca" would silently not verify
            raise ValueError(
                f"Connection {mysql_conn_id!r}: Extra ssl key {unknown[0]!r} is unknown; use "
                f"{', '.join(_MYSQL_SSL_KEYS)}."
            )
        kwargs["ssl"] = dict(ssl)
    if extra.get("ssl_mode"):
        # mysqlclient knows the upper-case names only; MySQL's own clients take any case (--ssl-mode=verify_ca)
        mode = str(extra["ssl_mode"]).upper().replace("-", "_")
        if mode not in _MYSQL_SSL_MODES:
            raise ValueError(
                f"Connection {mysql_conn_id!r}: Extra ssl_mode={extra['ssl_mode']!r}; use one of "
                f"{', '.join(_MYSQL_SSL_MODES)}."
            )
        kwargs["ssl_mode"] = mode
    return kwargs


def _tls_mode(ssl: dict[str, Any] | None, ssl_mode: str | None) -> str | None:
    """The effective ``ssl_mode``: an ``ssl`` dict without a mode asks for TLS (verified when it names a CA).

    None: nothing configured, the client library's default applies.
    """
    if ssl_mode:
        return ssl_mode
    if not ssl:
        return None
    if not (ssl.get("ca") or ssl.get("capath")):
        return "REQUIRED"
    return "VERIFY_IDENTITY" if _bool(ssl.get("check_hostname", False)) else "VERIFY_CA"


def mysql_tls_required(ssl: dict[str, Any] | None, ssl_mode: str | None) -> bool:
    """Return whether MySqlHook's TLS settings require an encrypted connection (``REQUIRED`` or stricter).

    :param ssl: the Extra ``ssl`` dict.
    :param ssl_mode: the Extra ``ssl_mode``.
    """
    return _tls_mode(ssl, ssl_mode) in ("REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY")


def pymysql_tls(ssl: dict[str, Any] | None, ssl_mode: str | None) -> dict[str, Any]:
    """Return PyMySQL's TLS arguments (the binlog reader's ``connection_settings``) for MySqlHook's settings.

    :param ssl: the Extra ``ssl`` dict (``ca``, ``cert``, ``key``, ``capath``, ``cipher``, ``check_hostname``).
    :param ssl_mode: the Extra ``ssl_mode``.
    """
    mode = _tls_mode(ssl, ssl_mode)
    if mode is None or (mode == "PREFERRED" and not ssl):
        return {}
    if mode == "DISABLED":
        return {"ssl_disabled": True}
    tls = {k: v for k, v in (ssl or {}).items() if k != "check_hostname"}
    # PyMySQL's ssl dict: verify_mode/check_hostname decide what is checked (an empty dict would mean no TLS).
    tls["verify_mode"] = mode in ("VERIFY_CA", "VERIFY_IDENTITY")
    tls["check_hostname"] = mode == "VERIFY_IDENTITY"
    return {"ssl": tls}


def connectorx_tls_query(ssl: dict[str, Any] | None, ssl_mode: str | None) -> dict[str, str]:
    """Return connectorx's MySQL URL parameters (``ssl-mode``, ``ssl-ca``) for MySqlHook's TLS settings.

    connectorx knows a CA file only: a client certificate, a CA directory or ciphers raise ValueError naming the
    setting (read such a source with ``reader="rows"``).

    :param ssl: the Extra ``ssl`` dict.
    :param ssl_mode: the Extra ``ssl_mode``.
    """
    for key in ("cert", "key", "capath", "cipher"):
        if ssl and ssl.get(key):
            raise ValueError(
                f"MySQL Extra ssl.{key} cannot be passed to the native reader (connectorx); use reader='rows'."
            )
    mode = _tls_mode(ssl, ssl_mode)
    if mode is None or mode == "DISABLED" or (mode == "PREFERRED" and not ssl):
        return {}
    query = {"ssl-mode": mode}
    if ssl and ssl.get("ca"):
        query["ssl-ca"] = str(ssl["ca"])
    return query


# ------------------------------------------------------------------------------------------------ PostgreSQL

# libpq parameters that have an environment variable (PostgreSQL's libpq-envars): what the Spark job can get.
_LIBPQ_ENVIRONMENT = {
    "host": "PGHOST",
    "hostaddr": "PGHOSTADDR",
    "port": "PGPORT",
    "dbname": "PGDATABASE",
    "user": "PGUSER",
    "password": "PGPASSWORD",
    "passfile": "PGPASSFILE",
    "service": "PGSERVICE",
    "options": "PGOPTIONS",
    "application_name": "PGAPPNAME",
    "client_encoding": "PGCLIENTENCODING",
    "connect_timeout": "PGCONNECT_TIMEOUT",
    "sslmode": "PGSSLMODE",
    "sslnegotiation": "PGSSLNEGOTIATION",
    "sslcompression": "PGSSLCOMPRESSION",
    "sslcert": "PGSSLCERT",
    "sslkey": "PGSSLKEY",
    "sslcertmode": "PGSSLCERTMODE",
    "sslrootcert": "PGSSLROOTCERT",
    "sslcrl": "PGSSLCRL",
    "sslcrldir": "PGSSLCRLDIR",
    "sslsni": "PGSSLSNI",
    "requirepeer": "PGREQUIREPEER",
    "ssl_min_protocol_version": "PGSSLMINPROTOCOLVERSION",
    "ssl_max_protocol_version": "PGSSLMAXPROTOCOLVERSION",
    "gssencmode": "PGGSSENCMODE",
    "krbsrvname": "PGKRBSRVNAME",
    "gsslib": "PGGSSLIB",
    "channel_binding": "PGCHANNELBINDING",
    "require_auth": "PGREQUIREAUTH",
    "target_session_attrs": "PGTARGETSESSIONATTRS",
    "load_balance_hosts": "PGLOADBALANCEHOSTS",
}


def connect_kwargs(conn_id: str, **defaults: Any) -> dict[str, Any]:
    """Return ``psycopg2.connect`` keyword arguments for the Airflow ``postgres`` connection ``conn_id``.

    Read as the PostgreSQL provider's ``PostgresHook.get_conn`` reads it: host, port, dbname, user, password,
    and every Extra key as a libpq parameter (``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``...) except
    the hook's own options (``cursor``, ``sqlalchemy_*``...: the product picks its cursors). Unset fields are
    None, which psycopg2 leaves out: libpq's defaults apply (port 5432, or ``PGPORT``, or the Extra
    ``service``'s). AWS/Azure token authentication (Extra ``iam``) is refused.

    :param conn_id: the ``postgres`` connection.
    :param defaults: connect arguments the connection's Extra may override, e.g. ``connect_timeout=10``.
    """
    from airflow.providers.postgres.hooks.postgres import PostgresHook
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    extra = conn.extra_dejson
    if extra.get("iam"):
        raise ValueError(
            f"Connection {conn_id!r}: Extra 'iam' (token authentication) is not supported by this "
            "provider; use a password."
        )
    libpq = {k: v for k, v in extra.items() if k not in PostgresHook.ignored_extra_options}
    return {
        "host": conn.host or None,
        "port": conn.port or None,
        "dbname": conn.schema or None,
        "user": conn.login or None,
        "password": conn.password or None,
        **defaults,
        **libpq,
    }


def postgres_connection(conn_id: str, **defaults: Any) -> Any:
    """Open a psycopg2 connection for the Airflow ``postgres`` connection ``conn_id`` (see :func:`connect_kwargs`).

    A refused login or TLS handshake raises :class:`~exactly_once_provider.errors.ServiceAccessError` naming the
    connection and what to change.

    :param conn_id: the ``postgres`` connection.
    :param defaults: connect arguments the connection's Extra may override.
    """
    import psycopg2

    from exactly_once_provider.errors import ServiceAccessError

    kwargs = connect_kwargs(conn_id, **defaults)
    try:
        return psycopg2.connect(**kwargs)
    except psycopg2.OperationalError as err:
        message = str(err).strip().splitlines()[-1] if str(err).strip() else repr(err)
        if "no encryption" in message:
            hint = (
                "the server accepts this user only over TLS: set the connection's Extra sslmode (verify-full, "
                "with sslrootcert naming the CA)."
            )
        elif "certificate verify failed" in message or "root certificate" in message:
            hint = "the server's TLS certificate is not trusted: put the CA that signed it in the Extra sslrootcert."
        elif "password authentication failed" in message:
            hint = "check the connection's login and password."
        else:
            raise
        port = f":{kwargs['port']}" if kwargs.get("port") else ""
        raise ServiceAccessError(
            f"PostgreSQL connection {conn_id!r} ({kwargs.get('host')}{port}, "
            f"user {kwargs.get('user')!r}) was refused: {message} -- {hint}"
        ) from None


def libpq_environment(conn_id: str) -> dict[str, str]:
    """Return the libpq ``PG*`` environment variables for the Airflow ``postgres`` connection ``conn_id``.

    A connection setting that libpq cannot take from the environment raises ValueError naming it.

    :param conn_id: the ``postgres`` connection.
    """
    kwargs = {key: value for key, value in connect_kwargs(conn_id).items() if value is not None}
    unmapped = sorted(set(kwargs) - set(_LIBPQ_ENVIRONMENT))
    if unmapped:
        raise ValueError(
            f"Connection {conn_id!r}: Extra {unmapped[0]!r} has no libpq environment variable, so the "
            "Spark job cannot receive it; remove it from the connection's Extra."
        )
    return {_LIBPQ_ENVIRONMENT[key]: str(value) for key, value in kwargs.items()}
