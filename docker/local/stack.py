#!/usr/bin/env python3
"""The local service stack without Docker: Kafka (KRaft), MariaDB, PostgreSQL, MinIO and Spark on 127.0.0.1.

Usage (with the project's virtualenv python, see the Makefile)::

    stack.py up [--kafka-cluster] [--spark-cluster] [--only kafka,mariadb,...]
    stack.py down | status | clean [--all] | env | kill SERVICE | start SERVICE

Every service runs as a child process in its own session, with a pid file, a log file and a data
directory under ``$EO_STACK_HOME`` (default ``/var/tmp/exactly-once-stack``, outside the checkout so the
``postgres`` user can reach it and every clone reuses the same running stack). ``up`` is idempotent: a
service that answers its readiness round trip is reused. Readiness is always a real round trip, never a
sleep. The settings below are the single source for docker/compose.yaml as well (a test compares them).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOME = Path(os.environ.get("EO_STACK_HOME", "/var/tmp/exactly-once-stack"))
HOST = "127.0.0.1"
PYTHON = sys.executable

# ---------------------------------------------------------------------------------------------- ports
# Non-default ports; EO_STACK_PORT_OFFSET shifts them all, so a second stack (own EO_STACK_HOME) can run
# beside the first, e.g. for a parallel checkout or when a port is taken.
PORT_OFFSET = int(os.environ.get("EO_STACK_PORT_OFFSET", "0"))
KAFKA_PORT, KAFKA_CONTROLLER_PORT = 19092 + PORT_OFFSET, 19093 + PORT_OFFSET
# The secured listener of the same broker: SASL_SSL, SCRAM-SHA-512 users, ACLs (see kafka_security_settings).
KAFKA_SECURE_PORT = 19095 + PORT_OFFSET
KAFKA_CLUSTER_PORTS = tuple(port + PORT_OFFSET for port in (19192, 19193, 19194))
KAFKA_CLUSTER_CONTROLLER_PORTS = tuple(port + PORT_OFFSET for port in (19292, 19293, 19294))
MARIADB_PORT = 13306 + PORT_OFFSET
POSTGRES_PORT = 15432 + PORT_OFFSET
SPARK_MASTER_PORT = 17077 + PORT_OFFSET
SPARK_MASTER_UI_PORT, SPARK_WORKER_UI_PORT = 18080 + PORT_OFFSET, 18081 + PORT_OFFSET
SPARK_MASTER_REST_PORT = 16066 + PORT_OFFSET
MINIO_PORT = 19000 + PORT_OFFSET

# ---------------------------------------------------------------- local development credentials only
DB_USER = "eo"
DB_PASSWORD = "eo-local-dev-only"
DB_NAME = "eo"
# The secured endpoints' users: Kafka SCRAM users (SASL_SSL listener), a MariaDB user created REQUIRE SSL and a
# PostgreSQL role that may only connect over TLS (hostssl). KAFKA_ADMIN is a super user (it creates ACLs);
# KAFKA_DENIED_USER authenticates but has no ACL at all, KAFKA_NO_TXN_USER may use topics and groups but no
# transactional id (the "no rights" tests).
TLS_USER = "eo_tls"
TLS_PASSWORD = "eo-tls-local-dev-only"
KAFKA_ADMIN_USER, KAFKA_ADMIN_PASSWORD = "eo-admin", "eo-admin-local-dev-only"
KAFKA_DENIED_USER, KAFKA_DENIED_PASSWORD = "eo-denied", "eo-denied-local-dev-only"
KAFKA_NO_TXN_USER, KAFKA_NO_TXN_PASSWORD = "eo-no-txn", "eo-no-txn-local-dev-only"
SCRAM_MECHANISM = "SCRAM-SHA-512"
# MinIO's root user: the S3 access key and secret of the stack's `aws` connection.
MINIO_ACCESS_KEY, MINIO_SECRET_KEY = "eo-minio", "eo-minio-local-dev-only"

# ---------------------------------------------------------------------------------- memory budgets
# 2 cores / 24 GiB shared by everything: each service gets a small, explicit budget.
KAFKA_HEAP = "512m"
KAFKA_CLUSTER_NODE_HEAP = "320m"
SPARK_DAEMON_MEMORY = "256m"
# What the standalone worker offers to applications (scheduling slots, not use): in cluster mode each application's
# driver holds a core and its memory (1g) on the worker, so with 2 cores / 2g two applications submitted at once
# (parallel tests) took both cores for their drivers and waited forever for an executor. 4 / 4g fit two
# applications of the tests' size (driver 1 core 1g + executor 1 core 512m) side by side.
SPARK_WORKER_CORES = "4"
SPARK_WORKER_MEMORY = "4g"
# MinIO is a Go program: GOMEMLIMIT is the Go runtime's soft memory limit (it collects harder near it).
MINIO_MEMORY_LIMIT = "384MiB"

# ------------------------------------------------------------------------------------ Kafka settings
# Defaults assume 3 brokers and make transactions hang on one node (docs/pitfalls.md#kafka).
KAFKA_SINGLE_NODE_SETTINGS = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
}
# The fault-test cluster: replication factor 3 and min ISR 2, so one broker may die without loss.
KAFKA_CLUSTER_SETTINGS = {
    **KAFKA_SINGLE_NODE_SETTINGS,
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "unclean.leader.election.enable": "false",
}

# ---------------------------------------------------------------------------------- MariaDB settings
# What the binlog capture needs (docs/pitfalls.md#mysql-and-mariadb-sources); preflight checks refuse anything else.
MARIADB_SETTINGS = {
    "server_id": "1",
    "log_bin": "binlog",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
    "binlog_expire_logs_seconds": "604800",
    "innodb_buffer_pool_size": "256M",
    "innodb_log_file_size": "64M",
    "max_connections": "200",
    "max_allowed_packet": "64M",
    "character_set_server": "utf8mb4",
    "collation_server": "utf8mb4_unicode_ci",
    "skip_name_resolve": "ON",
}

# ------------------------------------------------------------------------------- PostgreSQL settings
POSTGRES_SETTINGS = {
    "shared_buffers": "128MB",
    "max_connections": "100",
    "max_prepared_transactions": "20",
    "fsync": "on",
    "synchronous_commit": "on",
}


def log(message: str, *args: object) -> None:
    print(f"[stack] {message % args if args else message}", flush=True)


@contextlib.contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (created if missing) for the block: one process at a time.

    Parallel test workers and ``stack.py`` commands share the stack home; what one of them builds there, the
    others wait for, then find built (check again after acquiring). The lock goes with the process if it dies.
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# ----------------------------------------------------------------------------------- process control
@dataclass(frozen=True)
class Process:
    """A service process: pid file, log file, and how it is stopped gracefully."""

    name: str
    stop_signal: int = signal.SIGTERM

    @property
    def pidfile(self) -> Path:
        return HOME / "run" / f"{self.name}.pid"

    @property
    def logfile(self) -> Path:
        return HOME / "logs" / f"{self.name}.log"

    def pid(self) -> int | None:
        """Return the pid if the process is alive (zombies count as dead and are reaped)."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _alive(pid) else None

    def start(self, cmd: list[str], env: dict | None = None, user: str | None = None, cwd: Path | None = None) -> int:
        """Start ``cmd`` detached in its own session; its output goes to the log file."""
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(self.logfile, "ab") as out:
            out.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} start: {' '.join(cmd)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
                user=user,
            )
        self.pidfile.write_text(str(proc.pid))
        return proc.pid

    def stop(self, timeout: float = 60) -> None:
        """Stop gracefully, then with SIGKILL after ``timeout`` seconds."""
        stop_all([self], timeout)

    def kill(self) -> None:
        """SIGKILL the whole process group at once (fault injection)."""
        pid = self.pid()
        if pid is not None:
            _signal_group(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.05)
        self.pidfile.unlink(missing_ok=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def stop_all(processes: list[Process], timeout: float = 60) -> None:
    """Signal every process at once, then wait; SIGKILL whatever is left after ``timeout`` seconds.

    All at once matters for the KRaft cluster: a node stopped last waits for a quorum that is gone.
    """
    running = {proc: pid for proc in processes if (pid := proc.pid()) is not None}
    for proc, pid in running.items():
        log("stopping %s", proc.name)
        _signal_group(pid, proc.stop_signal)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in running.values()):
        time.sleep(0.2)
    for proc, pid in running.items():
        if _alive(pid):
            log("%s did not stop in %.0fs; SIGKILL", proc.name, timeout)
            _signal_group(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.1)
    for proc in processes:
        proc.pidfile.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    if state == "Z":
        try:  # reap it if it is our child; harmless otherwise
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def wait_ready(proc: Process, check: Callable[[], object], timeout: float) -> object:
    """Repeat ``check`` (a real round trip) until it succeeds; fail with the log tail otherwise."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        if proc.pid() is None:
            raise RuntimeError(f"{proc.name} exited during start-up. Log {proc.logfile}:\n{proc.log_tail()}")
        try:
            return check()
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last_error = exc
            time.sleep(0.5)
    raise RuntimeError(
        f"{proc.name} not ready after {timeout:.0f}s (last error: {last_error!r}). "
        f"Log {proc.logfile}:\n{proc.log_tail()}"
    )


def port_answers(port: int) -> bool:
    """Return True if something accepts TCP connections on the stack's host at ``port``."""
    import socket

    try:
        socket.create_connection((HOST, port), timeout=2).close()
        return True
    except OSError:
        return False


