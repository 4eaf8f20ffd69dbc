"""Secrets that are unique marker strings, and a sampler of every process's arguments: the leak tests' tools."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import psycopg2

from tests.mysql_support import connect


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


def marker_users(stack) -> dict[str, str]:
    """Give a Kafka SCRAM user, a MariaDB user and a PostgreSQL role new passwords that are marker strings.

    The users persist across runs (only their passwords change): the PostgreSQL role owns a schema of its name,
    where its sink and offsets tables land, apart from the other tests' tables.
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

    secrets = {kind: f"LEAKMARK{kind}{uuid.uuid4().hex}" for kind in ("kafka", "mysql", "postgres")}
    user, db_user = "eo-leak", "eo_leak"
    admin = AdminClient({"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"})  # the super user's listener
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), secrets["kafka"].encode()
    )
    admin.alter_user_scram_credentials([upsert])[user].result(30)
    bindings = [
        AclBinding(
            kind, "*", ResourcePatternType.LITERAL, f"User:{user}", "*", AclOperation.ALL, AclPermissionType.ALLOW
        )
        for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)
    ]
    for future in admin.create_acls(bindings).values():
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
