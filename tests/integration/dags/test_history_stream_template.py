"""The history -> stream template end to end through ``airflow dags test`` while a writer runs: the first run
loads the table and captures the first increment, later runs continue from committed offsets, a
``full_reload`` run replaces the table under writes, and after the writer stops the table equals the source
row by row (checked by the reconciliation AND by an independent replay of the Delta tables here)."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from decimal import Decimal

import pytest

from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.reconcile.sides import version_of
from tests import spark_job_support as jobs
from tests.mysql_support import connect
from tests.template_support import TemplateDag

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]
ROWS = 3000


def _writer(stack, table: str, stop: threading.Event, counts: dict) -> None:
    conn = connect(stack)
    cur = conn.cursor()
    rng = random.Random(11)
    while not stop.is_set():
        roll = rng.random()
        if roll < 0.4:
            cur.execute(f"INSERT INTO {table} (amount, currency, note) VALUES (%s, %s, 'live')",
                        (Decimal(rng.randrange(1, 10**6)) / 100, rng.choice(["EUR", "USD", "CNY"])))
        elif roll < 0.85:
            cur.execute(f"UPDATE {table} SET amount = amount + 1, note = NULL WHERE id = %s",
                        (rng.randint(1, ROWS),))
        else:
            cur.execute("START TRANSACTION")
            cur.execute(f"DELETE FROM {table} WHERE id = %s", (rng.randint(1, ROWS),))
            cur.execute(f"UPDATE {table} SET currency = 'GBP' WHERE id = %s", (rng.randint(1, ROWS),))
            cur.execute("COMMIT")
        counts["ops"] += 1
        time.sleep(0.02)
    conn.close()


def _effective_rows(full_load: str, changes: str) -> dict[int, tuple]:
    """Replay the sink here, independently of the reconciliation: full load + newer changes per key."""
    loaded = read_handoff(full_load)
    base = {r[0]: r[1:] for r in jobs.arrow_rows(jobs.delta_live_files(full_load), ("id", "amount", "currency", "note"))}
    assert len(base) == loaded.rows, "a key is in the full load twice"
    rows = jobs.arrow_rows(jobs.delta_live_files(changes), ("pk", "source_version", "deleted", "record_value"))
    assert len({r[0] for r in rows}) == len(rows), "a key is in the changes table twice"
    for _, version, deleted, value in rows:
        record = json.loads(value)
        image = record["after"] or record["before"]
        key = int(image["id"])
        chunk = next(c for c in loaded.chunks if (c.chunk.lower is None or (key,) > tuple(c.chunk.lower))
                     and (c.chunk.upper is None or (key,) <= tuple(c.chunk.upper)))
        if version < version_of(chunk.position):
            continue  # already in the snapshot (a change from before a full reload)
        if deleted:
            base.pop(key, None)
        else:
            after = record["after"]
            base[key] = (Decimal(after["amount"]), after["currency"], after["note"])
    return base


def test_history_then_stream_with_full_reload_under_writes(airflow_home, stack, tmp_path):
    table = f"hs_{uuid.uuid4().hex[:6]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL,"
                " currency CHAR(3) NOT NULL, note VARCHAR(20) NULL)")
    cur.executemany(f"INSERT INTO {table} (amount, currency, note) VALUES (%s, %s, %s)",
                    [(Decimal(i) / 4, ("EUR", "USD")[i % 2], f"n{i}") for i in range(ROWS)])
    full_load, changes = str(tmp_path / "orders"), str(tmp_path / "changes")
    dag = TemplateDag(airflow_home, tmp_path / "dags", f"eo_hs_{table}", "exactly_once_provider.templates.history_stream.history_stream_dag", {
        "dag_id": f"eo_hs_{table}", "schema": stack.DB_NAME, "table": table, "key_column": "id",
        "pipeline": f"hs-{table}", "full_load_path": full_load, "changes_path": changes,
        "checkpoint_location": str(tmp_path / "checkpoint"), "start_date": "2026-01-01T00:00:00+00:00",
        "chunk_rows": 1000, "topic_partitions": 2, "spark_conf": stack.spark_conf(), "retries": 0})
    stop, counts = threading.Event(), {"ops": 0}
    thread = threading.Thread(target=_writer, args=(stack, table, stop, counts))
    thread.start()
    try:
        first = dag.test()  # the full load under writes, then the first increment
        assert "rows as Delta version" in first and "CLEAN" in first, first[-4000:]
        before = read_handoff(full_load).load_id
        reload = dag.test(conf={"full_reload": True})
        assert read_handoff(full_load).load_id != before, "full_reload did not take a new snapshot"
        assert "CLEAN" in reload, reload[-4000:]
    finally:
        stop.set()
        thread.join()
    final = dag.test()  # an increment after the reload: continues from committed offsets
    assert "rows as Delta version" not in final, "a plain rerun must not load the table again"
    assert "CLEAN" in final and "in_flight 0" in final, final[-4000:]
    assert counts["ops"] > 50, counts
    cur.execute(f"SELECT id, amount, currency, note FROM {table}")
    source = {r[0]: tuple(r[1:]) for r in cur.fetchall()}
    conn.close()
    assert _effective_rows(full_load, changes) == source