def run(cmd: list[str], user: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, user=user, **kwargs)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


# ------------------------------------------------------------------------------------------------ TLS
# One local CA signs one server certificate (SAN 127.0.0.1 and localhost) that Kafka, MariaDB and PostgreSQL
# all present; a second CA that signed nothing here lets tests check that an untrusted server is refused.
def tls_dir() -> Path:
    return HOME / "tls"


def tls_files() -> dict[str, Path]:
    """Create the local CA and the server certificate once; return their paths.

    Keys are unencrypted PKCS#8 PEM (what Kafka's PEM keystore, MariaDB and PostgreSQL all read); the server
    key is readable by its owner only.
    """
    directory = tls_dir()
    files = {
        name: directory / name
        for name in ("ca.pem", "ca.key", "server.pem", "server.key", "server-keystore.pem", "other-ca.pem")
    }
    if all(path.exists() for path in files.values()):
        return files
    directory.mkdir(parents=True, exist_ok=True)
    subject = "/O=exactly-once local stack/CN="
    for ca in ("ca", "other-ca"):
        run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "3650",
                "-keyout",
                str(directory / f"{ca}.key"),
                "-out",
                str(directory / f"{ca}.pem"),
                "-subj",
                f"{subject}{ca}",
            ]
        )
    extensions = directory / "server.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    run(
        [
            "openssl",
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(files["server.key"]),
            "-out",
            str(directory / "server.csr"),
            "-subj",
            f"{subject}localhost",
        ]
    )
    run(
        [
            "openssl",
            "x509",
            "-req",
            "-days",
            "3650",
            "-in",
            str(directory / "server.csr"),
            "-CA",
            str(files["ca.pem"]),
            "-CAkey",
            str(files["ca.key"]),
            "-CAcreateserial",
            "-out",
            str(files["server.pem"]),
            "-extfile",
            str(extensions),
        ]
    )
    files["server-keystore.pem"].write_text(files["server.key"].read_text() + files["server.pem"].read_text())
    for name in ("ca.key", "server.key", "server-keystore.pem"):
        files[name].chmod(0o600)
    directory.chmod(0o755)
    return files


# ---------------------------------------------------------------------------------------------- Kafka
def kafka_version() -> str:
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", (HERE / "kafka" / "pom.xml").read_text())
    assert match, "docker/local/kafka/pom.xml must define <kafka.version>"
    return match.group(1)


def kafka_libs() -> Path:
    """Resolve the broker jars from Maven Central once (``mvn dependency:copy-dependencies``)."""
    libs = HOME / "kafka" / f"libs-{kafka_version()}"
    done = libs / ".resolved"
    if done.exists():
        return libs
    log("resolving Kafka %s jars from Maven Central into %s", kafka_version(), libs)
    libs.mkdir(parents=True, exist_ok=True)
    run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(HERE / "kafka" / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={libs}",
            "-DincludeScope=runtime",
        ]
    )
    done.touch()
    return libs


def _cluster_id() -> str:
    path = HOME / "kafka" / "cluster-id"
    # An id starting with '-' (1 in 64 of urlsafe base64) reads as an option to kafka-storage: never use one.
    if not path.exists() or path.read_text().startswith("-"):
        path.parent.mkdir(parents=True, exist_ok=True)
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        path.write_text(cluster_id)
    return path.read_text().strip()


@dataclass(frozen=True)
class KafkaNode:
    """One combined broker+controller node of a KRaft quorum."""

    name: str
    node_id: int
    port: int
    controller_port: int
    voters: str
    settings: dict
    heap: str
    secure_port: int | None = None

    @property
    def directory(self) -> Path:
        return HOME / "kafka" / self.name

    @property
    def process(self) -> Process:
        return Process(self.name)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def properties(self) -> str:
        listeners = {"PLAINTEXT": self.port, "CONTROLLER": self.controller_port}
        protocols = {"PLAINTEXT": "PLAINTEXT", "CONTROLLER": "PLAINTEXT"}
        if self.secure_port:
            listeners["SASL_SSL"], protocols["SASL_SSL"] = self.secure_port, "SASL_SSL"
        advertised = {name: port for name, port in listeners.items() if name != "CONTROLLER"}
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "listeners": ",".join(f"{name}://{HOST}:{port}" for name, port in listeners.items()),
            "advertised.listeners": ",".join(f"{name}://{HOST}:{port}" for name, port in advertised.items()),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(f"{name}:{proto}" for name, proto in protocols.items()),
            "log.dirs": str(self.directory / "data"),
            **self.settings,
            **(kafka_security_settings() if self.secure_port else {}),
        }
        return "".join(f"{key}={value}\n" for key, value in props.items())

    def start(self) -> None:
        if self.process.pid() is not None:
            if not self.secure_port or port_answers(self.secure_port):
                return
            config = self.directory / "server.properties"
            if config.exists() and f"SASL_SSL://{HOST}:{self.secure_port}" in config.read_text():
                # Started with the listener and still recovering its logs (minutes with thousands of test
                # partitions): killing it now would only start that recovery again. The readiness check waits.
                log(
                    "%s is still starting (its SASL_SSL listener on port %s is not up yet)", self.name, self.secure_port
                )
                return
            # A broker started by an older stack.py, before the secured listener existed: start it anew.
            log("%s runs without its SASL_SSL listener (port %s): restarting it", self.name, self.secure_port)
            stop_all([self.process])
        libs = kafka_libs()
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "server.properties"
        config.write_text(self.properties())
        log4j = self.directory / "log4j2.properties"
        log4j.write_text(
            "status = warn\n"
            "appender.out.type = Console\nappender.out.name = OUT\n"
            "appender.out.layout.type = PatternLayout\nappender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.out.ref = OUT\n"
            "logger.kafka.name = kafka\nlogger.kafka.level = INFO\n"
            "logger.state.name = state.change.logger\nlogger.state.level = WARN\n"
            # Per-partition lines (log loading, UNCLEAN leader changes, log creation) at every restart of a broker
            # that holds a test session's ~10k partitions: hundreds of MB of log a run, nothing a reader needs.
            "logger.controller.name = org.apache.kafka.controller\nlogger.controller.level = WARN\n"
            "logger.storage.name = org.apache.kafka.storage\nlogger.storage.level = WARN\n"
            "logger.log.name = kafka.log\nlogger.log.level = WARN\n"
            "logger.cluster.name = kafka.cluster\nlogger.cluster.level = WARN\n"
        )
        classpath = f"{libs}/*"
        if not (self.directory / "data" / "meta.properties").exists():
            run(
                [
                    "java",
                    "-cp",
                    classpath,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    _cluster_id(),
                    "-c",
                    str(config),
                    "-g",
                ]
            )
        self.process.start(
            [
                "java",
                f"-Xms{self.heap}",
                f"-Xmx{self.heap}",
                "-XX:+UseG1GC",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={log4j}",
                "-cp",
                classpath,
                "kafka.Kafka",
                str(config),
            ]
        )


def kafka_single() -> list[KafkaNode]:
    return [
        KafkaNode(
            "kafka",
            1,
            KAFKA_PORT,
            KAFKA_CONTROLLER_PORT,
            f"1@{HOST}:{KAFKA_CONTROLLER_PORT}",
            KAFKA_SINGLE_NODE_SETTINGS,
            KAFKA_HEAP,
            secure_port=KAFKA_SECURE_PORT,
        )
    ]


def kafka_security_settings() -> dict[str, str]:
    """The SASL_SSL listener: TLS with the stack's server certificate, SCRAM-SHA-512 logins, ACLs enforced.

    The PLAINTEXT and CONTROLLER listeners stay for the broker itself and for the tests that need a plaintext
    client on purpose: their principal (ANONYMOUS) is a super user, like the admin SCRAM user that creates the
    users and ACLs. Every other SCRAM user has exactly the rights its ACLs grant (``allow.everyone.if.no.acl.found``
    is off): :func:`kafka_users_and_acls`.
    """
    tls = tls_files()
    return {
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls["server-keystore.pem"]),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls["ca.pem"]),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:ANONYMOUS;User:{KAFKA_ADMIN_USER}",
        "allow.everyone.if.no.acl.found": "false",
    }


