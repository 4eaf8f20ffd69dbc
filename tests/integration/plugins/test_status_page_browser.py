"""The status page in a real Airflow API server, logged in through headless Chromium, against live data.

Demo-like data: a produce task commits records and offsets through the ledger; the committed records
(read back with read_committed) are committed by the product's PostgreSQL sink with their Kafka end offsets;
more records arrive after that (so the pipeline lags); a watermark window is published and re-extracted
(version 2). A second flow commits binlog-style positions through the ledger and four batches into a Delta
table, each batch one round behind the producer (so the lag chart has something to show). Each figure on the
page is then compared with what the test reads itself from Kafka, PostgreSQL, MariaDB and the Delta log. The
screenshots go to ``$EO_ARTIFACTS`` (default ``artifacts/``).

Budget: no Spark session here (a cold one costs 40-60 s on the shared 2-core box): the batch reaches
``PostgresSink.commit`` as Arrow, which is what the sink takes from Spark (``df.select(...).toArrow()``).
The Delta and files sinks and the full-load records are read by the same page code from their own
commit logs; tests/unit/plugins covers those sections, the sinks' own tests cover the writes.
The API server starts (and serializes the DAGs) while the data is prepared.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import MySQLdb
import psycopg2
import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ready_
from selenium.webdriver.support.ui import WebDriverWait

from exactly_once_provider.kafka.offsets import read_committed_offset
from exactly_once_provider.operators.kafka_produce import SourceRecord, TransactionalProduceOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator
from exactly_once_provider.plugins.links import PipelineStatusLink
from exactly_once_provider.sinks.base import BatchCommit
from exactly_once_provider.sinks.postgres import PostgresSink
from tests.kafka_support import new_topic

REPO = Path(__file__).resolve().parents[3]
CHROMEDRIVER = "/usr/bin/chromedriver"
USER, PASSWORD = "operator", "eo-browser-test"

DAG_FILE = """
import pendulum
from airflow.sdk import DAG, Param
from exactly_once_provider.operators.kafka_produce import TransactionalProduceOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator

with DAG("ui_stream", schedule=None, start_date=pendulum.datetime(2026, 1, 1), params={"pipeline": Param(%(p)r)}):
    TransactionalProduceOperator(task_id="produce", topic=%(topic)r, pipeline="{{ params.pipeline }}",
                                 delivery_mode="exactly_once", producer_function="builtins.iter",
                                 offsets_topic=%(ledger)r)
    SparkKafkaToSinkOperator(task_id="to_postgres", pipeline="{{ params.pipeline }}", topics=%(topic)r,
                             sink="postgres", sink_table=%(pg_table)r, checkpoint_location="/tmp/unused")

