"""Delta Lake sink: each micro-batch is ONE Delta commit carrying its BatchCommit marker and Delta txn id.

The commit goes through :func:`exactly_once_provider.delta_commit.commit_with_marker` with
``txnAppId = "<pipeline>:<checkpoint id>"`` and ``txnVersion = <batch id>``: a replayed batch is recognised
by Delta (and by the marker lookup before it) and skipped. The marker lives under the key
``eo_stream:<pipeline>`` in ``commitInfo.userMetadata``; it is read back without Spark.

CDC mode (``mode="cdc"``) MERGEs each batch's newest change per key through
:func:`~exactly_once_provider.delta_commit.merge_with_marker` (same txn id and marker): a change applies only
if its ``source_version`` is newer than the row's. Deletes are kept as tombstones (``deleted = true``) so an
older change replayed after the delete cannot bring the row back; readers filter ``NOT deleted``.
"""

from __future__ import annotations

import json

from exactly_once_provider import delta_commit
from exactly_once_provider.spark_jobs.batch import BatchCommit


class DeltaSink:
    """Append a pipeline's batches to the Delta table at ``path``.

    :param path: the Delta table's location (local path or ``file://``).
    :param pipeline: the pipeline's stable name.
    :param mode: ``append`` (records) or ``cdc`` (changes by ``pk``, newer ``source_version`` wins).
    """

    kind = "delta"

    def __init__(self, path: str, pipeline: str, mode: str = "append") -> None:
        self.path = path
        self.pipeline = pipeline
        self.mode = mode
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
                metrics = info.get("operationMetrics", {})
                rows += int(metrics.get("numOutputRows", metrics.get("numSourceRows", 0))
                            if info.get("operation") != "MERGE" else metrics.get("numSourceRows", 0))
        data = dict(found[1][self.key], rows_total=rows)
        return BatchCommit.from_json(data)

    def commit(self, df, commit: BatchCommit) -> bool:
        """Write the batch and its marker in one Delta commit; return False if it was already committed."""
        app_id = f"{self.pipeline}:{commit.checkpoint_id}"
        if delta_commit.find_commit(self.path, app_id, commit.batch_id) is not None:
            return False
        marker = {self.key: commit.to_json()}
        if self.mode == "append":
            delta_commit.commit_with_marker(df, self.path, marker, app_id, commit.batch_id, mode="append")
            return True
        if next(delta_commit.commits(self.path), None) is None:
            # MERGE needs a table: create it empty (no marker; a crash here is harmless, the next try reuses it).
            df.limit(0).write.format("delta").mode("append").save(self.path)
        delta_commit.merge_with_marker(df, self.path, "t.pk = s.pk", marker, app_id, commit.batch_id,
                                       update_when="s.source_version > t.source_version")
        return True

    def append(self, df) -> None:
        """At-least-once baseline: a plain Delta append, no marker, no txn id."""
        df.write.format("delta").mode("append").save(self.path)
