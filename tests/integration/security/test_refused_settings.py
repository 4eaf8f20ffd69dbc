"""The secured endpoints refuse a wrong setting, and the product says which connection and what to fix.

Against the stack's SASL_SSL listener (SCRAM-SHA-512, ACLs), the MariaDB user created REQUIRE SSL and the
PostgreSQL role that may only use TLS (``hostssl``). Each refusal must name the connection and the fix, leave
nothing written, and never carry the password.
"""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest

from exactly_once_provider.connections import postgres_connection
from exactly_once_provider.errors import ServiceAccessError
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.operators.kafka_produce import SourceRecord, TransactionalProduceOperator
from tests.kafka_support import new_topic, read_all
from tests.mysql_support import connect


def numbered(resume_after, last):
    for n in range((resume_after or 0) + 1, last + 1):
        yield SourceRecord(offset=n, key=f"k{n % 7}", value=str(n))


def _produce(topic: str, ledger: str, kafka_config_id: str, last: int) -> dict:
    return TransactionalProduceOperator(
        task_id="produce",
        topic=topic,
        offsets_topic=ledger,
        pipeline=f"sec-{topic}",
        delivery_mode="exactly_once",
        producer_function=numbered,
        producer_function_args=(last,),
        max_records_per_transaction=1000,
        kafka_config_id=kafka_config_id,
    ).execute({})


