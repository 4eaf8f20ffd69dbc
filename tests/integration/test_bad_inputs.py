"""Bad inputs on the real services: each is refused with an error that says what to fix, and nothing is lost.

What is covered elsewhere (not repeated here): binlog settings on the real server and, for log_bin=OFF which
cannot be switched at runtime, on a fake cursor (tests/integration/provider/source/test_preflight.py,
tests/unit/provider/source/test_preflight.py); tables without a primary key, restricted users and hostile names
in the preflight (same files, tests/integration/provider/source/test_watermark.py); a record larger than the topic
allows through the hook and the produce operator (tests/integration/hooks/test_kafka_producer.py,
tests/integration/operators/test_kafka_produce.py); a missing Spark connection of the streaming operator
(tests/unit/operators/test_spark_stream.py). This module fills the gaps: hostile identifiers end to end
through the full load and the watermark extract, DST-ambiguous DATETIME values, missing or wrong connection
ids of every operator, windows and records above the broker limits, and credentials in log lines (one full
load carries the hostile names, the DST values and the distinctive password: the default suite's time).
"""

from __future__ import annotations

import json
import logging
import uuid
from urllib.parse import quote

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from exactly_once_provider.full_load.staging import Staging
from exactly_once_provider.kafka.offsets import read_committed_offset
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from exactly_once_provider.operators.kafka_produce import SourceRecord, TransactionalProduceOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator
from tests.integration.provider.source.test_preflight import admin  # noqa: F401 - a fixture
from tests.kafka_support import QUIET, new_topic, read_all
from tests.mysql_support import load_time_zone

HOSTILE_TABLE = "q'u\"o`te;--"
# Delta refuses ' ,;{}()\n\t=' in column names (without column mapping): quotes and backticks it takes.
KEY, VALUE, WHEN, CURSOR = "k`e'y\"", "va`l'ue\"", "wh`e'n\"", "up`d'at\""
# Europe/Berlin: the repeated hour of the fall-back (ambiguous) and the skipped hour of the spring-forward.
AMBIGUOUS = [
    "2026-10-25 01:59:59.999999",
    "2026-10-25 02:00:00.000000",
    "2026-10-25 02:30:00.000000",
    "2026-10-25 02:59:59.000000",
    "2026-10-25 03:00:00.000000",
    "2026-03-29 02:30:00.000000",
]


@pytest.fixture
def bootstrap(stack, airflow_connections):
    return f"{stack.HOST}:{stack.KAFKA_PORT}"


def _id(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _insert_an_hour_ago(admin, sql: str, rows: list[tuple]) -> None:
    """Insert with cursor values an hour old: a window that other writers' open transactions hold back (the
    late-commit guard) still covers them."""
    admin.execute("SET TIMESTAMP = UNIX_TIMESTAMP(NOW(6)) - 3600")
    try:
        admin.executemany(sql, rows)
    finally:
        admin.execute("SET TIMESTAMP = DEFAULT")


def _published(bootstrap: str, topic: str) -> list[dict]:
    return [v for v in (json.loads(r) for r in read_all(bootstrap, topic)) if "marker" not in v]


# ---------------------------------------------------------------- hostile identifiers, DST, credentials
def _distinctive_user(stack, admin, monkeypatch, bootstrap, table: str) -> tuple[str, str]:
    """Create a MariaDB user with a distinctive password; connections cred_mysql, cred_wrong, cred_kafka."""
    # URL-special characters too: the full load's native reader passes the password inside a URL (quoted)
    user, password = f"cred_{uuid.uuid4().hex[:6]}", f"Pw-{uuid.uuid4().hex}-s@c:r/t%?#&+secret"
    admin.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (user, password))
    for grant in (
        f"SELECT ON {_id(stack.DB_NAME)}.{_id(table)}",
        "BINLOG MONITOR ON *.*",
        "REPLICATION SLAVE ON *.*",
        "PROCESS ON *.*",
    ):
        admin.execute(f"GRANT {grant} TO `{user}`@'%'")
    good = {
        "conn_type": "mysql",
        "host": stack.HOST,
        "port": stack.MARIADB_PORT,
        "login": user,
        "password": password,
        "schema": stack.DB_NAME,
    }
    monkeypatch.setenv("AIRFLOW_CONN_CRED_MYSQL", json.dumps(good))
    monkeypatch.setenv("AIRFLOW_CONN_CRED_WRONG", json.dumps({**good, "password": password + "-wrong"}))
    monkeypatch.setenv(
        "AIRFLOW_CONN_CRED_KAFKA",
        json.dumps(
            {
                "conn_type": "kafka",
                "extra": {"bootstrap.servers": bootstrap, "sasl.username": user, "sasl.password": password},
            }
        ),
    )
    return user, password


