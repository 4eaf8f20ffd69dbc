"""Benchmark (not a test): full load rows/s, single stream and parallel chunks, vs Spark JDBC and mysqldump.

The baseline is what a user would pick instead to put a MySQL table into a lakehouse: Spark's JDBC source
partitioned on the key (``spark.read.jdbc`` with ``partitionColumn``/``numPartitions``; MariaDB Connector/J from
Maven Central through ``spark.jars.packages``) over the same TLS as the full load's connection, written to the same
kind of Delta table. ``mysqldump`` (a text dump, not a table) stays as the reference floor.

Run: ``make bench-full-load`` (BENCH_ROWS=1000000 by default) or ``python benchmarks/bench_full_load.py [--rows N |
--sizes 100000,1000000,10000000] [--repeats R] [--chunks C]``. Uses the local stack's MariaDB and Spark local[2]
(one session for every size); the table is filled with MariaDB's sequence engine per size and reused when it
already has that size. Every step's peak resident memory is sampled (every 0.1 s): the Spark JVM (driver and
local executors) and the sum of its Python workers — neither may grow with the table. Writes
``benchmarks/results/full_load-*.json``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _support

from tests.conftest import STACK as stack

TABLE = "bench_full_load"
# The JDBC baseline's driver, resolved by Spark (Ivy) from Maven Central once, then cached in ~/.ivy2*.
JDBC_DRIVER = "org.mariadb.jdbc:mariadb-java-client:3.5.7"


def _prepare(rows: int) -> None:
    import MySQLdb

    conn = MySQLdb.connect(
        host=stack.HOST,
        port=stack.MARIADB_PORT,
        user=stack.DB_USER,
        password=stack.DB_PASSWORD,
        database=stack.DB_NAME,
        autocommit=True,
    )
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE IF NOT EXISTS `{TABLE}` (id BIGINT PRIMARY KEY, a INT NOT NULL, b VARCHAR(32) NOT NULL,"
        " c DECIMAL(12,2) NOT NULL, d DATETIME NOT NULL)"
    )
    cur.execute(f"SELECT COUNT(*) FROM `{TABLE}`")
    if cur.fetchone()[0] != rows:
        cur.execute(f"TRUNCATE `{TABLE}`")
        for start in range(0, rows, 250_000):
            end = min(rows, start + 250_000)
            cur.execute(
                f"INSERT INTO `{TABLE}` SELECT seq, seq % 1000, CONCAT('name-', seq), seq / 100, "
                f"'2024-01-01' + INTERVAL seq SECOND FROM seq_{start + 1}_to_{end}"
            )
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


def _rss_by_kind(root: int) -> tuple[int, int]:
    """Resident bytes of the Spark JVM(s) and of the Python workers among the live descendants of ``root``."""
    parents, names = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            names[int(entry)] = stat[stat.index("(") + 1 : stat.rindex(")")]
    jvm = workers = 0
    todo, seen = [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo += [child for child, parent in parents.items() if parent == pid]
        if pid == root:
            continue
        try:
            rss = next(
                int(line.split()[1]) * 1024
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:")
            )
        except (OSError, StopIteration):
            continue
        if names.get(pid) == "java":
            jvm += rss
        elif names.get(pid, "").startswith("python"):
            workers += rss
    return jvm, workers


class PeakMemory:
    """The highest resident memory of the Spark JVM and of the Python workers while a step runs (0.1 s samples)."""

    def __enter__(self) -> PeakMemory:
        import threading

        self.jvm = self.workers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while True:
            jvm, workers = _rss_by_kind(os.getpid())
            self.jvm, self.workers = max(self.jvm, jvm), max(self.workers, workers)
            if self._stop.wait(0.1):
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class CpuMeter:
    """CPU seconds spent by this benchmark's processes (driver, Spark JVM, Python workers, mysqldump) and by the
    MariaDB server during a measured step: on a shared machine the wall clock also counts other work."""

    def __init__(self) -> None:
        self.server_pid = stack.process_by_name("mariadb").pid()

    def __enter__(self) -> CpuMeter:
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
        subprocess.run(
            [
                dump,
                "--single-transaction",
                "--quick",
                "--skip-lock-tables",
                "-h",
                stack.HOST,
                "-P",
                str(stack.MARIADB_PORT),
                "-u",
                stack.DB_USER,
                stack.DB_NAME,
                TABLE,
            ],
            env=env,
            stdout=out,
            check=True,
        )
    return time.monotonic() - started


def _spark():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # As the operator's session (provider/spark_jobs/session.py) on local[2]: Delta rebuilds a table's
        # state with spark.sql.shuffle.partitions tasks, not its default 50.
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    )
    for key, value in stack.spark_conf().items():
        builder = builder.config(key, value)
    return builder.config("spark.jars.packages", JDBC_DRIVER).getOrCreate()


def _jdbc(spark, workdir: Path, name: str, rows: int, partitions: int) -> tuple[float, int, dict]:
    """Spark's JDBC source partitioned on the key -> a Delta table (overwrite): the baseline a user would write."""
    ca = stack.tls_files()["ca.pem"]
    # jdbc:mysql (permitMysqlScheme lets Connector/J take it): Spark picks its MySQL dialect by that prefix only;
    # with jdbc:mariadb its generic one quotes columns with "..." and MariaDB reads them as string literals.
    url = (
        f"jdbc:mysql://{stack.HOST}:{stack.MARIADB_PORT}/{stack.DB_NAME}"
        f"?permitMysqlScheme&sslMode=verify-full&serverSslCert={ca}"
    )  # the full load's TLS, VERIFY_IDENTITY
    started = time.monotonic()
    frame = spark.read.jdbc(
        url,
        TABLE,
        column="id",
        lowerBound=1,
        upperBound=rows,
        numPartitions=partitions,
        properties={
            "user": stack.DB_USER,
            "password": stack.DB_PASSWORD,
            "driver": "org.mariadb.jdbc.Driver",
            "fetchsize": "10000",
        },
    )
    frame.write.format("delta").mode("overwrite").save(str(workdir / name))
    seconds = time.monotonic() - started
    return seconds, spark.read.format("delta").load(str(workdir / name)).count(), {}


