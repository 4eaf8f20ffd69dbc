"""Delta Lake sink: each micro-batch is ONE Delta commit carrying its BatchCommit marker and Delta txn id.

The commit goes through :func:`exactly_once_provider.delta_commit.commit_with_marker` with
``txnAppId = "<pipeline>:<checkpoint id>"`` and ``txnVersion = <batch id>``: a replayed batch is recognised
by Delta (and by the marker lookup before it) and skipped. The marker lives under the key
``eo_stream:<pipeline>`` in ``commitInfo.userMetadata``; it is read back without Spark.
"""

from __future__ import annotations

import json

from exactly_once_provider import delta_commit
from exactly_once_provider.spark_jobs.batch import BatchCommit


class DeltaSink:
    """Append a pipeline's batches to the Delta table at ``path``.

    :param path: the Delta table's location (local path or ``file://``).
    :param pipeline: the pipeline's stable name.
    """

    kind = "delta"

    def __init__(self, path: str, pipeline: str) -> None:
        self.path = path
        self.pipeline = pipeline
        self.key = f"eo_stream:{pipeline}"

    def committed(self) -> BatchCommit | None:
        """Return the newest batch this pipeline committed, with ``rows_total`` summed from the Delta log."""
        found = delta_commit.latest_marker(self.path, self.key)
        if found is None:
            return None
        rows = 0
        for _, actions in delta_commit.commits(self.path):
            info = actions.get("commitInfo", {})
            raw = info.get("userMetadata")
            if raw and self.key in json.loads(raw):
                rows += int(info.get("operationMetrics", {}).get("numOutputRows", 0))
        data = dict(found[1][self.key], rows_total=rows)
        return BatchCommit.from_json(data)

    def commit(self, df, commit: BatchCommit) -> bool:
        """Write the batch and its marker in one Delta commit; return False if it was already committed."""
        app_id = f"{self.pipeline}:{commit.checkpoint_id}"
        if delta_commit.find_commit(self.path, app_id, commit.batch_id) is not None:
            return False
        delta_commit.commit_with_marker(df, self.path, {self.key: commit.to_json()}, app_id, commit.batch_id,
                                        mode="append")
        return True

    def append(self, df) -> None:
        """At-least-once baseline: a plain Delta append, no marker, no txn id."""
        df.write.format("delta").mode("append").save(self.path)