def kafka_secure_client_config(user: str = DB_USER, password: str = DB_PASSWORD) -> dict[str, str]:
    """Return the librdkafka settings of a SCRAM user on the secured listener (what a kafka connection's Extra holds)."""
    return {
        "bootstrap.servers": f"{HOST}:{KAFKA_SECURE_PORT}",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": SCRAM_MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(tls_files()["ca.pem"]),
    }


def kafka_users_and_acls(bootstrap: str) -> str:
    """Create the SCRAM users (idempotent upserts) and the application user's ACLs over the plaintext listener.

    ``eo`` may do what the product does (topics, consumer groups, transactional ids, idempotent writes);
    ``eo-no-txn`` the same without transactional ids; ``eo-denied`` authenticates and may do nothing.
    """
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": logging.getLogger("stack.rdkafka")})
    mechanism = ScramMechanism.SCRAM_SHA_512
    upserts = [
        UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 8192), password.encode())
        for user, password in (
            (KAFKA_ADMIN_USER, KAFKA_ADMIN_PASSWORD),
            (DB_USER, DB_PASSWORD),
            (KAFKA_DENIED_USER, KAFKA_DENIED_PASSWORD),
            (KAFKA_NO_TXN_USER, KAFKA_NO_TXN_PASSWORD),
        )
    ]
    for future in admin.alter_user_scram_credentials(upserts, request_timeout=15).values():
        future.result(timeout=30)
    principal = f"User:{DB_USER}"
    allow = AclPermissionType.ALLOW
    bindings = [
        AclBinding(kind, "*", ResourcePatternType.LITERAL, principal, "*", AclOperation.ALL, allow)
        for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)
    ]
    bindings.append(
        AclBinding(
            ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, principal, "*", AclOperation.ALL, allow
        )
    )
    no_txn = f"User:{KAFKA_NO_TXN_USER}"
    bindings += [
        AclBinding(kind, "*", ResourcePatternType.LITERAL, no_txn, "*", AclOperation.ALL, allow)
        for kind in (ResourceType.TOPIC, ResourceType.GROUP)
    ]
    for future in admin.create_acls(bindings, request_timeout=15).values():
        future.result(timeout=30)
    return (
        f"SCRAM users {DB_USER}, {KAFKA_NO_TXN_USER}, {KAFKA_DENIED_USER}, {KAFKA_ADMIN_USER}; ACLs for "
        f"{principal} and {no_txn}"
    )


def kafka_cluster_whole(bootstrap: str, brokers: int) -> str:
    """Return a summary once ``brokers`` brokers serve and every partition's replicas are all in sync; else raise."""
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": bootstrap, "logger": logging.getLogger("stack.rdkafka")}).list_topics(
        timeout=10
    )
    if len(metadata.brokers) < brokers:
        raise RuntimeError(f"{len(metadata.brokers)} of {brokers} brokers registered")
    short = [
        f"{topic}/{p.id}"
        for topic, t in metadata.topics.items()
        for p in t.partitions.values()
        if set(p.isrs) != set(p.replicas)
    ]
    if short:
        raise RuntimeError(f"{len(short)} partition(s) with replicas out of sync, e.g. {short[:3]}")
    return f"{len(metadata.brokers)} brokers, {len(metadata.topics)} topics, every replica in sync"


def kafka_cluster() -> list[KafkaNode]:
    voters = ",".join(f"{i + 1}@{HOST}:{port}" for i, port in enumerate(KAFKA_CLUSTER_CONTROLLER_PORTS))
    return [
        KafkaNode(f"kafka-cluster-{i + 1}", i + 1, port, cport, voters, KAFKA_CLUSTER_SETTINGS, KAFKA_CLUSTER_NODE_HEAP)
        for i, (port, cport) in enumerate(zip(KAFKA_CLUSTER_PORTS, KAFKA_CLUSTER_CONTROLLER_PORTS))
    ]


def kafka_round_trip(bootstrap: str, replication_factor: int = 1, client: dict | None = None) -> str:
    """Create a topic, commit a transaction and read it back with a read_committed consumer.

    :param client: the client settings (SASL/TLS) when not a plaintext listener.
    """
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = "__eo_readiness"
    # librdkafka's retries go to logging, not stderr
    quiet = {"logger": logging.getLogger("stack.rdkafka"), **(client or {}), "bootstrap.servers": bootstrap}
    admin = AdminClient({"socket.timeout.ms": 5000, **quiet})
    future = admin.create_topics([NewTopic(topic, 1, replication_factor)], operation_timeout=10)[topic]
    try:
        future.result(timeout=15)
    except KafkaException as exc:
        if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
            raise
    token = uuid.uuid4().hex
    producer = Producer({"transactional.id": f"eo-readiness-{bootstrap}", **quiet})
    producer.init_transactions(30)
    producer.begin_transaction()
    delivered: list = []
    producer.produce(topic, token.encode(), on_delivery=lambda err, msg: delivered.append((err, msg)))
    producer.commit_transaction(30)
    err, msg = delivered[0]
    if err is not None:
        raise RuntimeError(f"readiness record not delivered: {err}")
    consumer = Consumer(
        {
            "group.id": "eo-readiness",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            **quiet,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, msg.offset())])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            record = consumer.poll(1)
            if record is not None and record.error() is None and record.value() == token.encode():
                return f"transaction committed and read back at offset {record.offset()}"
        raise RuntimeError("committed readiness record not visible to a read_committed consumer")
    finally:
        consumer.close()


def start_kafka(nodes: list[KafkaNode], timeout: float = 120) -> None:
    for node in nodes:
        node.start()
    rf = 3 if len(nodes) == 3 else 1
    for node in nodes:
        detail = wait_ready(node.process, lambda n=node: kafka_round_trip(n.bootstrap, rf), timeout)
        log("%s ready on %s: %s", node.name, node.bootstrap, detail)
        if node.secure_port:
            log("%s: %s", node.name, kafka_users_and_acls(node.bootstrap))
            secured = kafka_secure_client_config()
            detail = wait_ready(
                node.process, lambda c=secured: kafka_round_trip(c["bootstrap.servers"], rf, c), timeout
            )
            log(
                "%s ready on %s (SASL_SSL, SCRAM user %s): %s", node.name, secured["bootstrap.servers"], DB_USER, detail
            )


# -------------------------------------------------------------------------------------------- MariaDB
MARIADB = Process("mariadb")


def _mariadb_dir() -> Path:
    return HOME / "mariadb"


def _mariadb_socket() -> str:
    return str(_mariadb_dir() / "mariadb.sock")


def _mariadb_cnf() -> Path:
    directory = _mariadb_dir()
    tls = tls_files()
    cnf = directory / "my.cnf"
    lines = [
        "[mariadbd]",
        f"datadir={directory / 'data'}",
        f"socket={_mariadb_socket()}",
        f"pid-file={directory / 'mariadbd.pid'}",
        f"port={MARIADB_PORT}",
        f"bind-address={HOST}",
        f"log_error={HOME / 'logs' / 'mariadb.err'}",
        # Its own temp dir: the server's temp files stay with the stack (cleaned with it), off a shared /tmp.
        f"tmpdir={directory / 'tmp'}",
        "user=root",
        *(f"{key}={value}" for key, value in MARIADB_SETTINGS.items()),
        # TLS on (the server certificate of tls_files()); the user TLS_USER may only connect over it.
        f"ssl_ca={tls['ca.pem']}",
        f"ssl_cert={tls['server.pem']}",
        f"ssl_key={tls['server.key']}",
        "",
    ]
    (directory / "tmp").mkdir(parents=True, exist_ok=True)
    cnf.write_text("\n".join(lines))
    return cnf


def mariadb_round_trip() -> str:
    """Open a consistent snapshot and read its exact binlog position as the stack's user."""
    import MySQLdb

    conn = MySQLdb.connect(
        host=HOST, port=MARIADB_PORT, user=DB_USER, password=DB_PASSWORD, database=DB_NAME, connect_timeout=5
    )
    try:
        cur = conn.cursor()
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = dict(cur.fetchall())
        conn.rollback()
    finally:
        conn.close()
    if not status.get("Binlog_snapshot_file"):
        raise RuntimeError(f"no binlog snapshot position: {status}")
    return f"snapshot at {status['Binlog_snapshot_file']}:{status['Binlog_snapshot_position']}"


def _mariadb_has_tls() -> bool:
    import MySQLdb

    try:
        conn = MySQLdb.connect(unix_socket=_mariadb_socket(), user="root", connect_timeout=5)
    except MySQLdb.Error:
        return True  # not answering yet: the readiness wait decides
    try:
        cur = conn.cursor()
        cur.execute("SHOW GLOBAL VARIABLES LIKE 'have_ssl'")
        row = cur.fetchone()
        return bool(row) and row[1] == "YES"
    finally:
        conn.close()