def test_hostile_names_dst_datetimes_and_a_secret_password_through_the_full_load_and_the_watermark_extract(
    stack, spark, bootstrap, admin, tmp_path, caplog, capfd, monkeypatch
):
    """
    One end-to-end run (one full load: the default suite's time) of three bad inputs:

    * quotes, backticks and semicolons in the table and column names;
    * DATETIME values of the repeated and the skipped hour (no zone: they must arrive verbatim);
    * a connection user with a distinctive password (and a wrong one): no log record, stdout/stderr line (the
      Spark JVM's included) or exception text may hold it.
    """
    table = f"{HOSTILE_TABLE}{uuid.uuid4().hex[:6]}"
    admin.execute(
        f"CREATE TABLE {_id(table)} ({_id(KEY)} INT PRIMARY KEY, {_id(VALUE)} VARCHAR(40) NOT NULL, "
        f"{_id(WHEN)} DATETIME(6) NOT NULL, {_id(CURSOR)} TIMESTAMP(6) NOT NULL "
        f"DEFAULT CURRENT_TIMESTAMP(6), KEY ({_id(CURSOR)}))"
    )
    rows = [(i, f"v;'`\"{i}", when) for i, when in enumerate(AMBIGUOUS, 1)]
    _insert_an_hour_ago(
        admin, f"INSERT INTO {_id(table)} ({_id(KEY)}, {_id(VALUE)}, {_id(WHEN)}) VALUES (%s, %s, %s)", rows
    )
    user, password = _distinctive_user(stack, admin, monkeypatch, bootstrap, table)
    try:
        capfd.readouterr()
        with caplog.at_level(logging.DEBUG):
            sink = str(tmp_path / "sink")
            result = MySqlFullLoadOperator(
                task_id="load",
                table=table,
                sink_path=sink,
                chunk_rows=2,
                chunks_per_job=4,
                mysql_conn_id="cred_mysql",
                spark_conf=stack.spark_conf(),
            ).execute({})
            topic, ledger = new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
            window = WatermarkExtractOperator(
                task_id="extract",
                table=table,
                source_partition="hostile",
                cursor_column=CURSOR,
                cursor_kind="timestamp",
                topic=topic,
                pipeline="bad-inputs",
                offsets_topic=ledger,
                safety_lag=0,
                batch_id="w1",
                mysql_conn_id="cred_mysql",
                kafka_config_id="cred_kafka",
            ).execute({})
            errors = []
            for run in (
                lambda: MySqlFullLoadOperator(
                    task_id="load2", table=table, sink_path=str(tmp_path / "s2"), mysql_conn_id="cred_wrong"
                ).execute({}),
                lambda: _extract(mysql="cred_wrong").execute({}),
            ):
                with pytest.raises(Exception) as error:
                    run()
                errors.append(f"{error.value!r} {error.value}")
                logging.getLogger("test").exception("expected failure", exc_info=error.value)
        out, err = capfd.readouterr()

        assert result["rows"] == len(rows) and len(result["chunks"]) >= 2
        loaded = sorted(
            (r[KEY], r[VALUE], r[WHEN].strftime("%Y-%m-%d %H:%M:%S.%f"))
            for r in spark.read.format("delta").load(sink).collect()
        )
        assert loaded == rows
        assert window["rows"] == len(rows)
        published = sorted((r["row"][KEY], r["row"][VALUE], r["row"][WHEN]) for r in _published(bootstrap, topic))
        assert published == rows

        captured = {"log records": caplog.text, "stdout": out, "stderr": err, "exceptions": "\n".join(errors)}
        assert len(caplog.text) > 1000 and len(out + err) > 1000, "nothing was captured: the check would be empty"
        assert "Access denied" in captured["exceptions"]
        assert {e["reader"] for e in Staging(sink + "._eo_full_load").load()["done"].values()} == {"native"}
        leaked = [name for name, text in captured.items() if password in text or quote(password, safe="") in text]
        assert not leaked, f"the password appears in: {leaked}"
    finally:
        admin.execute(f"DROP USER `{user}`@'%'")
        admin.execute(f"DROP TABLE {_id(table)}")