def _load(
    spark, workdir: Path, name: str, chunk_rows: int | None, chunks_per_job: int | None, reader: str = "native"
) -> tuple[float, int, dict]:
    from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
    from exactly_once_provider.hooks.mysql_source import MySqlSourceHook

    request = FullLoadRequest(
        schema=stack.DB_NAME,
        table=TABLE,
        sink_path=str(workdir / name),
        chunk_rows=chunk_rows,
        chunks_per_job=chunks_per_job,
        expected_rows_per_second=1000,
        reader=reader,
    )
    started = time.monotonic()
    result = run_full_load(spark, MySqlSourceHook(), request, progress=lambda p: None)
    return time.monotonic() - started, result.handoff.rows, result.stats.get("phases", {})


class Step:
    """One measured step, run ``repeat`` times interleaved with the others; reported by its median run."""

    def __init__(self, label: str, run) -> None:
        self.label, self.run, self.runs = label, run, []

    def measure(self) -> None:
        with CpuMeter() as cpu, PeakMemory() as memory:
            seconds, rows, phases = self.run()
        self.runs.append((seconds, rows, phases, cpu, memory))

    @property
    def median(self):
        return sorted(self.runs, key=lambda r: r[0])[len(self.runs) // 2]


def _chunks_arg(parser) -> None:
    parser.add_argument(
        "--chunks", type=int, default=int(os.environ.get("BENCH_CHUNKS", "8")), help="chunks of the parallel step"
    )


def _sizes_arg(parser) -> None:
    _chunks_arg(parser)
    parser.add_argument("--sizes", default="", help="comma-separated table sizes in rows (default: --rows)")


def measure(spark, rows: int, repeat: int, parallel: int) -> tuple[list[Step], float]:
    """Fill the table with ``rows`` rows, warm up, run every step ``repeat`` times (ABBA); return steps, warm-up s."""
    _prepare(rows)
    workdir = Path(tempfile.mkdtemp(prefix="eo-bench-"))
    counter = iter(range(10**6))

    def load(chunks: int, reader: str):
        return lambda: _load(spark, workdir, f"load{next(counter)}", -(-rows // chunks) + (chunks == 1), chunks, reader)

    def dump():
        return _mysqldump(workdir), rows, {}

    def jdbc(partitions: int):
        return lambda: _jdbc(spark, workdir, f"jdbc{next(counter)}", rows, partitions)

    steps = [
        Step("Spark JDBC, 2 partitions -> Delta", jdbc(2)),
        Step(f"Spark JDBC, {parallel} partitions -> Delta", jdbc(parallel)),
        Step("mysqldump --single-transaction --quick (file)", dump),
        Step(
            "full load, the defaults (chunks sized for the table)",
            lambda: _load(spark, workdir, f"load{next(counter)}", None, None),
        ),
        Step("full load, native reader, 1 chunk", load(1, "native")),
        Step(f"full load, native reader, {parallel} chunks", load(parallel, "native")),
        Step("full load, row reader, 1 chunk", load(1, "rows")),
        Step(f"full load, row reader, {parallel} chunks", load(parallel, "rows")),
    ]
    try:
        # JVM, Delta classes and BOTH local[2] Python workers warm (one chunk each, in one wave), with each reader:
        # a worker that starts inside a measured load imports pyarrow, connectorx and MySQLdb there.
        warm_started = time.monotonic()
        for reader in ("native", "rows"):
            _load(spark, workdir, f"warmup-{reader}", -(-rows // 2), 2, reader)
        _jdbc(spark, workdir, "warmup-jdbc", rows, 2)
        warm_s = time.monotonic() - warm_started
        for r in range(repeat):
            for step in steps if r % 2 == 0 else steps[::-1]:  # ABBA
                step.measure()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for step in steps:
        assert all(run[1] == rows for run in step.runs), (step.label, [run[1] for run in step.runs])
    return steps, warm_s


def main() -> int:
    args = _support.parse_args(
        __doc__,
        rows=int(os.environ.get("BENCH_ROWS", "1000000")),
        repeats=int(os.environ.get("BENCH_REPEAT", "3")),
        extra=_sizes_arg,
    )
    sizes = [int(s) for s in args.sizes.split(",") if s] or [args.rows]
    repeat, parallel = args.repeats, args.chunks
    _support.start_stack(only=("mariadb",))
    result = _support.result_header(
        "full_load", {"rows": sizes[-1], "sizes": sizes, "repeats": repeat, "chunks": parallel}
    )
    session_started = time.monotonic()
    spark = _spark()
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.monotonic() - session_started
    measured = {}
    try:
        for rows in sizes:
            measured[rows] = measure(spark, rows, repeat, parallel)
    finally:
        spark.stop()
    table, mib = [], 1 << 20
    result["runs"] = {}
    for rows, (steps, _) in measured.items():
        jdbc_rate, dump_rate = rows / steps[0].median[0], rows / steps[2].median[0]
        for step in steps:
            seconds, _, _, cpu, memory = step.median
            label = step.label if len(sizes) == 1 else f"{rows:,} rows: {step.label}"
            table.append(
                [
                    label,
                    seconds,
                    rows / seconds,
                    rows / seconds / jdbc_rate,
                    rows / seconds / dump_rate,
                    cpu.client,
                    cpu.server,
                    max(r[4].jvm for r in step.runs) / mib,
                    max(r[4].workers for r in step.runs) / mib,
                    " / ".join(f"{r[0]:.2f}" for r in step.runs),
                ]
            )
            result["runs"][label] = [
                {
                    "seconds": r[0],
                    "cpu_client": r[3].client,
                    "cpu_server": r[3].server,
                    "peak_jvm_mib": r[4].jvm / mib,
                    "peak_python_workers_mib": r[4].workers / mib,
                    "phases": r[2],
                }
                for r in step.runs
            ]
    result["spark_session_s"] = session_s
    _support.report(
        result,
        f"Full load, {' / '.join(f'{n:,}' for n in sizes)} rows (id BIGINT PK, INT, VARCHAR(32), "
        f"DECIMAL(12,2), DATETIME), Spark local[2] (driver 1 GiB), MariaDB on the same machine; median of "
        f"{repeat} interleaved runs per step",
        [
            "method",
            "seconds",
            "rows/s",
            "x Spark JDBC, 2 partitions (target >= 1.5)",
            "x mysqldump",
            "CPU s client",
            "CPU s server",
            "peak MiB JVM",
            "peak MiB Python workers",
            "runs (s)",
        ],
        table,
        plot={"column": 3, "label": "x Spark JDBC, 2 partitions (median runs; target >= 1.5)"},
    )
    print(
        "CPU s = CPU seconds the step cost this benchmark's processes (driver, Spark JVM and Python workers, "
        "mysqldump) and the MariaDB server: unlike the wall clock, not inflated by other work on the machine. "
        "Peak MiB = the highest resident memory sampled during the step's runs (the JVM keeps the heap it grew)."
    )
    for rows, (steps, warm_s) in measured.items():
        print(
            f"\n{rows:,} rows: where the time goes (median runs, seconds; Spark session start {session_s:.1f} s and "
            f"the warm-up loads {warm_s:.1f} s are outside every figure above)"
        )
        print(f"{'load':<46} {'prepare':>8} {'read+stage':>11} {'publish':>8} {'other':>6} {'total':>6}  publish mode")
        for step in steps[3:]:
            seconds, _, phases, _, _ = step.median
            other = seconds - phases["prepare"] - phases["read_and_stage"] - phases["publish"]
            print(
                f"{step.label:<46} {phases['prepare']:>8.2f} {phases['read_and_stage']:>11.2f} "
                f"{phases['publish']:>8.2f} {other:>6.2f} {seconds:>6.2f}  {phases['publish_mode']}"
            )
    print(
        "prepare = preflight, column list, chunk planning, manifest; read+stage = the Spark job(s): each chunk in "
        "its own snapshot, MariaDB -> Arrow (connectorx, or mysqlclient rows) -> a staged Parquet file; "
        "publish = the one Delta commit carrying the handoff (and the manifest update)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
