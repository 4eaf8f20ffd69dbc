"""A files-sink committer for the kill tests: publishes numbered batches, resuming from ``committed()``.

Usage: python files_sink_process.py ROOT BATCHES
Batch b holds rows 10*b+1 .. 10*b+10 and commits Kafka offset 10*(b+1). Spark's Parquet writer is replaced by
pyarrow writing the same part file (the publish protocol under test is the sink's, on the real file system);
EO_FAULT_AT chooses the step where the process SIGKILLs itself. Prints ``RESUME <first batch>``.
"""

from __future__ import annotations

import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from exactly_once_provider.sinks.base import BatchCommit
from exactly_once_provider.sinks.files import FilesSink


class Frame:
    """What the sink calls on a Spark DataFrame to stage it: ``df.write.mode(m).parquet(path)``."""

    def __init__(self, rows: list[int]) -> None:
        self.rows, self.write = rows, self

    def mode(self, _mode: str) -> Frame:
        return self

    def parquet(self, path: str) -> None:
        os.makedirs(path)
        pq.write_table(pa.table({"n": self.rows}), os.path.join(path, "part-00000.parquet"))


def main(root: str, batches: str) -> None:
    sink = FilesSink(root, "p")
    sink.prepare()
    state = sink.committed()
    first = 0 if state is None else int(state.batch_id) + 1
    print(f"RESUME {first}", flush=True)
    for batch in range(first, int(batches)):
        sink.commit(
            Frame(list(range(10 * batch + 1, 10 * batch + 11))),
            BatchCommit("p", "c1", batch, {"t": {0: 10 * (batch + 1)}}),
            expected=state,
        )
        state = sink.committed()


if __name__ == "__main__":
    main(*sys.argv[1:])
