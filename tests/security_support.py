"""Secrets that are unique marker strings, and a sampler of every process's arguments: the leak tests' tools."""

from __future__ import annotations

import json
import re
import threading
import uuid
from pathlib import Path

import psycopg2

from tests.mysql_support import connect

REPO = Path(__file__).resolve().parent.parent
# The test pipelines' topics start with these: the documented "your pipelines' topics" row is granted on them.
LEAK_TOPIC_PREFIXES = ("leak-", "sec-")


def documented_acls(principal: str, topic_prefixes=LEAK_TOPIC_PREFIXES) -> list:
    """Return the ACL bindings docs/security.md lists ("Kafka ACLs"), for ``principal``: nothing more.

    A row naming a literal (in backticks) is granted on it; the pipelines' topics row on each of ``topic_prefixes``.
    """
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    section = (REPO / "docs" / "security.md").read_text().split("## Kafka ACLs", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    kinds = {
        "Topic": ResourceType.TOPIC,
        "TransactionalId": ResourceType.TRANSACTIONAL_ID,
        "Group": ResourceType.GROUP,
        "Cluster": ResourceType.BROKER,
    }
    bindings = []
    for resource, pattern, name, operations, _ in [[cell.strip() for cell in row] for row in rows[1:]]:
        literal = re.match(r"`([^`]+)`", name)
        names = [literal.group(1)] if literal else list(topic_prefixes)
        pattern_type = ResourcePatternType.PREFIXED if pattern == "prefixed" else ResourcePatternType.LITERAL
        for target in names:
            for operation in operations.split(", "):
                op = AclOperation[re.sub(r"(?<!^)(?=[A-Z])", "_", operation).upper()]
                bindings.append(
                    AclBinding(kinds[resource], target, pattern_type, principal, "*", op, AclPermissionType.ALLOW)
                )
    assert len(bindings) >= 10, f"docs/security.md lists too few ACLs to be read right: {bindings}"
    return bindings


class ProcessArguments(threading.Thread):
    """Sample every process's command line (what ``ps -eo args`` shows) until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[str] = set()
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    self.seen.add(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    pass  # the process ended
            self.samples += 1


def marker_users(stack, name: str) -> dict[str, str]:
    """Give a Kafka SCRAM user, a MariaDB user and a PostgreSQL role new passwords that are marker strings.

    The users persist across runs (only their passwords change): the PostgreSQL role owns a schema of its name,
    where its sink and offsets tables land, apart from the other tests' tables. Each test has users of its own
    (``name``): two tests changing one user's password at once refuse each other's logins.
    """
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    secrets = {kind: f"LEAKMARK{kind}{uuid.uuid4().hex}" for kind in ("kafka", "mysql", "postgres")}
    user, db_user = f"eo-{name}", f"eo_{name}"
    admin = AdminClient({"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"})  # the super user's listener
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), secrets["kafka"].encode()
    )
    admin.alter_user_scram_credentials([upsert])[user].result(30)
    # Exactly the ACLs docs/security.md lists: the templates and operators run with them (on a broker that
    # denies the rest). Earlier runs granted ALL on every topic, group and transactional id: taken back.
    broad = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{user}", None, AclOperation.ALL, AclPermissionType.ANY
    )
    for future in admin.delete_acls([broad]).values():
        future.result(30)
    for future in admin.create_acls(documented_acls(f"User:{user}")).values():
        future.result(30)
    cur = connect(stack).cursor()
    cur.execute("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s REQUIRE SSL", (db_user, secrets["mysql"]))
    cur.execute("ALTER USER %s@'%%' IDENTIFIED BY %s REQUIRE SSL", (db_user, secrets["mysql"]))
    cur.execute(f"GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR, REPLICATION CLIENT ON *.* TO `{db_user}`@'%'")
    # The server's superuser over its socket (local trust): the stack's user may not create roles.
    pg = psycopg2.connect(
        host=str(stack.HOME / "postgres"), port=stack.POSTGRES_PORT, user="postgres", dbname=stack.DB_NAME
    )
    pg.autocommit = True
    with pg.cursor() as pcur:
        pcur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (db_user,))
        if pcur.fetchone() is None:
            pcur.execute(f"CREATE ROLE {db_user} LOGIN")
        # A member of the stack's TLS role: pg_hba refuses it any connection without TLS, like that role.
        pcur.execute(f"GRANT {stack.TLS_USER} TO {db_user}")
        pcur.execute(f"ALTER ROLE {db_user} PASSWORD %s", (secrets["postgres"],))
        pcur.execute(f"CREATE SCHEMA IF NOT EXISTS {db_user} AUTHORIZATION {db_user}")
        pcur.execute(f"ALTER ROLE {db_user} SET search_path = {db_user}")
    pg.close()
    ca = str(stack.tls_files()["ca.pem"])
    return {
        "secrets": secrets,
        "AIRFLOW_CONN_KAFKA_LEAK": json.dumps(
            {"conn_type": "kafka", "extra": {**stack.kafka_secure_client_config(user, secrets["kafka"])}}
        ),
        "AIRFLOW_CONN_MYSQL_LEAK": json.dumps(
            {
                "conn_type": "mysql",
                "host": stack.HOST,
                "port": stack.MARIADB_PORT,
                "login": db_user,
                "password": secrets["mysql"],
                "schema": stack.DB_NAME,
                "extra": {"ssl": {"ca": ca}},
            }
        ),
        "AIRFLOW_CONN_POSTGRES_LEAK": json.dumps(
            {
                "conn_type": "postgres",
                "host": stack.HOST,
                "port": stack.POSTGRES_PORT,
                "login": db_user,
                "password": secrets["postgres"],
                "schema": stack.DB_NAME,
                "extra": {"sslmode": "verify-full", "sslrootcert": ca},
            }
        ),
    }