def _secure_consumer_read(stack, topic: str) -> list[bytes]:
    """Read the topic read_committed over SASL_SSL as the application user (a reader the test owns)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            **stack.kafka_secure_client_config(),
            "group.id": f"sec-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values = []
        while True:
            message = consumer.poll(30)
            assert message is not None, "no end of partition within 30 s"
            if message.error():
                if message.error().name() == "_PARTITION_EOF":
                    return values
                raise AssertionError(message.error())
            values.append(message.value())
    finally:
        consumer.close()


def test_transactions_over_sasl_ssl_commit_and_resume(stack, airflow_connections):
    topic, ledger = new_topic(f"{stack.HOST}:{stack.KAFKA_PORT}", prefix="sec"), f"ledger-sec-{uuid.uuid4().hex[:8]}"
    first = _produce(topic, ledger, "kafka_secure", 1500)
    again = _produce(topic, ledger, "kafka_secure", 2100)
    assert (first["committed_offset"], first["records"]) == (1500, 1500)
    assert (again["resumed_after"], again["records"], again["committed_offset"]) == (1500, 600, 2100)
    assert _secure_consumer_read(stack, topic) == [str(n).encode() for n in range(1, 2101)]


REFUSALS = {
    # variant: (what changes in the connection, what the error must say)
    "wrong password": (
        lambda s, c: {**c, "sasl.password": "not-the-password"},
        r"refused the login of user 'eo'.*sasl\.username/sasl\.password",
    ),
    "untrusted broker certificate": (
        lambda s, c: {**c, "ssl.ca.location": str(s.tls_files()["other-ca.pem"])},
        r"not signed by a CA this connection trusts.*ssl\.ca\.location",
    ),
    "plaintext client on the TLS listener": (
        lambda s, c: {"bootstrap.servers": c["bootstrap.servers"]},
        r"security\.protocol=PLAINTEXT.*SASL_SSL",
    ),
    "user without ACLs": (
        lambda s, c: {**c, "sasl.username": s.KAFKA_DENIED_USER, "sasl.password": s.KAFKA_DENIED_PASSWORD},
        r"user 'eo-denied' has no ACL on the topic.*offsets topic",
    ),
    "user without rights on transactional ids": (
        lambda s, c: {**c, "sasl.username": s.KAFKA_NO_TXN_USER, "sasl.password": s.KAFKA_NO_TXN_PASSWORD},
        r"user 'eo-no-txn' has no ACL on the transactional id",
    ),
}


@pytest.mark.parametrize("variant", list(REFUSALS))
def test_refused_kafka_settings_name_the_connection_and_the_fix(stack, airflow_connections, monkeypatch, variant):
    change, expected = REFUSALS[variant]
    config = change(stack, stack.kafka_secure_client_config())
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_REFUSED", json.dumps({"conn_type": "kafka", "extra": config}))
    plaintext = f"{stack.HOST}:{stack.KAFKA_PORT}"  # the super user's listener: the test's own view of the broker
    topic, ledger = new_topic(plaintext, prefix="sec"), f"ledger-sec-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ServiceAccessError, match=r"Kafka connection 'kafka_refused'") as refused:
        _produce(topic, ledger, "kafka_refused", 100)
    assert re.search(expected, str(refused.value)), str(refused.value)
    assert config.get("sasl.password", "\0") not in str(refused.value)
    assert read_all(plaintext, topic, "read_uncommitted") == []  # nothing written, not even uncommitted
    # The ledger holds nothing either (a topic the refused user could create would be empty).
    from confluent_kafka.admin import AdminClient

    ledgers = AdminClient({"bootstrap.servers": plaintext}).list_topics(timeout=30).topics
    assert ledger not in ledgers or read_all(plaintext, ledger, "read_uncommitted") == []


def _mysql_conn(stack, monkeypatch, **extra) -> str:
    monkeypatch.setenv(
        "AIRFLOW_CONN_MYSQL_REFUSED",
        json.dumps(
            {
                "conn_type": "mysql",
                "host": stack.HOST,
                "port": stack.MARIADB_PORT,
                "login": stack.TLS_USER,
                "password": stack.TLS_PASSWORD,
                "schema": stack.DB_NAME,
                "extra": extra,
            }
        ),
    )
    return "mysql_refused"


def test_mysql_user_that_requires_tls_is_refused_a_plaintext_connection_with_the_fix(
    stack, airflow_connections, monkeypatch
):
    with pytest.raises(ServiceAccessError, match=r"MySQL connection 'mysql_refused'.*REQUIRE SSL.*Extra ssl") as err:
        MySqlSourceHook(mysql_conn_id=_mysql_conn(stack, monkeypatch)).server_info()
    assert stack.TLS_PASSWORD not in str(err.value)
    with MySqlSourceHook(mysql_conn_id="mysql_tls").cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        assert cur.fetchone()[1], "the mysql_tls session is not encrypted"


def test_mysql_server_certificate_from_an_unknown_ca_is_refused(stack, airflow_connections, monkeypatch):
    conn_id = _mysql_conn(stack, monkeypatch, ssl={"ca": str(stack.tls_files()["other-ca.pem"])}, ssl_mode="VERIFY_CA")
    with pytest.raises(ServiceAccessError, match=r"MySQL connection 'mysql_refused'.*TLS handshake failed.*ssl\.ca"):
        MySqlSourceHook(mysql_conn_id=conn_id).server_info()


@pytest.mark.parametrize(
    "extra,expected",
    [
        ({"sslmode": "disable"}, r"only over TLS: set the connection's Extra sslmode"),  # a plaintext client
        ({"sslmode": "verify-full", "sslrootcert": "OTHER_CA"}, r"not trusted: put the CA.*sslrootcert"),
    ],
)
def test_postgres_role_that_requires_tls_refuses_plaintext_and_unknown_cas(
    stack, airflow_connections, monkeypatch, extra, expected
):
    if extra.get("sslrootcert") == "OTHER_CA":
        extra = {**extra, "sslrootcert": str(stack.tls_files()["other-ca.pem"])}
    monkeypatch.setenv(
        "AIRFLOW_CONN_POSTGRES_REFUSED",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": stack.HOST,
                "port": stack.POSTGRES_PORT,
                "login": stack.TLS_USER,
                "password": stack.TLS_PASSWORD,
                "schema": stack.DB_NAME,
                "extra": extra,
            }
        ),
    )
    with pytest.raises(ServiceAccessError, match=r"PostgreSQL connection 'postgres_refused'.*" + expected) as err:
        postgres_connection("postgres_refused")
    assert stack.TLS_PASSWORD not in str(err.value)
    conn = postgres_connection("postgres_tls")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            assert cur.fetchone()[0] is True
    finally:
        conn.close()


TEMPLATE_REFUSALS = {k: v for k, v in REFUSALS.items() if k != "user without rights on transactional ids"}


def _template_preflight(stack, template: str, tag: str):
    """Return the task of ``template`` that checks every endpoint first, and the topics the template would write."""
    import pendulum

    start = pendulum.datetime(2026, 1, 1, tz="UTC")
    if template == "settlement":
        from exactly_once_provider.templates.settlement import settlement_dag

        topic = f"sec-settle-{tag}"
        dag = settlement_dag(
            dag_id=f"sec_settle_{tag}",
            table=f"sec_payments_{tag}",  # never read: the refusal comes first
            cursor_column="updated_at",
            group_by=["currency"],
            sum_columns=["amount"],
            pipeline=f"sec-settle-{tag}",
            topic=topic,
            sink_path=f"/nonexistent/sec-{tag}/windows",
            checkpoint_location=f"/nonexistent/sec-{tag}/checkpoint",
            report_table=f"sec_report_{tag}",
            start_date=start,
            kafka_config_id="kafka_refused",
        )
        return dag.get_task("ensure_topic"), [topic]
    from exactly_once_provider.templates.history_stream import history_stream_dag

    table = f"sec_hs_{tag}"
    conn = connect(stack)
    conn.cursor().execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v INT)")
    conn.close()
    dag = history_stream_dag(
        dag_id=f"sec_hs_{tag}",
        schema=stack.DB_NAME,
        table=table,
        pipeline=f"sec-hs-{tag}",
        table_path=f"/nonexistent/sec-{tag}/table",
        checkpoint_location=f"/nonexistent/sec-{tag}/checkpoint",
        start_date=start,
        kafka_config_id="kafka_refused",
    )
    return dag.get_task("preflight"), [f"sec-hs-{tag}.{stack.DB_NAME}.{table}"]


@pytest.mark.parametrize("variant", list(TEMPLATE_REFUSALS))
@pytest.mark.parametrize("template", ["settlement", "history_stream"])
def test_each_template_refuses_a_kafka_connection_before_anything_is_written(
    stack, airflow_connections, monkeypatch, template, variant
):
    change, expected = TEMPLATE_REFUSALS[variant]
    config = change(stack, stack.kafka_secure_client_config())
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_REFUSED", json.dumps({"conn_type": "kafka", "extra": config}))
    task, topics = _template_preflight(stack, template, uuid.uuid4().hex[:8])
    expected = expected.replace("offsets topic", "topic")  # the preflight asks for the topics first
    started = time.monotonic()
    with pytest.raises(ServiceAccessError, match=r"Kafka connection 'kafka_refused'") as refused:
        task.python_callable()
    assert time.monotonic() - started < 10, "refused only after a client timeout"
    assert re.search(expected, str(refused.value)), str(refused.value)
    assert config.get("sasl.password", "\0") not in str(refused.value)
    from confluent_kafka.admin import AdminClient

    existing = AdminClient({"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"}).list_topics(timeout=30).topics
    assert [t for t in topics if t in existing] == []  # no topic created; the tables' folders do not exist


CONNECTION_REFUSALS = [k for k in REFUSALS if "ACL" not in k and "rights" not in k]


@pytest.mark.parametrize("variant", CONNECTION_REFUSALS)
def test_the_spark_operator_refuses_a_kafka_connection_before_spark_starts(
    stack, airflow_connections, monkeypatch, tmp_path, variant
):
    from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator

    change, expected = REFUSALS[variant]
    config = change(stack, stack.kafka_secure_client_config())
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_REFUSED", json.dumps({"conn_type": "kafka", "extra": config}))
    tag = uuid.uuid4().hex[:8]
    operator = SparkKafkaToSinkOperator(
        task_id="apply",
        pipeline=f"sec-spark-{tag}",
        topics=f"sec-spark-{tag}",
        sink="delta",
        sink_path=str(tmp_path / "table"),
        checkpoint_location=str(tmp_path / "checkpoint"),
        kafka_conn_id="kafka_refused",
    )
    started = time.monotonic()
    with pytest.raises(ServiceAccessError, match=r"Kafka connection 'kafka_refused'") as refused:
        operator.execute({})
    assert time.monotonic() - started < 10, "refused only after a client timeout"
    assert re.search(expected, str(refused.value)), str(refused.value)
    assert not (tmp_path / "table").exists() and not (tmp_path / "checkpoint").exists()  # no Spark application ran