with DAG("ui_flow", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
    TransactionalProduceOperator(task_id="capture", topic=%(flow_topic)r, pipeline=%(p_flow)r,
                                 delivery_mode="exactly_once", producer_function="builtins.iter",
                                 offsets_topic=%(ledger)r)
    SparkKafkaToSinkOperator(task_id="apply", pipeline=%(p_flow)r + "-apply", topics=%(flow_topic)r, sink="delta",
                             sink_path=%(delta)r, checkpoint_location="/tmp/unused")

with DAG("ui_settle", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
    WatermarkExtractOperator(task_id="extract", table=%(table)r, cursor_column="updated_at", cursor_kind="timestamp",
                             topic=%(wm_topic)r, pipeline=%(p_wm)r, offsets_topic=%(ledger)r)
"""


class ArrowBatch:
    """A committed batch as the sink receives it from Spark: ``select(columns).toArrow()``."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def select(self, *columns: str) -> ArrowBatch:
        return ArrowBatch(self.table.select(list(columns)))

    def toArrow(self) -> pa.Table:  # noqa: N802 - Spark's name
        return self.table


def _numbers(resume_after, count):
    for n in range((resume_after or 0) + 1, count + 1):
        yield SourceRecord(offset=n, key=f"k{n % 7}", value=json.dumps({"n": n}))


def _positions(resume_after, count):
    """Records whose source offsets are binlog positions with GTIDs, as a capture commits them."""
    done = 0 if resume_after is None else (resume_after["pos"] - 4) // 100
    for n in range(done + 1, count + 1):
        yield SourceRecord(
            offset={"file": "binlog.000001", "pos": 4 + n * 100, "gtid": f"0-1-{n}"},
            key=f"k{n}",
            value=json.dumps({"n": n}),
        )


def _consumer(bootstrap: str, isolation: str = "read_committed") -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )


def _end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    # read_uncommitted: a read_committed client reports the last stable offset, which stays before the last
    # transaction until its commit markers are written -- after commit_transaction has returned.
    consumer = _consumer(bootstrap, "read_uncommitted")
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        consumer.close()


def _committed_batch(bootstrap: str, topic: str, ends: dict[int, int]) -> pa.Table:
    """Read the topic's committed records up to ``ends`` (read_committed), as the sink's columns."""
    consumer = _consumer(bootstrap)
    rows = []
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        pending, deadline = {p for p, end in ends.items() if end > 0}, time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                rows.append(
                    (topic, message.partition(), message.offset(), message.key().decode(), message.value().decode())
                )
            # Done with a partition once the consumer's position passed its end (the commit markers included):
            # an end-of-partition event can come at the last stable offset, before the last transaction's
            # markers are written (commit_transaction returns before they are).
            for position in consumer.position([TopicPartition(topic, p) for p in list(pending)]):
                if position.offset >= ends[position.partition]:
                    pending.discard(position.partition)
    finally:
        consumer.close()
    assert not pending, f"partitions {pending} not read to {ends}"
    return pa.table(
        list(zip(*rows)), names=["kafka_topic", "kafka_partition", "kafka_offset", "record_key", "record_value"]
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def names(stack, tmp_path):
    tag = uuid.uuid4().hex[:6]
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    return {
        "p": f"ui_orders_{tag}",
        "p_wm": f"ui_settle_{tag}",
        "bootstrap": bootstrap,
        "p_flow": f"ui_cdc_{tag}",
        "flow_topic": new_topic(bootstrap, prefix="uiflow"),
        "delta": str(tmp_path / "delta"),
        "topic": new_topic(bootstrap, partitions=2, prefix="ui"),
        "wm_topic": new_topic(bootstrap, prefix="uiwm"),
        "ledger": f"eo-offsets-ui-{tag}",
        "pg_table": f"ui_orders_{tag}",
        "table": f"ui_src_{tag}",
    }


@pytest.fixture
def api_server(names, airflow_home, tmp_path):
    """A real Airflow API server (simple auth manager, one viewer) serving the demo DAGs; starts in background."""
    home = tmp_path / "airflow"
    home.mkdir()
    shutil.copy(Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db", home / "airflow.db")  # already migrated
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "ui_demo.py").write_text(DAG_FILE % names)
    (home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
    port = _free_port()
    env = {
        **airflow_home,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
    }
    airflow = str(Path(sys.executable).parent / "airflow")
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("reserialize", "api-server")}
    # The DAGs reach the metadata DB the way the dag processor puts them there; the server needs them only when
    # the page is read, so both start together (each Airflow start-up costs tens of seconds on a loaded box).
    processes = {
        "reserialize": subprocess.Popen(
            [airflow, "dags", "reserialize"],
            env=env,
            stdout=logs["reserialize"],
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ),
        "api-server": subprocess.Popen(
            [airflow, "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            env=env,
            stdout=logs["api-server"],
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ),
    }
    url = f"http://127.0.0.1:{port}"

    def log_tail(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text()[-3000:]

    def ready() -> str:
        assert processes["reserialize"].wait(300) == 0, log_tail("reserialize")
        deadline = time.monotonic() + 180
        while True:
            assert processes["api-server"].poll() is None, log_tail("api-server")
            try:
                urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=2)
                return url
            except OSError:
                assert time.monotonic() < deadline, log_tail("api-server")
                time.sleep(0.5)

    try:
        yield ready, env
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(30)
        for log in logs.values():
            log.close()


@pytest.fixture
def demo(names, api_server, stack, airflow_connections):
    """Produce through the ledger, commit a batch into the PostgreSQL sink, then lag; publish a window twice."""
    d = names

    def produce(count):
        return TransactionalProduceOperator(
            task_id="produce",
            topic=d["topic"],
            pipeline=d["p"],
            delivery_mode="exactly_once",
            producer_function=_numbers,
            producer_function_kwargs={"count": count},
            offsets_topic=d["ledger"],
            max_records_per_transaction=200,
            commit_interval_ms=100_000,
        ).execute({})

    produce(600)
    ends = _end_offsets(d["bootstrap"], d["topic"], 2)
    sink = PostgresSink(
        d["pg_table"],
        d["p"],
        {
            "host": stack.HOST,
            "port": stack.POSTGRES_PORT,
            "dbname": stack.DB_NAME,
            "user": stack.DB_USER,
            "password": stack.DB_PASSWORD,
        },
    )
    sink.ensure_tables()
    batch = _committed_batch(d["bootstrap"], d["topic"], ends)
    assert sink.commit(ArrowBatch(batch), BatchCommit(d["p"], "ui-ckpt", 0, {d["topic"]: ends}))
    produce(750)  # 150 more records after the sink commit: the pipeline now lags

    with MySQLdb.connect(
        host=stack.HOST,
        port=stack.MARIADB_PORT,
        user=stack.DB_USER,
        password=stack.DB_PASSWORD,
        database=stack.DB_NAME,
        autocommit=True,
    ) as conn:
        cur = conn.cursor()
        cur.execute(
            f"CREATE TABLE {d['table']} (id BIGINT PRIMARY KEY, amount INT NOT NULL, updated_at "
            "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (updated_at))"
        )
        cur.executemany(
            f"INSERT INTO {d['table']} (id, amount, updated_at) VALUES (%s, %s, %s)",
            [(i, i * 10, "2026-11-19 10:00:00") for i in range(1, 41)],
        )
    for reextract in (False, True):
        WatermarkExtractOperator(
            task_id="extract",
            table=d["table"],
            cursor_column="updated_at",
            cursor_kind="timestamp",
            topic=d["wm_topic"],
            pipeline=d["p_wm"],
            offsets_topic=d["ledger"],
            batch_id="2026-11-20",
            interval_end="2026-11-20T00:00:00+00:00",
            reextract=reextract,
            safety_lag=0,
        ).execute({})
    _delta_flow(d, stack)
    from exactly_once_provider.reconcile.results import _DDL

    with (
        psycopg2.connect(
            host=stack.HOST,
            port=stack.POSTGRES_PORT,
            dbname=stack.DB_NAME,
            user=stack.DB_USER,
            password=stack.DB_PASSWORD,
        ) as conn,
        conn.cursor() as cur,
    ):
        cur.execute(_DDL)
        cur.execute(
            "INSERT INTO eo_reconciliation (name, started_at, finished_at, status) VALUES "
            "(%s, now(), now(), 'clean') RETURNING status",
            (d["p_flow"],),
        )
        d["reconciliation"] = cur.fetchone()[0]
    conn.close()
    return d


def _delta_flow(d: dict, stack) -> None:
    """Four rounds: produce 100, 200, 300, 400 records with binlog positions, each time committing the previous
    round into the Delta table (the sink's commit: Parquet files + a commit carrying the stream's marker)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from exactly_once_provider.sinks.delta_commit import append_with_files, create_with_files

    apply, root, committed, total, rows_before = f"{d['p_flow']}-apply", Path(d["delta"]), {0: 0}, 0, 0
    root.mkdir()
    previous: dict[int, int] = {}  # the end offsets of the round before (none before the first)
    for round_ in range(4):
        total += 100 * (round_ + 1)
        TransactionalProduceOperator(
            task_id="capture",
            topic=d["flow_topic"],
            pipeline=d["p_flow"],
            delivery_mode="exactly_once",
            producer_function=_positions,
            producer_function_kwargs={"count": total},
            offsets_topic=d["ledger"],
            max_records_per_transaction=1000,
            commit_interval_ms=100_000,
        ).execute({})
        ends = _end_offsets(d["bootstrap"], d["flow_topic"], 1)
        if round_:  # commit what the previous round produced: one round behind
            batch = _committed_batch(d["bootstrap"], d["flow_topic"], previous)
            # the records of the previous round only (a fetch may bring records past its end as well)
            batch = batch.filter(
                pc.and_(
                    pc.greater_equal(batch["kafka_offset"], committed[0]), pc.less(batch["kafka_offset"], previous[0])
                )
            )
            name = f"part-{round_}.parquet"
            pq.write_table(batch, root / name)
            files = [{"name": name, "bytes": (root / name).stat().st_size, "rows": batch.num_rows}]
            marker = {
                f"eo_stream:{apply}": {
                    **BatchCommit(apply, "ui-ckpt", round_, {d["flow_topic"]: previous}).to_json(),
                    "rows_before": rows_before,
                }
            }
            schema = json.dumps(
                {
                    "type": "struct",
                    "fields": [
                        {"name": f, "type": t, "nullable": True, "metadata": {}}
                        for f, t in (
                            ("kafka_topic", "string"),
                            ("kafka_partition", "long"),
                            ("kafka_offset", "long"),
                            ("record_key", "string"),
                            ("record_value", "string"),
                        )
                    ],
                }
            )
            commit = create_with_files if round_ == 1 else append_with_files
            commit(str(root), schema, files, marker, "ui-test", round_)
            rows_before += batch.num_rows
            committed = dict(previous)
            time.sleep(1.2)  # the commits' times a second apart: rows/s between them
        previous = ends


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1500,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def _screenshot(driver, name: str, full: bool = True) -> Path:
    folder = Path(os.environ.get("EO_ARTIFACTS") or REPO / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    if full:  # measured in a small window: scrollHeight is at least the window's height
        driver.set_window_size(1500, 800)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1500, min(max(height + 40, 800), 6000))
    else:
        driver.set_window_size(1500, 1000)
    path = folder / name
    driver.save_screenshot(str(path))
    return path


def _cells(driver, pipeline: str, section: str, column: str) -> list[str]:
    # textContent: the pipelines' tables are folded inside their flow card (text of hidden elements is "")
    css = f'td[data-pipeline="{pipeline}"][data-section="{section}"][data-column="{column}"]'
    return [e.get_attribute("textContent") for e in driver.find_elements(By.CSS_SELECTOR, css)]


def _delta_log(path: str) -> list[tuple[float, int, int]]:
    """Read the Delta log here, with json only: (commit time s, the stream's rows in total, its next offset)."""
    found = []
    for file in sorted((Path(path) / "_delta_log").glob("*.json")):
        info = next(json.loads(line)["commitInfo"] for line in file.read_text().splitlines() if '"commitInfo"' in line)
        body = next(iter(json.loads(info["userMetadata"]).values()))
        found.append(
            (
                info["timestamp"] / 1000,
                body["rows_before"] + int(info["operationMetrics"]["numOutputRows"]),
                next(iter(body["offsets"].values()))["0"],
            )
        )
    return found


def _record_times(bootstrap: str, topic: str, end: int) -> list[tuple[int, float]]:
    """Return (offset, record time s) of every committed record of partition 0 up to ``end``."""
    consumer = _consumer(bootstrap)
    found = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and consumer.position([TopicPartition(topic, 0)])[0].offset < end:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                found.append((message.offset(), message.timestamp()[1] / 1000))
    finally:
        consumer.close()
    return found


def _seconds(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]


def test_status_page_shows_the_live_figures_after_logging_in(demo, api_server, browser, stack, monkeypatch):
    ready, env = api_server
    url = ready()
    anonymous = urllib.request.Request(f"{url}/exactly-once/api/pipelines")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(anonymous, timeout=30)
    assert refused.value.code == 401  # behind Airflow's authentication

    browser.get(f"{url}/exactly-once/")
    wait = WebDriverWait(browser, 60)
    wait.until(ready_.presence_of_element_located((By.CSS_SELECTOR, "input[type=password]")))
    assert "/auth/login" in browser.current_url
    browser.find_element(By.CSS_SELECTOR, "input[name=username], input[type=text]").send_keys(USER)
    browser.find_element(By.CSS_SELECTOR, "input[type=password]").send_keys(PASSWORD)
    read_started = time.time()
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    p, p_wm = demo["p"], demo["p_wm"]
    wait.until(ready_.presence_of_element_located((By.CSS_SELECTOR, f'div.card[data-pipeline="{p}"]')))
    shot = _screenshot(browser, "exactly_once_status_page.png")
    assert shot.stat().st_size > 10_000
    _check_delta_flow(browser, demo, read_started)

    # Ledger: the committed offset, sequence and records, read independently.
    committed = read_committed_offset({"bootstrap.servers": demo["bootstrap"]}, p, "0", demo["ledger"])
    assert committed.offset == 750
    assert _cells(browser, p, "ledger", "offset") == ["750"]
    assert _cells(browser, p, "ledger", "sequence") == [str(committed.sequence)]
    assert _cells(browser, p, "ledger", "records") == [str(committed.records)]

    # The PostgreSQL sink's commit and the lag behind it, read with plain SQL and a Kafka client.
    with (
        psycopg2.connect(
            host=stack.HOST,
            port=stack.POSTGRES_PORT,
            dbname=stack.DB_NAME,
            user=stack.DB_USER,
            password=stack.DB_PASSWORD,
        ) as conn,
        conn.cursor() as cur,
    ):
        cur.execute(
            "SELECT kafka_partition, next_offset, batch_id FROM eo_stream_offsets WHERE pipeline = %s "
            "ORDER BY kafka_partition",
            (p,),
        )
        sink_rows = cur.fetchall()
        cur.execute(f"SELECT count(*) FROM {demo['pg_table']}")
        sink_count = cur.fetchone()[0]
    conn.close()
    assert sink_count == 600
    assert _cells(browser, p, "sink", "batch id") == [str(sink_rows[0][2])]
    assert _cells(browser, p, "sink", "rows in sink") == ["600"]
    ends = _end_offsets(demo["bootstrap"], demo["topic"], 2)
    assert _cells(browser, p, "lag", "end offset") == [str(ends[0]), str(ends[1])]
    lags = [ends[partition] - next_offset for partition, next_offset, _ in sink_rows]
    assert sum(lags) >= 150  # 150 records (and their transaction markers) arrived after the commit
    assert _cells(browser, p, "lag", "lag") == [str(lag) for lag in lags]
    assert _cells(browser, p, "summary", "lag") == [str(sum(lags))]
    card = browser.find_element(By.CSS_SELECTOR, f'div.card[data-pipeline="{p}"]')
    assert card.get_attribute("data-state") == "behind"

    # The settlement window: batch 2026-11-20 re-extracted as version 2, with the source's row count.
    with MySQLdb.connect(
        host=stack.HOST, port=stack.MARIADB_PORT, user=stack.DB_USER, password=stack.DB_PASSWORD, database=stack.DB_NAME
    ) as conn:
        cur = conn.cursor()
        cur.execute(f"SELECT count(*) FROM {demo['table']}")
        source_rows = cur.fetchone()[0]
    assert _cells(browser, p_wm, "windows", "batch") == ["2026-11-20"]
    assert _cells(browser, p_wm, "windows", "version") == ["2"]
    assert _cells(browser, p_wm, "windows", "rows") == [str(source_rows)] == ["40"]
    assert _cells(browser, p_wm, "ledger", "version") == ["2"]

    # The operators' extra link (computed where the task runs, with the same [api] base_url) opens this page
    # filtered to the pipeline.
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", env["AIRFLOW__API__BASE_URL"])
    link = PipelineStatusLink().get_link(
        SparkKafkaToSinkOperator(
            task_id="t",
            pipeline=p,
            topics=demo["topic"],
            sink="postgres",
            sink_table=demo["pg_table"],
            checkpoint_location="/tmp/unused",
        ),
        ti_key=None,
    )
    assert link == f"{url}/exactly-once/?pipeline={p}"
    browser.get(link)
    assert [c.get_attribute("data-pipeline") for c in browser.find_elements(By.CSS_SELECTOR, "div.card")] == [p]
    # The stream's link opens its flow's card, with the producer's pipeline: the docs' screenshot, unfolded.
    browser.get(f"{url}/exactly-once/?pipeline={demo['p_flow']}-apply")
    assert [c.get_attribute("data-flow") for c in browser.find_elements(By.CSS_SELECTOR, "div.flow")] == [
        demo["p_flow"]
    ]
    browser.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
    _screenshot(browser, "exactly_once_flow_page.png")

    # Inside the Airflow UI: the navigation entry frames the same page.
    browser.get(f"{url}/plugin/exactly-once")
    frame = wait.until(ready_.presence_of_element_located((By.CSS_SELECTOR, "iframe")))
    browser.switch_to.frame(frame)
    wait.until(ready_.presence_of_element_located((By.CSS_SELECTOR, f'div.card[data-pipeline="{p}"]')))
    browser.switch_to.default_content()
    _screenshot(browser, "exactly_once_in_airflow_ui.png", full=False)


def _check_delta_flow(browser, demo, read_started: float) -> None:
    """The producer and its Delta stream on one card; every figure and chart point read here independently."""
    pf = demo["p_flow"]
    read_done = time.time()
    flow = browser.find_element(By.CSS_SELECTOR, f'div.flow[data-flow="{pf}"]')
    assert f"pipelines: {pf}, {pf}-apply" in flow.text
    assert demo["flow_topic"] in flow.text and demo["delta"] in flow.text
    flow.screenshot(str(_screenshot_path("exactly_once_flow_card.png")))

    def figure(name: str):
        return browser.find_element(By.CSS_SELECTOR, f'div.fig[data-flow="{pf}"][data-figure="{name}"]')

    def points(chart: str) -> list:
        element = browser.find_element(By.CSS_SELECTOR, f'div.chart[data-flow="{pf}"][data-chart="{chart}"]')
        assert element.find_elements(By.CSS_SELECTOR, "svg polyline"), f"{chart}: no chart drawn"
        return json.loads(element.get_attribute("data-points"))

    # The position: the ledger's committed binlog position, not JSON; its GTID on hover.
    committed = read_committed_offset({"bootstrap.servers": demo["bootstrap"]}, pf, "0", demo["ledger"])
    position = figure("position")
    assert (
        position.find_element(By.TAG_NAME, "b").text
        == f"binlog.000001:{committed.offset['pos']}"
        == "binlog.000001:100004"
    )
    assert position.get_attribute("title") == f"GTID {committed.offset['gtid']}" == "GTID 0-1-1000"

    # The Delta log, read here: three commits (rounds 1-3), each one round behind the producer.
    log = _delta_log(demo["delta"])
    assert [rows for _, rows, _ in log] == [100, 300, 600]
    ends = _end_offsets(demo["bootstrap"], demo["flow_topic"], 1)
    assert figure("lag").find_element(By.TAG_NAME, "b").text == f"{ends[0] - log[-1][2]:,}"
    throughput = (log[-1][1] - log[0][1]) / (log[-1][0] - log[0][0])
    assert float(figure("throughput").find_element(By.TAG_NAME, "b").text.split()[0]) == pytest.approx(
        throughput, abs=0.51
    )
    rates = points("rows_per_second")
    assert [v for _, v in rates] == pytest.approx(
        [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(log, log[1:])], rel=1e-3
    )

    # The lag at each commit: records written before the commit's time that it had not applied.
    times = _record_times(demo["bootstrap"], demo["flow_topic"], ends[0])
    expected = []
    for at, _, next_offset in log:
        later = [offset for offset, stamp in times if stamp >= at]
        expected.append(max(0, (min(later) if later else ends[0]) - next_offset))
    assert [v for _, v in points("lag")] == expected
    assert expected[0] > 0 and all(v > 0 for v in expected)

    # Freshness: how long the first record the sink has not applied has waited, at the time the page was read.
    first_unapplied = next(stamp for offset, stamp in times if offset >= log[-1][2])
    shown = _seconds(figure("freshness").find_element(By.TAG_NAME, "b").text)
    low, high = read_started - first_unapplied, read_done - first_unapplied
    slack = 1 if shown < 90 else 60
    assert low - slack <= shown <= high + slack, (shown, low, high)

    # The last reconciliation stored for the producer's name, read with SQL.
    assert figure("reconciliation").find_element(By.TAG_NAME, "b").text == demo["reconciliation"]


def _screenshot_path(name: str) -> Path:
    folder = Path(os.environ.get("EO_ARTIFACTS") or REPO / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name