def test_a_dst_zone_datetime_cursor_warns_and_publishes_the_repeated_hour_once(stack, bootstrap, admin, capfd):
    load_time_zone(admin, "Europe/Berlin", stack.DB_NAME)
    table = f"dst_{uuid.uuid4().hex[:6]}"
    admin.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, at DATETIME(6) NOT NULL, KEY (at))")
    admin.executemany(f"INSERT INTO {table} VALUES (%s, %s)", list(enumerate(AMBIGUOUS, 1)))
    try:
        topic, ledger = new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
        capfd.readouterr()
        window = WatermarkExtractOperator(
            task_id="extract",
            table=table,
            cursor_column="at",
            cursor_kind="timestamp",
            topic=topic,
            pipeline="bad-inputs-dst",
            offsets_topic=ledger,
            safety_lag=0,
            batch_id="dst",
            datetime_time_zone="Europe/Berlin",
        ).execute({})
        log = "".join(capfd.readouterr())  # the operator's task log (structlog, printed)
        assert "observes daylight saving time" in log and "Use a TIMESTAMP column" in log, log[-3000:]
        assert window["rows"] == len(AMBIGUOUS)
        assert sorted(r["cursor"] for r in _published(bootstrap, topic)) == sorted(AMBIGUOUS)
    finally:
        admin.execute(f"DROP TABLE {table}")


def test_a_column_name_delta_cannot_store_is_refused_before_any_chunk_is_read(
    stack, spark, airflow_connections, admin, tmp_path
):
    table = f"bad_col_{uuid.uuid4().hex[:6]}"
    admin.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, `net amount; EUR` INT)")
    admin.execute(f"INSERT INTO {table} VALUES (1, 10), (2, 20)")
    try:
        sink = tmp_path / "sink"
        with pytest.raises(ValueError, match=r"net amount; EUR.*Delta table cannot hold.*rename"):
            MySqlFullLoadOperator(
                task_id="load", table=table, sink_path=str(sink), spark_conf=stack.spark_conf()
            ).execute({})
        assert not (sink / "_delta_log").exists() and not (tmp_path / "sink._eo_full_load").exists()
    finally:
        admin.execute(f"DROP TABLE {table}")


# ------------------------------------------------------------------------------ connection ids
def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _produce(conn_id):
    return TransactionalProduceOperator(
        task_id="p",
        topic=_unique("t-none"),
        pipeline=_unique("p"),
        delivery_mode="exactly_once",
        producer_function=lambda resume_after: [],
        kafka_config_id=conn_id,
    )


def _extract(mysql="mysql_default", kafka="kafka_default"):
    return WatermarkExtractOperator(
        task_id="w",
        table=_unique("t"),
        cursor_column="u",
        cursor_kind="timestamp",
        topic=_unique("t-none"),
        pipeline=_unique("p"),
        batch_id="b",
        mysql_conn_id=mysql,
        kafka_config_id=kafka,
    )


def _full_load(mysql="mysql_default", spark="spark_default"):
    return MySqlFullLoadOperator(
        task_id="f", table=_unique("t"), sink_path="/nonexistent/sink", mysql_conn_id=mysql, spark_conn_id=spark
    )


def _stream(kafka="kafka_default", spark="spark_default"):
    return SparkKafkaToSinkOperator(
        task_id="s",
        pipeline=_unique("p"),
        topics=["t"],
        sink="files",
        sink_path="/tmp/x",
        checkpoint_location="/tmp/c",
        kafka_conn_id=kafka,
        spark_conn_id=spark,
    )


