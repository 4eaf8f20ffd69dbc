"""The sink commit primitive: one Delta Lake commit that carries its own progress marker.

Every writer that needs "output and position in the same atomic step" (DESIGN.md contract table) goes through
:func:`commit_with_marker`: the DataFrame is written as ONE Delta commit whose ``commitInfo.userMetadata``
holds the caller's JSON marker (positions, batch ids...) and whose ``txn`` action holds
``(txnAppId, txnVersion)``. Delta skips a write whose ``(app id, version)`` it already committed, so a
retry after a crash between the commit and the caller's bookkeeping is a no-op that returns the same commit.

Markers are read back from the transaction log's JSON commit files with plain Python (no Spark needed), so
a capture process can read them; this reads local/mounted paths only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowException


class CommitMarkerError(AirflowException):
    """Raise when a Delta commit and its marker disagree."""


def _log_dir(path: str) -> Path:
    return Path(path.removeprefix("file://")) / "_delta_log"


def commits(path: str) -> Iterator[tuple[int, dict]]:
    """Yield ``(version, actions)`` of a Delta table's JSON commits, newest first.

    ``actions`` maps ``commitInfo`` to its dict and ``txn`` to the list of transaction actions.

    :param path: the Delta table's location (local path or ``file://`` URI).
    """
    log_dir = _log_dir(path)
    files = sorted(log_dir.glob("[0-9]*.json"), reverse=True) if log_dir.is_dir() else []
    for file in files:
        actions: dict[str, Any] = {"txn": []}
        for line in file.read_text().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "commitInfo" in action:
                actions["commitInfo"] = action["commitInfo"]
            elif "txn" in action:
                actions["txn"].append(action["txn"])
        yield int(file.stem), actions


def find_commit(path: str, app_id: str, version: int) -> int | None:
    """Return the table version that committed ``(app_id, version)``, or None if none did.

    :param path: the Delta table's location.
    :param app_id: the writer's stable application id.
    :param version: the writer's monotonically increasing version for that app id.
    """
    for table_version, actions in commits(path):
        if any(t.get("appId") == app_id and int(t.get("version", -1)) == version for t in actions["txn"]):
            return table_version
    return None


def latest_marker(path: str, key: str) -> tuple[int, dict] | None:
    """Return ``(table version, marker)`` of the newest commit whose marker has top-level ``key``.

    :param path: the Delta table's location.
    :param key: the marker kind, e.g. ``"eo_full_load"``.
    """
    for table_version, actions in commits(path):
        raw = actions.get("commitInfo", {}).get("userMetadata")
        if raw:
            marker = json.loads(raw)
            if isinstance(marker, dict) and key in marker:
                return table_version, marker
    return None


def commit_with_marker(df: Any, path: str, marker: dict, app_id: str, version: int, mode: str = "overwrite") -> int:
    """Write ``df`` to the Delta table at ``path`` as one commit carrying ``marker``; return the table version.

    Idempotent per ``(app_id, version)``: if that pair is already committed nothing is written.

    :param df: the Spark DataFrame to write.
    :param path: the Delta table's location.
    :param marker: JSON-serialisable progress marker stored in ``commitInfo.userMetadata``.
    :param app_id: stable id of the writer (Delta ``txnAppId``).
    :param version: the writer's version for this commit (Delta ``txnVersion``).
    :param mode: ``overwrite`` (atomic replace of the table) or ``append``.
    """
    if mode not in ("overwrite", "append"):
        raise ValueError(f"mode must be 'overwrite' or 'append', got {mode!r}.")
    done = find_commit(path, app_id, version)
    if done is not None:
        return done
    writer = (df.write.format("delta").mode(mode).option("txnAppId", app_id).option("txnVersion", version)
              .option("userMetadata", json.dumps(marker, sort_keys=True)))
    if mode == "overwrite":
        writer = writer.option("overwriteSchema", "true")
    writer.save(path)
    done = find_commit(path, app_id, version)
    if done is None:
        raise CommitMarkerError(f"Delta write to {path} finished but no commit records txn ({app_id}, {version}).")
    return done


_TXN_CONFS = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion",
              "spark.databricks.delta.commitInfo.userMetadata")


def merge_with_marker(source: Any, path: str, on: str, marker: dict, app_id: str, version: int,
                      update_when: str | None = None, delete_when: str | None = None) -> int:
    """MERGE ``source`` into the Delta table at ``path`` as one commit carrying ``marker``; return its version.

    The MERGE counterpart of :func:`commit_with_marker` (added for the streaming CDC apply): Delta takes the
    ``(txnAppId, txnVersion)`` of a DML statement from the session confs
    ``spark.databricks.delta.write.txnAppId/txnVersion`` and the marker from
    ``spark.databricks.delta.commitInfo.userMetadata``; they are set for this statement only. Idempotent per
    ``(app_id, version)`` like :func:`commit_with_marker`. Matched rows are updated (or deleted when
    ``delete_when`` holds) only if ``update_when`` holds; unmatched rows are inserted.

    :param source: the Spark DataFrame of changes (at most one row per key).
    :param path: the Delta table's location; it must exist.
    :param on: the join condition between ``t`` (target) and ``s`` (source), e.g. ``"t.pk = s.pk"``.
    :param marker: JSON-serialisable progress marker stored in ``commitInfo.userMetadata``.
    :param app_id: stable id of the writer (Delta ``txnAppId``).
    :param version: the writer's version for this commit (Delta ``txnVersion``).
    :param update_when: extra condition for matched rows, e.g. ``"s.v > t.v"``.
    :param delete_when: condition (on matched rows that pass ``update_when``) to delete instead of update.
    """
    from delta.tables import DeltaTable

    done = find_commit(path, app_id, version)
    if done is not None:
        return done
    spark = source.sparkSession
    values = (app_id, str(version), json.dumps(marker, sort_keys=True))
    for key, value in zip(_TXN_CONFS, values):
        spark.conf.set(key, value)
    try:
        merge = DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), on)
        if delete_when:
            cond = f"({update_when}) AND ({delete_when})" if update_when else delete_when
            merge = merge.whenMatchedDelete(condition=cond)
        merge = merge.whenMatchedUpdateAll(condition=update_when).whenNotMatchedInsertAll()
        merge.execute()
    finally:
        for key in _TXN_CONFS:
            spark.conf.unset(key)
    done = find_commit(path, app_id, version)
    if done is None:
        raise CommitMarkerError(f"Delta MERGE into {path} finished but no commit records txn ({app_id}, {version}).")
    return done
