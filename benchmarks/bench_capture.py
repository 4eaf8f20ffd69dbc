"""Benchmark (not a test): exactly-once binlog capture into Kafka vs the raw python-mysql-replication read.

For each table size of ``--sizes`` (rows; each row is inserted, in transactions of 100 rows, then updated, so
the binlog holds twice as many row changes) writes the table and notes the binlog range, then, interleaved ``--repeats`` times on that same range (the order alternates per repeat): "raw read"
iterates python-mysql-replication over it and decodes every row (the floor: no grouping, no conversion, nothing
produced; over the same TLS as the capture's connection, which the stack's ``mysql_default`` requires); "exactly_once" runs BinlogCaptureOperator in bounded mode for a fresh pipeline (transaction grouping,
type conversion, JSON change records, Kafka transactions with the ledger offset). Prints the median rows/s of
each and the ratio, by wall clock (the target) and by CPU time of this process (steadier on a loaded machine;
the capture's includes librdkafka's threads and the operator's setup). The capture's timer covers the whole
``execute`` (preflight, topic checks, ``init_transactions``, the ledger read, the loop, the last commit), as the
raw read's covers its connect; the loop alone is recorded too. Writes ``benchmarks/results/capture-*.json``.
Usage: ``make bench-capture`` or ``python benchmarks/bench_capture.py [--sizes 25000,250000] [--repeats 3]``
(50,000 and 500,000 row changes: rows/s should not fall with the binlog's size).
"""

from __future__ import annotations

import sys
import time
import uuid

import _support


def measure(stack, rows: int, repeats: int, created: list[str]) -> dict:
    """Write a table of ``rows`` rows, then run the raw read and the capture over its binlog range, interleaved."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

    from exactly_once_provider.connections import pymysql_tls
    from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator

    conn = _support.connect_source(stack)
    cur = conn.cursor()
    table = f"bench_cap_{uuid.uuid4().hex[:6]}"
    cur.execute(
        f"CREATE TABLE {table} (id INT PRIMARY KEY, account INT UNSIGNED, amount DECIMAL(12,2), "
        "note VARCHAR(40), updated_at TIMESTAMP(6) NULL, booked DATETIME(6) NULL)"
    )
    cur.execute("SHOW MASTER STATUS")
    start_file, start_pos = cur.fetchone()[:2]
    for first in range(0, rows, 100):
        n = min(100, rows - first)
        cur.execute(
            f"INSERT INTO {table} VALUES " + ", ".join(["(%s, %s, %s, %s, NOW(6), NOW(6))"] * n),
            [x for i in range(first, first + n) for x in (i, i % 997, i / 100, f"row {i}")],
        )
    for first in range(0, rows, 1000):
        cur.execute(f"UPDATE {table} SET amount = amount + 1 WHERE id >= %s AND id < %s", (first, first + 1000))
    cur.execute("SHOW MASTER STATUS")
    end_file, end_pos = cur.fetchone()[:2]
    changes = 2 * rows
    # The same TLS as the capture's connection (mysql_default of the stack: CA + VERIFY_IDENTITY): the same work.
    tls = pymysql_tls({"ca": str(stack.tls_files()["ca.pem"])}, "VERIFY_IDENTITY")

    def raw_read() -> int:
        stream = BinLogStreamReader(
            {"host": stack.HOST, "port": stack.MARIADB_PORT, "user": stack.DB_USER, "passwd": stack.DB_PASSWORD, **tls},
            server_id=4_100_000,
            resume_stream=True,
            log_file=start_file,
            log_pos=start_pos,
            blocking=False,
            is_mariadb=False,
            only_schemas=[stack.DB_NAME],
            only_tables=[table],
            enable_logging=False,
            only_events=[TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent],
        )
        read = 0
        for event in stream:
            if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                read += len(event.rows)
            if stream.log_file == end_file and stream.log_pos >= end_pos:
                break
        stream.close()
        assert read == changes, (read, changes)
        return read

    def capture() -> tuple[int, float]:
        """Run the capture once; return (rows, seconds of its loop alone)."""
        op = BinlogCaptureOperator(
            task_id="bench",
            tables=[table],
            pipeline=f"bench-cap-{uuid.uuid4().hex[:6]}",
            start_position=f"{start_file}:{start_pos}",
            progress_interval=3600,
        )
        result = op.execute({})
        assert result["rows"] == changes, (result["rows"], changes)
        created.extend(result["topics"].values())
        return result["rows"], result["seconds"]

    raw = _support.Runs("raw python-mysql-replication")
    ours = _support.Runs("exactly_once capture")
    loop = _support.Runs("exactly_once capture, loop only")

    def run_capture() -> None:
        cpu, wall = time.process_time(), time.perf_counter()
        captured, seconds = capture()
        ours.add(captured, time.perf_counter() - wall, time.process_time() - cpu)  # every setup step inside
        loop.add(captured, seconds, time.process_time() - cpu)

    capture()  # warm-up: topic creation, coordinator, imports
    for repeat in range(repeats):
        candidates = [lambda: raw.measure(raw_read), run_capture]
        for candidate in candidates if repeat % 2 == 0 else reversed(candidates):
            candidate()
    cur.execute(f"DROP TABLE {table}")
    conn.close()
    _support.delete_topics(stack, created)  # ~45 MB per run per 50,000 rows: do not fill the disk
    created.clear()
    return {
        "rows": rows,
        "changes": changes,
        "transactions": changes // 100 // 2 + rows // 1000,
        "runs": {
            r.label: {
                "rows_per_s_wall": r.wall,
                "rows_per_cpu_s": r.cpu,
                "median_wall": r.median,
                "median_cpu": r.cpu_median,
            }
            for r in (raw, ours, loop)
        },
        "ratio_wall": ours.median / raw.median,
        "ratio_cpu": ours.cpu_median / raw.cpu_median,
    }


def main() -> int:
    args = _support.parse_args(
        __doc__,
        extra=lambda p: p.add_argument(
            "--sizes", default="", help="comma-separated table sizes in rows (default: --rows)"
        ),
    )
    sizes = [int(s) for s in args.sizes.split(",") if s] or [args.rows]
    if min(sizes) <= 0:
        raise SystemExit("--sizes: positive row counts")
    stack = _support.start_stack()
    result = _support.result_header("capture", {"sizes": sizes, "repeats": args.repeats})
    created: list[str] = []
    result["by_size"] = [measure(stack, rows, args.repeats, created) for rows in sizes]
    largest = result["by_size"][-1]  # the headline figure: the longest runs
    result.update(
        changes=largest["changes"],
        runs=largest["runs"],
        ratio_wall=largest["ratio_wall"],
        ratio_cpu=largest["ratio_cpu"],
    )
    path = _support.write_result(result)
    for size in result["by_size"]:
        _support.print_table(
            f"Binlog capture, {size['rows']} inserts + {size['rows']} updates ({size['changes']} row changes, "
            f"{size['transactions']} source transactions), median of {args.repeats} interleaved runs",
            ["reader", "rows/s (wall)", "runs (wall)", "rows per CPU-s", "runs (CPU)"],
            [
                [
                    label,
                    r["median_wall"],
                    _support.runs_text(r["rows_per_s_wall"]),
                    r["median_cpu"],
                    _support.runs_text(r["rows_per_cpu_s"]),
                ]
                for label, r in size["runs"].items()
            ]
            + [["ratio, setup included (target >= 0.8)", size["ratio_wall"], "", size["ratio_cpu"], ""]],
        )
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