def _mariadb_bootstrap() -> None:
    """Create the stack's user and database (as root over the socket); idempotent."""
    import MySQLdb

    conn = MySQLdb.connect(unix_socket=_mariadb_socket(), user="root", connect_timeout=5)
    try:
        cur = conn.cursor()
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{DB_NAME}` CHARACTER SET utf8mb4")
        cur.execute("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (DB_USER, DB_PASSWORD))
        # A full-power development user: tests create restricted users from it for privilege checks.
        cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO `{DB_USER}`@'%' WITH GRANT OPTION")
        # The secured endpoint's user: the server refuses it any session that is not TLS.
        cur.execute("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s REQUIRE SSL", (TLS_USER, TLS_PASSWORD))
        cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO `{TLS_USER}`@'%'")
    finally:
        conn.close()


def start_mariadb(timeout: float = 90) -> None:
    if MARIADB.pid() is not None and not _mariadb_has_tls():
        log("mariadb runs without TLS (started by an older stack.py): restarting it")
        stop_all([MARIADB])
    if MARIADB.pid() is None:
        cnf = _mariadb_cnf()
        (HOME / "logs").mkdir(parents=True, exist_ok=True)
        if not (_mariadb_dir() / "data" / "mysql").exists():
            log("initialising MariaDB datadir %s", _mariadb_dir() / "data")
            shutil.rmtree(_mariadb_dir() / "data", ignore_errors=True)  # what an interrupted install left
            run(
                [
                    "mariadb-install-db",
                    f"--defaults-file={cnf}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ]
            )
        MARIADB.start([_mariadbd(), f"--defaults-file={cnf}"])
        wait_ready(MARIADB, _mariadb_bootstrap, timeout)
    log("mariadb ready on %s:%s: %s", HOST, MARIADB_PORT, wait_ready(MARIADB, mariadb_round_trip, timeout))


def _mariadbd() -> str:
    for candidate in ("mariadbd", "/usr/sbin/mariadbd", "mysqld", "/usr/sbin/mysqld"):
        if shutil.which(candidate):
            return shutil.which(candidate)
    raise RuntimeError("mariadbd not found: install the Debian package mariadb-server (make setup does).")


# ------------------------------------------------------------------ MariaDB replication pairs (failover tests)
# A primary and a GTID replica of their own, started only by the tests that need them (and `stack.py pair-up`),
# never by `up`: a test may SIGKILL its primary and promote its replica without touching the shared MariaDB.
# Both run the capture's settings plus what GTID failover needs on every server of a cluster.
MARIADB_REPLICATION_SETTINGS = {"log_slave_updates": "ON", "gtid_strict_mode": "ON"}
# Small, explicit budget per server of a pair (the shared server has 256M of buffer pool).
MARIADB_PAIR_MEMORY = {
    "innodb_buffer_pool_size": "48M",
    "innodb_log_file_size": "16M",
    "max_connections": "40",
    "performance_schema": "OFF",
    "innodb_log_buffer_size": "4M",
}
MARIADB_PAIR_PORTS = (13316 + PORT_OFFSET, 13317 + PORT_OFFSET)  # stack.py pair-up; tests pick free ports


@dataclass(frozen=True)
class MariadbServer:
    """One server of a replication pair: own data dir, port and server_id; the stack's user and database."""

    name: str
    directory: Path
    port: int
    server_id: int

    @property
    def process(self) -> Process:
        return Process(self.name)

    @property
    def socket(self) -> str:
        return str(self.directory / "mariadb.sock")

    def cnf(self) -> Path:
        settings = {
            **MARIADB_SETTINGS,
            **MARIADB_REPLICATION_SETTINGS,
            **MARIADB_PAIR_MEMORY,
            "server_id": str(self.server_id),
        }
        lines = [
            "[mariadbd]",
            f"datadir={self.directory / 'data'}",
            f"socket={self.socket}",
            f"pid-file={self.directory / 'mariadbd.pid'}",
            f"port={self.port}",
            f"bind-address={HOST}",
            f"log_error={self.directory / 'mariadb.err'}",
            f"tmpdir={self.directory / 'tmp'}",
            "user=root",
            *(f"{key}={value}" for key, value in settings.items()),
            "",
        ]
        (self.directory / "tmp").mkdir(parents=True, exist_ok=True)
        cnf = self.directory / "my.cnf"
        cnf.write_text("\n".join(lines))
        return cnf

    def root(self):
        import MySQLdb

        return MySQLdb.connect(unix_socket=self.socket, user="root", connect_timeout=5, autocommit=True)

    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        """Run one statement as root over the socket; return its rows."""
        conn = self.root()
        try:
            cur = conn.cursor()
            cur.execute(sql, args or None)
            return list(cur.fetchall() or [])
        finally:
            conn.close()

    def start(self, primary: MariadbServer | None = None, timeout: float = 90) -> None:
        """Initialise (once) and start the server; a replica replicates ``primary`` by GTID from its start."""
        cnf = self.cnf()
        fresh = not (self.directory / "data" / "mysql").exists()
        if fresh:
            run(
                [
                    "mariadb-install-db",
                    f"--defaults-file={cnf}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ]
            )
        self.process.start([_mariadbd(), f"--defaults-file={cnf}"])
        wait_ready(self.process, lambda: self.query("SELECT 1"), timeout)
        if primary is None:  # idempotent: a start after a failed first one finishes the job
            self.query(f"CREATE DATABASE IF NOT EXISTS `{DB_NAME}` CHARACTER SET utf8mb4")
            self.query("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (DB_USER, DB_PASSWORD))
            self.query(f"GRANT ALL PRIVILEGES ON *.* TO `{DB_USER}`@'%' WITH GRANT OPTION")
        elif fresh:
            # Nothing of its own in its binlog (strict mode refuses a replica whose GTIDs differ); the user and
            # database arrive by replication from the primary's binlog.
            self.query("RESET MASTER")
            self.query("SET GLOBAL gtid_slave_pos = ''")
            self.query(
                f"CHANGE MASTER TO MASTER_HOST='{HOST}', MASTER_PORT={primary.port}, MASTER_USER=%s, "
                "MASTER_PASSWORD=%s, MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
                (DB_USER, DB_PASSWORD),
            )
            self.query("START SLAVE")
            wait_ready(self.process, lambda: self.caught_up(primary), timeout)
        log(
            "%s ready on %s:%s (server_id %s)%s",
            self.name,
            HOST,
            self.port,
            self.server_id,
            f", replica of {primary.name}" if primary else "",
        )

    def gtid_binlog_pos(self) -> str:
        return self.query("SELECT @@gtid_binlog_pos")[0][0]

    def caught_up(self, primary: MariadbServer, timeout: float = 60) -> str:
        """Wait until this replica applied everything in the primary's binlog now; return that GTID position."""
        target = primary.gtid_binlog_pos()
        if self.query("SELECT MASTER_GTID_WAIT(%s, %s)", (target, timeout))[0][0] != 0:
            raise RuntimeError(f"{self.name} did not reach {target} in {timeout}s: {self.query('SHOW SLAVE STATUS')}")
        return target

    def promote(self) -> None:
        """Make this replica a primary: stop replicating, forget the old primary, accept writes."""
        self.query("STOP SLAVE")
        self.query("RESET SLAVE ALL")
        self.query("SET GLOBAL read_only = OFF")

    def kill(self) -> None:
        self.process.kill()

    def remove(self) -> None:
        """Stop the server and delete its data."""
        stop_all([self.process], timeout=30)
        shutil.rmtree(self.directory, ignore_errors=True)
        self.process.logfile.unlink(missing_ok=True)
        try:
            self.directory.parent.rmdir()  # the pair's directory, once both servers are gone
        except OSError:
            pass


def mariadb_pair(
    name: str, ports: tuple[int, int] = MARIADB_PAIR_PORTS, server_ids: tuple[int, int] = (101, 102)
) -> tuple[MariadbServer, MariadbServer]:
    """Start a primary and its GTID replica (``HOME/pairs/NAME``); remove them with ``MariadbServer.remove``."""
    base = HOME / "pairs" / name
    primary = MariadbServer(f"{name}-primary", base / "primary", ports[0], server_ids[0])
    replica = MariadbServer(f"{name}-replica", base / "replica", ports[1], server_ids[1])
    primary.start()
    replica.start(primary)
    return primary, replica


# ----------------------------------------------------------------------------------------- PostgreSQL
POSTGRES = Process("postgres", stop_signal=signal.SIGINT)  # SIGINT = fast shutdown, no waiting for clients


def _postgres_bin(tool: str) -> str:
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"), key=lambda p: int(p.parts[-3]))
    if not candidates:
        raise RuntimeError(f"{tool} not found under /usr/lib/postgresql: install the Debian package postgresql.")
    return str(candidates[-1])


def postgres_round_trip() -> str:
    import psycopg2

    conn = psycopg2.connect(
        host=HOST, port=POSTGRES_PORT, user=DB_USER, password=DB_PASSWORD, dbname=DB_NAME, connect_timeout=5
    )
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT version()")
            return cur.fetchone()[0].split(",")[0]
    finally:
        conn.close()


def start_postgres(timeout: float = 60) -> None:
    directory = HOME / "postgres"
    data = directory / "data"
    if POSTGRES.pid() is not None and _postgres_setting(directory, "ssl") == "off":
        log("postgres runs without TLS (started by an older stack.py): restarting it")
        stop_all([POSTGRES])
    if POSTGRES.pid() is None:
        if not (data / "PG_VERSION").exists():
            log("initialising PostgreSQL datadir %s", data)
            directory.mkdir(parents=True, exist_ok=True)
            shutil.chown(directory, "postgres", "postgres")
            run(
                [
                    _postgres_bin("initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                ],
                user="postgres",
            )
        settings = {**POSTGRES_SETTINGS, **_postgres_tls(directory)}
        arguments = [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]
        POSTGRES.start(
            [
                _postgres_bin("postgres"),
                "-D",
                str(data),
                "-c",
                f"port={POSTGRES_PORT}",
                "-c",
                f"listen_addresses={HOST}",
                "-c",
                f"unix_socket_directories={directory}",
                *arguments,
            ],
            user="postgres",
        )
        wait_ready(POSTGRES, lambda: _postgres_bootstrap(directory), timeout)
    log("postgres ready on %s:%s: %s", HOST, POSTGRES_PORT, wait_ready(POSTGRES, postgres_round_trip, timeout))


def _postgres_setting(socket_dir: Path, name: str) -> str | None:
    try:
        return run(
            [
                "psql",
                "-h",
                str(socket_dir),
                "-p",
                str(POSTGRES_PORT),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-tAc",
                f"SHOW {name}",
            ]
        ).stdout.strip()
    except RuntimeError:
        return None  # not answering yet: the readiness wait decides


def _postgres_tls(directory: Path) -> dict[str, str]:
    """TLS on with the stack's server certificate; TLS_USER and its members may only connect over TLS."""
    tls = tls_files()
    key = directory / "server.key"  # the server refuses a key that others (or another owner) can read
    shutil.copyfile(tls["server.key"], key)
    shutil.chown(key, "postgres", "postgres")
    key.chmod(0o600)
    hba = directory / "pg_hba.conf"
    hba.write_text(
        "local all all trust\n"
        f"hostnossl all +{TLS_USER} {HOST}/32 reject\n"  # the TLS user and every role that is a member of it
        f"host all all {HOST}/32 scram-sha-256\n"
    )
    return {
        "ssl": "on",
        "ssl_cert_file": str(tls["server.pem"]),
        "ssl_key_file": str(key),
        "ssl_ca_file": str(tls["ca.pem"]),
        "hba_file": str(hba),
    }


def _postgres_bootstrap(socket_dir: Path) -> None:
    def psql(sql: str) -> str:
        return run(
            ["psql", "-h", str(socket_dir), "-p", str(POSTGRES_PORT), "-U", "postgres", "-d", "postgres", "-tAc", sql]
        ).stdout.strip()

    if psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{DB_USER}'") != "1":
        psql(f"CREATE ROLE {DB_USER} LOGIN CREATEDB PASSWORD '{DB_PASSWORD}'")
    if psql(f"SELECT 1 FROM pg_database WHERE datname = '{DB_NAME}'") != "1":
        psql(f"CREATE DATABASE {DB_NAME} OWNER {DB_USER}")
    if psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{TLS_USER}'") != "1":
        psql(f"CREATE ROLE {TLS_USER} LOGIN PASSWORD '{TLS_PASSWORD}'")
    run(
        [
            "psql",
            "-h",
            str(socket_dir),
            "-p",
            str(POSTGRES_PORT),
            "-U",
            "postgres",
            "-d",
            DB_NAME,
            "-tAc",
            f"GRANT ALL ON DATABASE {DB_NAME} TO {TLS_USER}; GRANT ALL ON SCHEMA public TO {TLS_USER}",
        ]
    )


# ---------------------------------------------------------------------------------------------- Spark
SPARK_MASTER = Process("spark-master")
SPARK_WORKER = Process("spark-worker")
SPARK_MASTER_URL = f"spark://{HOST}:{SPARK_MASTER_PORT}"


def spark_env() -> dict[str, str]:
    return {
        "SPARK_LOCAL_IP": HOST,
        "SPARK_DAEMON_MEMORY": SPARK_DAEMON_MEMORY,
        "PYSPARK_PYTHON": PYTHON,
        "PYSPARK_DRIVER_PYTHON": PYTHON,
        "SPARK_LOG_DIR": str(HOME / "logs"),
    }


_JAR_VERSION = re.compile(r"-\d[\w.\-]*\.jar$")


def _artifact(jar: Path) -> str:
    """Return a jar file's artifact id (``kafka-clients-3.9.2.jar`` -> ``kafka-clients``)."""
    return _JAR_VERSION.sub("", jar.name)


# s3a (issue 18): hadoop-aws and the AWS SDK v2 bundle (about 600 MB) go on a job's classpath only when it
# reaches S3 (spark_conf(s3=True)), and through extraClassPath, not spark.jars: Spark copies every spark.jars
# entry into each executor's directory (in local mode too), a 600 MB copy per job. The paths are this machine's,
# which is where the stack's drivers and executors run.
S3A_ARTIFACTS = ("hadoop-aws", "bundle", "analyticsaccelerator-s3", "wildfly-openssl")


def _pom_property(name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", (HERE / "spark" / "pom.xml").read_text())
    assert match, f"docker/local/spark/pom.xml must define <{name}>"
    return match.group(1)


def _check_hadoop_version() -> None:
    """hadoop-aws must be the version of pyspark's own Hadoop client, or s3a fails at run time."""
    import pyspark

    shipped = [jar.name for jar in (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")]
    wanted = f"hadoop-client-api-{_pom_property('hadoop.version')}.jar"
    if shipped != [wanted]:
        raise RuntimeError(
            f"pyspark ships {shipped}, but docker/local/spark/pom.xml pins hadoop-aws "
            f"{_pom_property('hadoop.version')}: set <hadoop.version> to pyspark's Hadoop version."
        )


def _resolved_jars() -> list[Path]:
    """Resolve the Spark connectors once with Maven and return the jars Spark does not ship itself.

    Maven rather than ``spark.jars.packages``/Ivy: the registry reachable here lacks
    spark-token-provider-kafka-0-10 after 4.0.0, which only a Maven version pin can work around
    (docker/local/spark/pom.xml), and jars already in pyspark/jars (hadoop-client, log4j, ...) must win.
    The folder name carries a hash of the pom, so a changed pom resolves anew.
    """
    import hashlib

    import pyspark

    from exactly_once_provider.spark_jobs.packages import DELTA_CONNECTOR, SPARK_VERSION

    _check_hadoop_version()
    delta_version = DELTA_CONNECTOR.rsplit(":", 1)[1]
    pom = HERE / "spark" / "pom.xml"
    pom_hash = hashlib.sha256(pom.read_bytes()).hexdigest()[:8]
    target = HOME / "spark" / f"jars-{SPARK_VERSION}-delta-{delta_version}-{pom_hash}"
    done = target / ".resolved"  # written last: a folder with it is complete
    if done.exists():
        return sorted(target.glob("*.jar"))
    # Two processes resolving at once delete each other's jars (the rmtree of a partial folder, Maven's copy, the
    # unlink of the jars pyspark ships: "FileNotFoundError: parquet-encoding-1.16.0.jar"): one resolves, the
    # others wait for it and find the folder done.
    with exclusive(HOME / "spark" / "jars.lock"):
        if not done.exists():
            log(
                "resolving Spark connectors (Kafka %s, Delta %s, hadoop-aws %s) from Maven Central into %s",
                SPARK_VERSION,
                delta_version,
                _pom_property("hadoop.version"),
                target,
            )
            shutil.rmtree(target, ignore_errors=True)  # what an interrupted resolution left
            run(
                [
                    "mvn",
                    "-q",
                    "-B",
                    "-f",
                    str(pom),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={target}",
                    "-DincludeScope=runtime",
                    f"-Dspark.version={SPARK_VERSION}",
                    f"-Ddelta.version={delta_version}",
                ]
            )
            shipped = {_artifact(jar) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
            for jar in target.glob("*.jar"):
                if _artifact(jar) in shipped:
                    jar.unlink()
            done.touch()
    return sorted(target.glob("*.jar"))


def spark_jars(s3: bool = False) -> list[Path]:
    """Return the connector jars: Kafka and Delta; with ``s3`` only the s3a ones (hadoop-aws + the AWS SDK)."""
    return [jar for jar in _resolved_jars() if (_artifact(jar) in S3A_ARTIFACTS) == s3]


def spark_conf(s3: bool = False) -> dict[str, str]:
    """Return the Spark settings that load the connectors from the stack's pre-resolved jars.

    :param s3: also the s3a connector (hadoop-aws, the AWS SDK bundle); its endpoint and credentials are the
        job's to set in its driver, from its secrets file (never here: these settings go on a command line).
    """
    conf = {"spark.jars": ",".join(str(jar) for jar in spark_jars())}
    if s3:
        classpath = ":".join(str(jar) for jar in spark_jars(s3=True))
        conf.update({"spark.driver.extraClassPath": classpath, "spark.executor.extraClassPath": classpath})
    return conf


def spark_class_archive(s3: bool = False) -> Path:
    """Return a CDS archive of the classes a Spark driver loads with these jars on this JDK, building it once.

    A short Spark job spends most of its CPU loading and verifying ~20k classes and compiling them with C2. Test
    sessions start their driver JVMs with this archive and C1 only (:func:`spark_test_java_options`): measured on
    2 cores, a Delta write-and-read job 32 -> 15 CPU seconds, 20 -> 11 s wall. A JVM ignores an archive dumped
    with another class path, so a job with the s3a jars (``s3``: on the driver's class path through
    ``spark.driver.extraClassPath``, as :func:`spark_conf` puts them) has an archive of its own (a trivial job:
    9.3 -> 4.4 s wall, 14.6 -> 5.2 CPU seconds). The name carries a hash of the JDK, pyspark and the jars, so any
    change builds anew; each build is one warm-up job (``spark/warmup.py``, ~50 s).
    """
    import hashlib

    import pyspark

    jars = spark_jars()
    class_path = spark_jars(s3=True) if s3 else []
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    # The JVM checks the archive's class path file by file: pyspark's jars of THIS installation (a clone's .venv)
    # are part of it. An archive of another checkout is rejected silently (-Xlog:cds=off): every driver then
    # started without it (a CI clone reused the archive of the session's clone: ~4 s more per Spark start).
    pyspark_jars = Path(pyspark.__file__).resolve().parent / "jars"
    parts = [java, pyspark.__version__, str(pyspark_jars), *map(str, jars)]
    parts += ["class path:", *map(str, class_path)] if s3 else []
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    archive = HOME / "spark" / f"driver-classes-{key}.jsa"
    if archive.exists():
        if not archive.with_suffix(".pyspark").exists():  # dumped before archives named their checkout
            archive.with_suffix(".pyspark").write_text(str(pyspark_jars))
        return archive
    with exclusive(HOME / "spark" / "driver-classes.lock"):  # parallel test workers: one builds, the others wait
        if not archive.exists():
            _prune_class_archives()
            _build_class_archive(archive, jars, class_path)
            archive.with_suffix(".pyspark").write_text(str(pyspark_jars))
    return archive


def _prune_class_archives() -> None:
    """Delete the class archives of checkouts that no longer exist (a removed CI clone's: ~200 MB each).

    Each archive names the pyspark installation it was dumped with (``.pyspark`` next to it); one whose
    installation is gone can never be used again. An archive from before those names is kept for a day.
    """
    for old in (HOME / "spark").glob("driver-classes-*.jsa"):
        owner = old.with_suffix(".pyspark")
        try:
            gone = not Path(owner.read_text()).exists()
        except FileNotFoundError:
            gone = time.time() - old.stat().st_mtime > 86400
        if gone:
            log("removing the class archive %s (its checkout is gone)", old.name)
            old.unlink(missing_ok=True)
            owner.unlink(missing_ok=True)


def _build_class_archive(archive: Path, jars: list[Path], class_path: list[Path]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    log("building the Spark driver class archive %s (one warm-up job)", archive.name)
    started = time.monotonic()
    topic = f"__eo_class_archive_{uuid.uuid4().hex[:8]}"
    bootstrap = f"{HOST}:{KAFKA_PORT}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": logging.getLogger("stack.rdkafka")})
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=10)[topic].result(timeout=15)
    scratch = HOME / "spark" / f"warmup-{uuid.uuid4().hex[:8]}"
    partial = archive.with_name(f"{archive.stem}.{os.getpid()}.partial")
    try:
        run(
            [
                str(Path(PYTHON).parent / "spark-submit"),
                "--master",
                "local[2]",
                "--driver-memory",
                "1g",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.sql.shuffle.partitions=2",
                "--conf",
                f"spark.jars={','.join(map(str, jars))}",
                *(["--conf", f"spark.driver.extraClassPath={':'.join(map(str, class_path))}"] if class_path else []),
                "--conf",
                f"spark.driver.extraJavaOptions=-XX:ArchiveClassesAtExit={partial} -XX:TieredStopAtLevel=1",
                str(HERE / "spark" / "warmup.py"),
                bootstrap,
                topic,
                str(scratch),
            ],
            env={**os.environ, **spark_env()},
            timeout=600,
        )
        _require(partial.exists(), f"the warm-up job wrote no class archive at {partial}")
        partial.replace(archive)  # whole or absent: a killed build leaves only its partial file
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
        admin.delete_topics([topic])
    log(
        "Spark driver class archive built in %.0fs (%d MB)", time.monotonic() - started, archive.stat().st_size // 2**20
    )


def spark_test_java_options(s3: bool = False) -> str:
    """Return the driver JVM options of test sessions (``SPARK_SUBMIT_OPTS``): the class archive, C1 only.

    Both change how fast a JVM starts, nothing it computes. ``-Xlog:cds=off``: a JVM that cannot use the archive
    (another class path) would otherwise print a warning on stdout. ``s3``: the archive of a driver with the s3a
    jars on its class path (given as ``spark.driver.extraJavaOptions``, which comes after ``SPARK_SUBMIT_OPTS``
    on the driver's command line: its archive is the one the JVM uses).
    """
    try:
        archive = spark_class_archive(s3)
    except Exception as error:  # noqa: BLE001 - a speed-up only: the tests stay valid without it, and say so
        log("WARNING: no Spark class archive (%s); driver JVMs start without it", str(error)[-2000:])
        return "-XX:TieredStopAtLevel=1"
    return f"-XX:SharedArchiveFile={archive} -XX:TieredStopAtLevel=1 -Xlog:cds=off -Xlog:cds+dynamic=off"


def _require(condition: bool, message: str) -> bool:
    if not condition:
        raise RuntimeError(message)
    return True


def _spark_master_state() -> dict:
    with urllib.request.urlopen(f"http://{HOST}:{SPARK_MASTER_UI_PORT}/json/", timeout=5) as response:
        return json.load(response)


def _spark_rest_answers() -> bool:
    return port_answers(SPARK_MASTER_REST_PORT)


def _runs_a_deleted_checkout(process: Process) -> bool:
    """Return whether ``process`` (a Spark JVM) runs from a virtualenv that no longer exists: its executors would
    start that checkout's Python and fail (seen after removing a CI clone whose tests had started the cluster).
    A cluster started by another checkout that still exists is shared, not restarted under its running tests."""
    pid = process.pid()
    if pid is None:
        return False
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    classpath = args[args.index(b"-cp") + 1].decode() if b"-cp" in args else ""
    # Only the jars say where the JVM came from: spark-class also lists pyspark/conf, which a pip-installed
    # pyspark does not have (counting it made every call restart the cluster under the other tests' drivers).
    jars = [
        Path(e[:-1]) if e.endswith("*") else Path(e) for e in classpath.split(os.pathsep) if e.endswith(("*", ".jar"))
    ]
    return any(not jar.exists() for jar in jars)


def start_spark_cluster(timeout: float = 90) -> None:
    with exclusive(HOME / "run" / "spark-cluster.lock"):  # parallel test workers: one starts (or restarts) it
        _start_spark_cluster(timeout)


def _start_spark_cluster(timeout: float) -> None:
    spark_class = str(Path(PYTHON).parent / "spark-class")
    if any(_runs_a_deleted_checkout(p) for p in (SPARK_MASTER, SPARK_WORKER)):
        log("spark master/worker run from a deleted checkout's virtualenv: restarting them from %s", PYTHON)
        stop_all([SPARK_WORKER, SPARK_MASTER])
    if SPARK_MASTER.pid() is not None and not _spark_rest_answers():
        # A master started before its REST server was configured: cluster-mode drivers could not be tracked.
        log("spark master runs without its REST server (port %s): restarting master and worker", SPARK_MASTER_REST_PORT)
        stop_all([SPARK_WORKER, SPARK_MASTER])
    if SPARK_MASTER.pid() is None:
        SPARK_MASTER.start(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                HOST,
                "--port",
                str(SPARK_MASTER_PORT),
                "--webui-port",
                str(SPARK_MASTER_UI_PORT),
            ],
            # The REST submission server (off by default, spark.master.rest.enabled) lets cluster-mode drivers be
            # tracked and killed by id: SparkSubmitHook polls /v1/submissions/status/<driver id>.
            env={
                **spark_env(),
                "SPARK_MASTER_OPTS": f"-Dspark.master.rest.enabled=true "
                f"-Dspark.master.rest.host={HOST} "
                f"-Dspark.master.rest.port={SPARK_MASTER_REST_PORT}",
            },
        )
    wait_ready(SPARK_MASTER, lambda: _require(_spark_master_state()["status"] == "ALIVE", "master not ALIVE"), timeout)
    if SPARK_WORKER.pid() is None:
        work = HOME / "spark" / "work"
        work.mkdir(parents=True, exist_ok=True)
        SPARK_WORKER.start(
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                HOST,
                "--cores",
                SPARK_WORKER_CORES,
                "--memory",
                SPARK_WORKER_MEMORY,
                "--webui-port",
                str(SPARK_WORKER_UI_PORT),
                "--work-dir",
                str(work),
                SPARK_MASTER_URL,
            ],
            # Every application leaves a copy of its jars (~40 MB) in the work dir: drop those of finished
            # applications after an hour, or a test session fills gigabytes of disk.
            env={
                **spark_env(),
                "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=true "
                "-Dspark.worker.cleanup.interval=600 "
                "-Dspark.worker.cleanup.appDataTtl=3600",
            },
        )
    wait_ready(SPARK_WORKER, lambda: _require(_spark_master_state()["aliveworkers"] >= 1, "no alive worker"), timeout)
    log("spark standalone ready: master %s, UI http://%s:%s", SPARK_MASTER_URL, HOST, SPARK_MASTER_UI_PORT)


# ---------------------------------------------------------------------------------------------- MinIO
# The S3-compatible object store of issue 18. Built from source through the Go module proxy once (MinIO
# publishes no semver tags, so the pin is a pseudo-version of its main branch) and cached in the stack home:
# about 7.5 minutes on the 2-core machine, a 150 MB binary. It honours conditional writes (a PutObject with
# If-None-Match: * on an existing key fails with PreconditionFailed): the put-if-absent of the storage layer.
MINIO = Process("minio")
MINIO_MODULE = "github.com/minio/minio"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
# The buckets the tests and the demo write to; created at `up`.
MINIO_BUCKETS = ("eo-test", "eo-demo")
MINIO_REGION = "us-east-1"


def minio_endpoint() -> str:
    return f"http://{HOST}:{MINIO_PORT}"


def _go() -> str:
    for candidate in ("go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"):
        if shutil.which(candidate):
            return shutil.which(candidate)
    raise RuntimeError("go not found: the stack builds MinIO with `go install` (Go 1.24+ on PATH or /usr/local/go).")


def minio_binary() -> Path:
    """Build the pinned MinIO once with ``go install`` (via the Go module proxy); return the cached binary.

    The build goes to a scratch GOBIN and is moved into place only when complete, so an interrupted build is
    never mistaken for a cached binary.
    """
    directory = HOME / "minio"
    binary = directory / f"minio-{MINIO_VERSION}"
    if binary.exists():
        return binary
    scratch = directory / f"build-{uuid.uuid4().hex[:8]}"
    scratch.mkdir(parents=True)
    log("building MinIO %s with go install (the first time only: 3.5 to 7.5 minutes on 2 cores)", MINIO_VERSION)
    started = time.monotonic()
    try:
        # GOTOOLCHAIN=local: use the installed Go, never download another toolchain.
        run(
            [_go(), "install", f"{MINIO_MODULE}@{MINIO_VERSION}"],
            env={**os.environ, "GOBIN": str(scratch), "GOTOOLCHAIN": "local"},
        )
        os.replace(scratch / "minio", binary)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log("built MinIO in %.0fs: %s", time.monotonic() - started, binary)
    return binary


def minio_settings():
    """Return the :class:`~exactly_once_provider.storage.s3.S3Settings` of the stack's MinIO (its root user)."""
    from exactly_once_provider.storage.s3 import S3Settings

    return S3Settings(
        MINIO_ACCESS_KEY, MINIO_SECRET_KEY, None, minio_endpoint(), MINIO_REGION, "path", None, "aws_default"
    )


def minio_client():
    """Return a boto3 S3 client on the stack's MinIO as its root user (path-style addressing)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=minio_endpoint(),
        aws_access_key_id=MINIO_ACCESS_KEY,
        aws_secret_access_key=MINIO_SECRET_KEY,
        region_name=MINIO_REGION,
        config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=30, retries={"max_attempts": 2}),
    )


def minio_round_trip() -> str:
    """Put, conditionally put again, get and delete a probe object; the second put must be refused."""
    from botocore.exceptions import ClientError

    client = minio_client()
    key, token = f"_eo_readiness/{uuid.uuid4().hex}", uuid.uuid4().hex.encode()
    bucket = MINIO_BUCKETS[0]
    client.put_object(Bucket=bucket, Key=key, Body=token, IfNoneMatch="*")
    try:
        try:
            client.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
            raise RuntimeError("a second PutObject with If-None-Match: * overwrote the probe object")
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "PreconditionFailed":
                raise
        if client.get_object(Bucket=bucket, Key=key)["Body"].read() != token:
            raise RuntimeError("the probe object read back differs from what was written")
    finally:
        client.delete_object(Bucket=bucket, Key=key)
    return f"probe object put, refused a second put-if-absent, read back and deleted in s3://{bucket}"


def _minio_buckets() -> None:
    from botocore.exceptions import ClientError

    client = minio_client()
    for bucket in MINIO_BUCKETS:
        try:
            client.create_bucket(Bucket=bucket)
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise


def start_minio(timeout: float = 60) -> None:
    if MINIO.pid() is None:
        binary = minio_binary()
        data = HOME / "minio" / "data"
        data.mkdir(parents=True, exist_ok=True)
        # Credentials through the environment, never the command line; the web console is off (no second port).
        MINIO.start(
            [str(binary), "server", str(data), "--address", f"{HOST}:{MINIO_PORT}", "--quiet"],
            env={
                "MINIO_ROOT_USER": MINIO_ACCESS_KEY,
                "MINIO_ROOT_PASSWORD": MINIO_SECRET_KEY,
                "MINIO_BROWSER": "off",
                "MINIO_REGION": MINIO_REGION,
                "GOMEMLIMIT": MINIO_MEMORY_LIMIT,
                "MINIO_UPDATE": "off",
            },
        )
    wait_ready(MINIO, _minio_buckets, timeout)
    log("minio ready on %s: %s", minio_endpoint(), wait_ready(MINIO, minio_round_trip, timeout))


# ------------------------------------------------------------------------------------ the whole stack
def connection_env() -> dict[str, str]:
    """Return ``AIRFLOW_CONN_*`` variables (JSON form) that point Airflow at this stack."""
    tls = tls_files()
    return {
        # The product's default connections use the secured endpoints: SASL_SSL with the application user's
        # ACLs, and TLS (server certificate verified) to both databases. The plaintext listener and plaintext
        # database sessions stay for the tests' own clients, which read what the product wrote.
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": kafka_secure_client_config()}),
        "AIRFLOW_CONN_KAFKA_CLUSTER": json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": ",".join(f"{HOST}:{p}" for p in KAFKA_CLUSTER_PORTS)}}
        ),
        "AIRFLOW_CONN_MYSQL_DEFAULT": json.dumps(
            {
                "conn_type": "mysql",
                "host": HOST,
                "port": MARIADB_PORT,
                "login": DB_USER,
                "password": DB_PASSWORD,
                "schema": DB_NAME,
                "extra": {"ssl": {"ca": str(tls["ca.pem"])}, "ssl_mode": "VERIFY_IDENTITY"},
            }
        ),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": json.dumps(
            {
                "conn_type": "postgres",
                "host": HOST,
                "port": POSTGRES_PORT,
                "login": DB_USER,
                "password": DB_PASSWORD,
                "schema": DB_NAME,
                "extra": {"sslmode": "verify-full", "sslrootcert": str(tls["ca.pem"])},
            }
        ),
        # The secured endpoints: SASL_SSL + SCRAM Kafka, MariaDB and PostgreSQL users that must use TLS.
        "AIRFLOW_CONN_KAFKA_SECURE": json.dumps({"conn_type": "kafka", "extra": kafka_secure_client_config()}),
        "AIRFLOW_CONN_MYSQL_TLS": json.dumps(
            {
                "conn_type": "mysql",
                "host": HOST,
                "port": MARIADB_PORT,
                "login": TLS_USER,
                "password": TLS_PASSWORD,
                "schema": DB_NAME,
                "extra": {"ssl": {"ca": str(tls["ca.pem"])}, "ssl_mode": "VERIFY_IDENTITY"},
            }
        ),
        "AIRFLOW_CONN_POSTGRES_TLS": json.dumps(
            {
                "conn_type": "postgres",
                "host": HOST,
                "port": POSTGRES_PORT,
                "login": TLS_USER,
                "password": TLS_PASSWORD,
                "schema": DB_NAME,
                "extra": {"sslmode": "verify-full", "sslrootcert": str(tls["ca.pem"])},
            }
        ),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "AIRFLOW_CONN_SPARK_STANDALONE": json.dumps(
            {
                "conn_type": "spark",
                "host": f"spark://{HOST}",
                "port": SPARK_MASTER_PORT,
                "extra": {"deploy-mode": "cluster", "rest-port": SPARK_MASTER_REST_PORT},
            }
        ),
        # The standard `aws` connection type of apache-airflow-providers-amazon, pointed at the stack's MinIO:
        # login/password are the access key and secret, the endpoint URL is in the extra (users' connections to
        # AWS S3 or another S3-compatible store have the same shape).
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(
            {
                "conn_type": "aws",
                "login": MINIO_ACCESS_KEY,
                "password": MINIO_SECRET_KEY,
                "extra": {
                    "endpoint_url": minio_endpoint(),
                    "region_name": MINIO_REGION,
                    "config_kwargs": {"s3": {"addressing_style": "path"}},
                },
            }
        ),
    }


def all_processes() -> list[Process]:
    nodes = kafka_single() + kafka_cluster()
    return [n.process for n in nodes] + [MARIADB, POSTGRES, MINIO, SPARK_MASTER, SPARK_WORKER]


SERVICES = ("kafka", "mariadb", "postgres", "minio")


# What one `make test` writes (Kafka segments, Spark work dirs and temp files, Delta tables, logs): a few GB.
MIN_FREE_DISK = 4 << 30
LOW_FREE_DISK = 12 << 30


def check_free_disk() -> None:
    """Refuse to start with too little disk: a broker that runs out takes its log dir offline and stops."""
    free = shutil.disk_usage(HOME).free
    if free < MIN_FREE_DISK:
        raise RuntimeError(
            f"only {free / 2**30:.1f} GiB free on the disk of {HOME}; the stack and a test run need at least "
            f"{MIN_FREE_DISK / 2**30:.0f} GiB (a full disk takes Kafka's log dir offline). Free some space, e.g. "
            f"`make stack-clean` (stops the services and deletes their data; they start empty again)"
        )
    if free < LOW_FREE_DISK:
        log("WARNING: only %.1f GiB free on the disk of %s", free / 2**30, HOME)


def up(only: tuple[str, ...] = SERVICES, cluster: bool = False, spark_cluster: bool = False) -> None:
    """Start the requested services (reusing running ones) and wait for their readiness round trips."""
    HOME.mkdir(parents=True, exist_ok=True)
    HOME.chmod(0o755)
    check_free_disk()
    started = time.monotonic()
    # Start every process first, then wait: the services boot in parallel.
    if "kafka" in only:
        for node in kafka_single():
            node.start()
    if "mariadb" in only:
        start_mariadb()
    if "postgres" in only:
        start_postgres()
    if "kafka" in only:
        start_kafka(kafka_single())
    if "minio" in only:
        start_minio()
    if cluster:
        start_kafka(kafka_cluster())
    spark_jars()
    if spark_cluster:
        start_spark_cluster()
    log("stack up in %.1fs (home %s)", time.monotonic() - started, HOME)


def down(include_clusters: bool = True) -> None:
    procs = [SPARK_WORKER, SPARK_MASTER, MINIO, POSTGRES, MARIADB] + [n.process for n in kafka_single()]
    if include_clusters:
        procs += [n.process for n in kafka_cluster()]
    stop_all(procs)


def status() -> int:
    checks: dict[str, Callable[[], object]] = {
        "kafka": lambda: kafka_round_trip(f"{HOST}:{KAFKA_PORT}"),
        "mariadb": mariadb_round_trip,
        "postgres": postgres_round_trip,
        "minio": minio_round_trip,
        "spark-master": lambda: f"{_spark_master_state()['aliveworkers']} alive worker(s)",
    }
    for node in kafka_cluster():
        checks[node.name] = lambda n=node: kafka_round_trip(n.bootstrap, 3)
    print(f"{'service':<18} {'pid':>8}  state")
    down_count = 0
    for proc in all_processes():
        pid = proc.pid()
        state = "down"
        if pid is not None and proc.name in checks:
            try:
                state = f"ready - {checks[proc.name]()}"
            except Exception as exc:  # noqa: BLE001
                state = f"NOT READY - {exc!r}"[:120]
                down_count += 1
        elif pid is not None:
            state = "running"
        print(f"{proc.name:<18} {pid or '-':>8}  {state}")
    return 1 if down_count else 0


def clean(everything: bool = False) -> None:
    """Stop everything and delete data; ``everything`` also deletes the jar caches and the MinIO binary."""
    down()
    # The Spark jars and class archives, the Kafka jars, the MinIO binary and the TLS files are caches, not data.
    for sub in ("mariadb", "postgres", "spark/work", "run", "logs", "minio/data", "pairs"):
        shutil.rmtree(HOME / sub, ignore_errors=True)
    for node in kafka_single() + kafka_cluster():
        shutil.rmtree(node.directory, ignore_errors=True)
    (HOME / "kafka" / "cluster-id").unlink(missing_ok=True)
    if everything:
        shutil.rmtree(HOME, ignore_errors=True)
    log("cleaned %s%s", HOME, " (including jar caches and the MinIO build)" if everything else "")


def process_by_name(name: str) -> Process:
    for proc in all_processes():
        if proc.name == name:
            return proc
    raise SystemExit(f"unknown service {name!r}; one of {[p.name for p in all_processes()]}")


def start_by_name(name: str) -> None:
    """Start one service again (after ``kill``, in fault tests) and wait until it is ready."""
    for node in kafka_single():
        if node.name == name:
            return start_kafka([node])
    cluster = kafka_cluster()
    for node in cluster:
        if node.name == name:
            node.start()
            # one node of three answers its round trip only with a quorum, which the others provide
            log("%s ready: %s", name, wait_ready(node.process, lambda: kafka_round_trip(node.bootstrap, 3), 120))  # noqa: B023 - called here
            # Answering is not caught up: until its replicas are back in sync, a topic created with RF 3 or a
            # second broker lost finds the cluster short. The next test gets the whole cluster.
            bootstrap = ",".join(n.bootstrap for n in cluster)
            return log("%s: %s", name, wait_ready(node.process, lambda: kafka_cluster_whole(bootstrap, 3), 120))  # noqa: B023 - called here
    starters = {
        "mariadb": start_mariadb,
        "postgres": start_postgres,
        "minio": start_minio,
        "spark-master": start_spark_cluster,
        "spark-worker": start_spark_cluster,
    }
    if name not in starters:
        raise SystemExit(f"unknown service {name!r}")
    starters[name]()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start the stack (idempotent)")
    p_up.add_argument("--only", default=",".join(SERVICES), help="comma-separated subset of " + ",".join(SERVICES))
    p_up.add_argument("--kafka-cluster", action="store_true", help="also start the 3-broker cluster (RF 3, min ISR 2)")
    p_up.add_argument("--spark-cluster", action="store_true", help="also start a Spark standalone master + worker")
    p_up.add_argument(
        "--fresh",
        action="store_true",
        help="stop and delete the data first (clean): CI's test session starts from empty services, not from the "
        "thousands of topics and tables earlier runs left (they slow a broker's start and every test after)",
    )
    sub.add_parser("down", help="stop every service")
    sub.add_parser("status", help="round-trip every running service")
    p_clean = sub.add_parser("clean", help="stop and delete data")
    p_clean.add_argument("--all", action="store_true", help="also delete the jar caches")
    sub.add_parser("env", help="print AIRFLOW_CONN_* exports for this stack")
    p_kill = sub.add_parser("kill", help="SIGKILL one service (fault injection)")
    p_kill.add_argument("service")
    p_start = sub.add_parser("start", help="start one service again and wait until ready")
    p_start.add_argument("service")
    sub.add_parser(
        "pair-up",
        help="start a MariaDB primary + GTID replica pair (ports %d, %d), not part of up" % MARIADB_PAIR_PORTS,
    )
    sub.add_parser("pair-down", help="stop the pair of pair-up and delete its data")
    args = parser.parse_args(argv)

    if args.command == "up":
        only = tuple(s for s in args.only.split(",") if s)
        unknown = set(only) - set(SERVICES)
        if unknown:
            parser.error(f"unknown services {sorted(unknown)}; choose from {SERVICES}")
        if args.fresh:
            clean()
        up(only, cluster=args.kafka_cluster, spark_cluster=args.spark_cluster)
    elif args.command == "down":
        down()
    elif args.command == "status":
        return status()
    elif args.command == "clean":
        clean(args.all)
    elif args.command == "env":
        for key, value in connection_env().items():
            print(f"export {key}='{value}'")
    elif args.command == "kill":
        process_by_name(args.service).kill()
    elif args.command == "start":
        start_by_name(args.service)
    elif args.command == "pair-up":
        mariadb_pair("pair")
    elif args.command == "pair-down":
        for server in (
            MariadbServer("pair-primary", HOME / "pairs" / "pair" / "primary", MARIADB_PAIR_PORTS[0], 101),
            MariadbServer("pair-replica", HOME / "pairs" / "pair" / "replica", MARIADB_PAIR_PORTS[1], 102),
        ):
            server.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
