"""MySqlFullLoadOperator(tables=[...]): tables of every key shape in ONE Spark application, under a writer,
its driver group SIGKILLed right after a table's Delta commit (before its manifest knows it), then retried.

The oracle, per table: one Delta commit per load (a publish attempted twice commits once); a table published
before the kill is not read again by the retry (its chunks keep their staged files and positions); the busy
table (a writer inserts, updates, deletes and holds transactions open throughout) equals the source AS OF each
chunk's own recorded binlog position, the quiet ones equal the source row by row; no key twice. A later run
leaves loaded tables as they are (no Spark started); a re-snapshot of two tables killed after its first publish
and retried reloads each of them exactly once and reads no other.
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.full_load.staging import Staging
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from exactly_once_provider.sinks import delta_commit
from tests.fault_support import ConcurrentWriter, check
from tests.integration.provider.full_load.test_full_load_concurrent import _binlog_row_events, _in_chunk, _state_at
from tests.mysql_support import connect, unique_name

pytestmark = pytest.mark.timeout(900)

CHUNK_ROWS = 300
BUSY_ROWS = 1199  # 4 chunks (more if the writer's inserts land before the plan)
# Read in this order, in waves of chunks_per_job * CHUNK_ROWS = 600 expected rows: words, one and busy's first
# chunk share the first wave; busy (the third table published) is complete after its own waves.
SHAPES = {
    "words": ("(k VARCHAR(20) PRIMARY KEY, n INT)", [(f"w{i:03d}", i) for i in range(40)]),
    "one": ("(id INT PRIMARY KEY, v INT)", [(7, 70)]),
    "busy": ("(id BIGINT PRIMARY KEY, v INT NOT NULL, s VARCHAR(8) NOT NULL)", None),
    "pairs": ("(a INT, b VARCHAR(10), v INT, PRIMARY KEY (a, b))", [(i // 3, f"b{i % 3}", i) for i in range(450)]),
    "empty": ("(id INT PRIMARY KEY, v INT)", []),
}


def _context(run_id: str) -> dict:
    return {"ti": SimpleNamespace(dag_id="eo_whole_db"), "run_id": run_id}


def _operator(stack, names, lake, **kwargs) -> MySqlFullLoadOperator:
    return MySqlFullLoadOperator(
        task_id="full_load",
        tables=names,
        schema=stack.DB_NAME,
        sink_path=str(lake / "{table}"),
        chunk_rows=CHUNK_ROWS,
        chunks_per_job=2,
        spark_conf=stack.spark_conf(),
        **kwargs,
    )


def _killed(stack, names, lake, run_id: str, fault: str, **kwargs) -> None:
    env = {"EO_FAULT_AT": fault, "EO_FAULT_ACTION": "kill-group"}  # the driver, its JVM and spark-submit
    with pytest.raises(AirflowException):
        _operator(stack, names, lake, env_vars=env, **kwargs).execute(_context(run_id))


def _versions(path) -> list[int]:
    return sorted(version for version, _ in delta_commit.commits(str(path)))


def test_tables_in_one_application_killed_after_a_publish_resume_table_by_table(
    stack, spark, airflow_connections, tmp_path, fault_outcome, caplog
):
    suffix = unique_name("wdb")
    names = {shape: f"{suffix}_{shape}" for shape in SHAPES}
    conn = connect(stack)
    cur = conn.cursor()
    for shape, (ddl, rows) in SHAPES.items():
        cur.execute(f"CREATE TABLE `{names[shape]}` {ddl}")
        if rows:
            cur.executemany(f"INSERT INTO `{names[shape]}` VALUES ({', '.join(['%s'] * len(rows[0]))})", rows)
    busy = names["busy"]
    cur.executemany(f"INSERT INTO `{busy}` VALUES (%s, %s, 'init')", [(i, i) for i in range(1, BUSY_ROWS + 1)])
    cur.execute(f"ANALYZE TABLE {', '.join(f'`{n}`' for n in names.values())}")  # row estimates size the waves
    cur.fetchall()
    lake = tmp_path / "lake"
    order = list(names.values())
    writer = ConcurrentWriter(stack, busy, first_new_id=10**7, existing=BUSY_ROWS).start()
    try:
        # 1. Killed right after the third table's commit: words and one are published and recorded, busy is
        #    committed but its manifest does not know it, pairs and empty are planned, not published.
        _killed(stack, order, lake, "run-1", "full_load_published:3")
        staged = {n: Staging(str(lake / n) + "._eo_full_load").load() for n in order}
        assert [bool(staged[names[s]]["published"]) for s in ("words", "one", "busy")] == [True, True, False]
        assert _versions(lake / busy) == [0] and not (lake / names["pairs"] / "_delta_log").exists()
        finished = {n: dict(staged[n]["done"]) for n in order if staged[n]}
        # 2. The retry of the same run: nothing published is read or committed again.
        with caplog.at_level(logging.INFO):
            result = _operator(stack, order, lake).execute(_context("run-1"))
        assert set(result["tables"]) == set(order) and result["skipped"] == []
        for shape in ("words", "one", "busy"):
            loaded = result["tables"][names[shape]]
            assert loaded["already_published"] is True, (shape, loaded)
            assert Staging(str(lake / names[shape]) + "._eo_full_load").load()["done"] == finished[names[shape]]
        assert result["tables"][names["pairs"]]["already_published"] is False
        for n in order:
            assert _versions(lake / n) == [0], f"{n}: the load is ONE Delta commit"
        # 3. A later run leaves every loaded table as it is, without starting a Spark application.
        later = _operator(stack, order, lake)
        assert later.execute(_context("run-2")) == {"tables": {}, "skipped": order}
        assert later._submit_settings == {}, "nothing to load, yet spark-submit was prepared"
        assert all(_versions(lake / n) == [0] for n in order)
        first = {n: read_handoff(str(lake / n)).load_id for n in order}
        # 4. A re-snapshot of two tables (the rendered Param), killed after its first publish, then retried: each
        #    of the two ONE new commit, the others not read.
        again = json.dumps([names["pairs"], busy])
        _killed(stack, order, lake, "run-3", "full_load_published:1", reload_tables=again)
        reload = _operator(stack, order, lake, reload_tables=again).execute(_context("run-3"))
        assert set(reload["tables"]) == {names["pairs"], busy} and len(reload["skipped"]) == 3
        for n in order:
            again_loaded = n in (names["pairs"], busy)
            assert _versions(lake / n) == ([0, 1] if again_loaded else [0]), n
            assert (read_handoff(str(lake / n)).load_id != first[n]) == again_loaded, n
    finally:
        ops = writer.stop()

    for shape, (_, rows) in SHAPES.items():
        if shape == "busy":
            continue
        loaded = sorted(tuple(r) for r in spark.read.format("delta").load(str(lake / names[shape])).collect())
        assert [r[: len(rows[0]) if rows else 0] for r in loaded] == sorted(rows), shape
        assert all(not r[-1] for r in loaded), f"{shape}: a loaded row is a tombstone"
    cur.execute(f"SELECT id, v, s FROM `{busy}`")
    final = {row[0]: (row[1], row[2]) for row in cur.fetchall()}
    handoff = read_handoff(str(lake / busy))
    events = _binlog_row_events(stack, busy, handoff.min_position)
    assert ops > 50, f"the writer must change the busy table during the loads ({ops} operations)"
    loaded = [(r.id, r.v, r.s) for r in spark.read.format("delta").load(str(lake / busy)).collect()]
    expected = []
    for entry in handoff.chunks:
        expected += [(k, *v) for k, v in _state_at(final, events, entry.position).items() if _in_chunk(k, entry.chunk)]
    check(fault_outcome, expected, loaded)
    assert len(loaded) == len({row[0] for row in loaded}), "a key was loaded twice"
    for n in order:
        cur.execute(f"DROP TABLE `{n}`")
    conn.close()
