"""Benchmark (not a test): full load rows/s, single stream and parallel chunks, vs mysqldump of the same table.

Run: ``make bench-full-load`` (BENCH_ROWS=1000000 by default). Uses the local stack's MariaDB and Spark
local[2]; the table is created once with MariaDB's sequence engine and reused.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import STACK as stack  # noqa: E402

TABLE = "bench_full_load"


def _prepare(rows: int) -> None:
    import MySQLdb

    conn = MySQLdb.connect(host=stack.HOST, port=stack.MARIADB_PORT, user=stack.DB_USER,
                           password=stack.DB_PASSWORD, database=stack.DB_NAME, autocommit=True)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE IF NOT EXISTS `{TABLE}` (id BIGINT PRIMARY KEY, a INT NOT NULL, b VARCHAR(32) NOT NULL,"
                " c DECIMAL(12,2) NOT NULL, d DATETIME NOT NULL)")
    cur.execute(f"SELECT COUNT(*) FROM `{TABLE}`")
    if cur.fetchone()[0] != rows:
        cur.execute(f"TRUNCATE `{TABLE}`")
        for start in range(0, rows, 250_000):
            end = min(rows, start + 250_000)
            cur.execute(f"INSERT INTO `{TABLE}` SELECT seq, seq % 1000, CONCAT('name-', seq), seq / 100, "
                        f"'2024-01-01' + INTERVAL seq SECOND FROM seq_{start + 1}_to_{end}")
    conn.close()


def _cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system, with reaped children) of ``pids`` and every live descendant of them."""
    parents, times = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    total, todo, seen = 0, list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in times:
            continue
        seen.add(pid)
        total += times[pid]
        todo += [child for child, parent in parents.items() if parent == pid]
    return total / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent by this benchmark's processes (driver, Spark JVM, Python workers, mysqldump) and by the
    MariaDB server during a measured step: on a shared machine the wall clock also counts other work."""

    def __init__(self) -> None:
        self.server_pid = stack.process_by_name("mariadb").pid()

    def __enter__(self) -> "CpuMeter":
        self._client, self._server = _cpu_seconds([os.getpid()]), _cpu_seconds([self.server_pid])
        return self

    def __exit__(self, *exc) -> None:
        self.client = _cpu_seconds([os.getpid()]) - self._client
        self.server = _cpu_seconds([self.server_pid]) - self._server


def _mysqldump(workdir: Path) -> float:
    dump = shutil.which("mariadb-dump") or shutil.which("mysqldump")
    env = {**os.environ, "MYSQL_PWD": stack.DB_PASSWORD}
    started = time.monotonic()
    with open(workdir / "dump.sql", "wb") as out:
        subprocess.run([dump, "--single-transaction", "--quick", "--skip-lock-tables", "-h", stack.HOST,
                        "-P", str(stack.MARIADB_PORT), "-u", stack.DB_USER, stack.DB_NAME, TABLE],
                       env=env, stdout=out, check=True)
    return time.monotonic() - started


def _spark():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master("local[2]").config("spark.driver.memory", "1g")
               .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC")
               # As the operator's session (provider/spark_session.py) on local[2]: Delta rebuilds a table's
               # state with spark.sql.shuffle.partitions tasks, not its default 50.
               .config("spark.sql.shuffle.partitions", "2").config("spark.databricks.delta.snapshotPartitions", "2")
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
    for key, value in stack.spark_conf().items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _load(spark, workdir: Path, name: str, chunk_rows: int, chunks_per_job: int) -> tuple[float, int, dict]:
    from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
    from exactly_once_provider.hooks.mysql_source import MySqlSourceHook

    request = FullLoadRequest(schema=stack.DB_NAME, table=TABLE, sink_path=str(workdir / name),
                              chunk_rows=chunk_rows, chunks_per_job=chunks_per_job, expected_rows_per_second=1000)
    started = time.monotonic()
    result = run_full_load(spark, MySqlSourceHook(), request, progress=lambda p: None)
    return time.monotonic() - started, result.handoff.rows, result.stats.get("phases", {})


def main() -> int:
    rows = int(os.environ.get("BENCH_ROWS", "1000000"))
    logging.basicConfig(level=logging.WARNING)
    stack.up(only=("mariadb",))
    os.environ.update(stack.connection_env())
    _prepare(rows)
    session_started = time.monotonic()
    spark = _spark()
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.monotonic() - session_started
    workdir = Path(tempfile.mkdtemp(prefix="eo-bench-"))
    try:
        # JVM, Delta classes and BOTH local[2] Python workers warm (one chunk each, in one wave): a worker that
        # starts inside a measured load imports pyarrow and MySQLdb there.
        warm_s, _, warm_phases = _load(spark, workdir, "warmup", -(-rows // 2), 2)
        with CpuMeter() as dump_cpu:
            dump_s = _mysqldump(workdir)
        with CpuMeter() as single_cpu:
            single_s, single_rows, single_phases = _load(spark, workdir, "single", rows + 1, 1)
        parallel_chunks = 8
        with CpuMeter() as parallel_cpu:
            parallel_s, parallel_rows, parallel_phases = _load(spark, workdir, "parallel",
                                                               -(-rows // parallel_chunks), parallel_chunks)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    assert single_rows == parallel_rows == rows, (single_rows, parallel_rows, rows)
    print(f"\nfull load benchmark: {rows} rows (id BIGINT PK, INT, VARCHAR(32), DECIMAL(12,2), DATETIME), "
          f"Spark local[2], MariaDB on the same 2-core machine")
    print(f"{'method':<46} {'seconds':>8} {'rows/s':>10} {'vs mysqldump':>13} {'CPU s: client':>14} {'server':>7}")
    base = rows / dump_s
    for label, seconds, cpu in (("mysqldump --single-transaction --quick (file)", dump_s, dump_cpu),
                                ("full load -> Delta, 1 chunk (single stream)", single_s, single_cpu),
                                (f"full load -> Delta, {parallel_chunks} chunks (parallel, local[2])", parallel_s,
                                 parallel_cpu)):
        print(f"{label:<46} {seconds:>8.1f} {rows / seconds:>10.0f} {rows / seconds / base:>12.2f}x "
              f"{cpu.client:>14.2f} {cpu.server:>7.2f}")
    print("CPU s = CPU seconds the step cost this benchmark's processes (driver, Spark JVM and Python workers, "
          "mysqldump) and the MariaDB server: unlike the wall clock, not inflated by other work on the machine")
    print(f"\nwhere the time goes (seconds; Spark session start {session_s:.1f} s and the warm-up load "
          f"{warm_s:.1f} s are outside every figure above)")
    print(f"{'load':<12} {'prepare':>8} {'read+stage':>11} {'publish':>8} {'other':>6} {'total':>6}  publish mode")
    for label, seconds, phases in (("warm-up", warm_s, warm_phases), ("1 chunk", single_s, single_phases),
                                   (f"{parallel_chunks} chunks", parallel_s, parallel_phases)):
        if not phases:  # a build of the load that does not time its phases (comparison runs)
            print(f"{label:<12} {'-':>8} {'-':>11} {'-':>8} {'-':>6} {seconds:>6.2f}")
            continue
        other = seconds - phases["prepare"] - phases["read_and_stage"] - phases["publish"]
        print(f"{label:<12} {phases['prepare']:>8.2f} {phases['read_and_stage']:>11.2f} {phases['publish']:>8.2f} "
              f"{other:>6.2f} {seconds:>6.2f}  {phases['publish_mode']}")
    print("prepare = preflight, column list, chunk planning, manifest; read+stage = the Spark job(s): each chunk in "
          "its own snapshot, MariaDB -> mysqlclient -> Arrow -> a staged Parquet file; publish = the one Delta "
          "commit carrying the handoff (and the manifest update)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