@pytest.mark.parametrize(
    "operator,message",
    [
        (lambda: _produce("no_such_kafka"), r"no_such_kafka"),
        (lambda: _produce("mysql_default"), r"mysql_default.*bootstrap\.servers"),
        (lambda: _extract(mysql="no_such_mysql"), r"no_such_mysql"),
        (lambda: _extract(mysql="kafka_default"), r"kafka_default.*no host"),
        (lambda: _full_load(mysql="no_such_mysql"), r"no_such_mysql"),
        (lambda: _full_load(spark="no_such_spark"), r"no_such_spark"),
        (lambda: _stream(kafka="no_such_kafka"), r"no_such_kafka"),
        (lambda: _stream(kafka="mysql_default"), r"mysql_default.*bootstrap\.servers"),
        (lambda: _stream(spark="no_such_spark"), r"no_such_spark"),
    ],
    ids=[
        "produce-missing-kafka",
        "produce-kafka-is-mysql",
        "extract-missing-mysql",
        "extract-mysql-is-kafka",
        "full-load-missing-mysql",
        "full-load-missing-spark",
        "stream-missing-kafka",
        "stream-kafka-is-mysql",
        "stream-missing-spark",
    ],
)
def test_a_missing_or_wrong_connection_id_is_named_in_the_error(airflow_connections, operator, message):
    with pytest.raises(Exception, match=message) as error:
        operator().execute({})
    assert type(error.value).__name__ in (
        "AirflowNotFoundException",
        "ValueError",
        "AirflowException",
        "SourceConfigurationError",
    ), repr(error.value)


# ------------------------------------------------------------------------------ broker limits
def test_a_window_larger_than_the_topic_allows_fails_clearly_and_commits_nothing(stack, bootstrap, admin):
    table = f"big_{uuid.uuid4().hex[:6]}"
    admin.execute(
        f"CREATE TABLE {table} (id INT PRIMARY KEY, payload MEDIUMTEXT NOT NULL, u TIMESTAMP(6) NOT NULL "
        "DEFAULT CURRENT_TIMESTAMP(6), KEY (u))"
    )
    _insert_an_hour_ago(
        admin, f"INSERT INTO {table} (id, payload) VALUES (%s, %s)", [(1, "small"), (2, "x" * 20_000), (3, "small too")]
    )
    topic, ledger = f"small-{uuid.uuid4().hex[:8]}", f"ledger-{uuid.uuid4().hex[:8]}"
    kafka_admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})  # kept alive until the topic exists
    kafka_admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "8192"})])[topic].result(30)
    try:
        with pytest.raises(Exception, match=r"(?s)TOO_LARGE.*max\.message\.bytes") as error:
            WatermarkExtractOperator(
                task_id="w",
                table=table,
                cursor_column="u",
                cursor_kind="timestamp",
                topic=topic,
                pipeline="big-window",
                offsets_topic=ledger,
                safety_lag=0,
                batch_id="w1",
                producer_config={"batch.size": 4096},
            ).execute({})
        assert "nothing of this batch is visible" in str(error.value).lower()
        assert read_all(bootstrap, topic) == []
        assert read_committed_offset({"bootstrap.servers": bootstrap}, "big-window", table, ledger) is None
    finally:
        admin.execute(f"DROP TABLE {table}")


def test_a_record_above_the_producer_limit_fails_the_task_clearly_and_commits_nothing(bootstrap):
    topic, ledger = new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"

    def source(resume_after):
        yield SourceRecord(offset=1, value="fine")
        yield SourceRecord(offset=2, value="x" * 2_000_000)  # above message.max.bytes (1 MB by default)

    with pytest.raises(Exception, match=r"(?s)2000000 bytes.*MSG_SIZE_TOO_LARGE.*message\.max\.bytes"):
        TransactionalProduceOperator(
            task_id="p",
            topic=topic,
            pipeline="big",
            delivery_mode="exactly_once",
            producer_function=source,
            offsets_topic=ledger,
        ).execute({})
    assert read_all(bootstrap, topic) == []
    assert read_committed_offset({"bootstrap.servers": bootstrap}, "big", "0", ledger) is None
