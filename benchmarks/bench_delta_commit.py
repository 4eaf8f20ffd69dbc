"""Benchmark: one Delta append commit, the provider's own (put-if-absent) vs delta-rs, on local disk and MinIO.

Not a test. Per location and candidate: a new table, then ``--commits`` appends of 100 rows each carrying an
app transaction ``(app, i)``; prints the median and p90 wall time per commit. The own commit is
:func:`~exactly_once_provider.sinks.delta_commit.append_with_files` on a Parquet file already in the table (Spark
writes it in the job); delta-rs has no commit of foreign files in its writer API, so its time includes writing
the 100-row file, and it first checks the app's txn version itself (delta-rs commits a replay of an already
committed ``(app id, version)`` from a fresh snapshot; it refuses one only from a stale snapshot).

    .venv/bin/python benchmarks/bench_delta_commit.py --commits 20
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import STACK as stack  # noqa: E402  (the local stack module, not a fixture)

SCHEMA = json.dumps({"type": "struct", "fields": [{"name": "n", "type": "long", "nullable": True, "metadata": {}}]})


def _rows(i: int):
    import pyarrow as pa

    return pa.table({"n": pa.array(range(i * 100, i * 100 + 100), pa.int64())})


def own(location: str, commits: int) -> list[float]:
    import pyarrow.parquet as pq

    from exactly_once_provider.sinks import delta_commit
    from exactly_once_provider.storage import open_storage

    storage = open_storage(location, stack.minio_settings() if location.startswith("s3") else None)
    delta_commit.create_with_files(storage, SCHEMA, [], {}, "setup", 0)
    times = []
    for i in range(commits):
        buffer = io.BytesIO()
        pq.write_table(_rows(i), buffer)
        name = f"eo-bench/part-{i}.parquet"
        storage.put(name, buffer.getvalue())
        started = time.perf_counter()
        _, written = delta_commit.append_with_files(
            storage, SCHEMA, [{"name": name, "bytes": len(buffer.getvalue()), "rows": 100}], {"b": i}, "app", i
        )
        times.append(time.perf_counter() - started)
        assert written
    return times


def delta_rs(location: str, commits: int) -> list[float]:
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    options = stack.minio_settings().delta_rs_options() if location.startswith("s3") else None
    write_deltalake(location, _rows(0).slice(0, 0), storage_options=options)
    times = []
    for i in range(commits):
        started = time.perf_counter()
        table = DeltaTable(location, storage_options=options)
        newest = table.transaction_version("app")
        assert newest is None or newest < i
        write_deltalake(
            table, _rows(i), mode="append", commit_properties=CommitProperties(app_transactions=[Transaction("app", i)])
        )
        times.append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=20)
    args = parser.parse_args()
    stack.up()
    from exactly_once_provider.storage import open_storage

    print("| location | commit | median ms | p90 ms |\n|---|---|---|---|")
    for kind in ("local", "minio"):
        for name, candidate in (("own (put-if-absent)", own), ("delta-rs", delta_rs)):
            location = (
                tempfile.mkdtemp(prefix="eo-bench-commit-") + "/t"
                if kind == "local"
                else f"s3://{stack.MINIO_BUCKETS[0]}/bench-commit/{uuid.uuid4().hex}"
            )
            times = sorted(candidate(location, args.commits))
            p90 = times[max(0, int(len(times) * 0.9) - 1)]
            print(f"| {kind} | {name} | {statistics.median(times) * 1000:.0f} | {p90 * 1000:.0f} |", flush=True)
            if kind == "minio":
                open_storage(location, stack.minio_settings()).delete_prefix("")
    return 0


if __name__ == "__main__":
    sys.exit(main())
