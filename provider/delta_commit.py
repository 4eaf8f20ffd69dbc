"""The sink commit primitive: one Delta Lake commit that carries its own progress marker.

Every writer that needs "output and position in the same atomic step" (DESIGN.md contract table) goes through
:func:`commit_with_marker`: the DataFrame is written as ONE Delta commit whose ``commitInfo.userMetadata``
holds the caller's JSON marker (positions, batch ids...) and whose ``txn`` action holds
``(txnAppId, txnVersion)``. Delta skips a write whose ``(app id, version)`` it already committed, so a
retry after a crash between the commit and the caller's bookkeeping is a no-op that returns the same commit.

Markers are read back from the transaction log's JSON commit files with plain Python (no Spark needed), so
a capture process can read them; this reads local/mounted paths only.

What the txn id costs, and why it stays: Delta 4.4.0 answers "is (app id, version) committed?" on the
transaction's own snapshot (``DeltaCommand.hasBeenExecuted`` -> ``OptimisticTransaction.txnVersion`` ->
``Snapshot.transactions`` -> ``SnapshotState.computedState``), i.e. a full state reconstruction of every new
snapshot: three extra Spark jobs (seven stages instead of one on ``local[2]``) per commit. The ``.crc``
files' ``setTransactions`` are only written (for the next incremental checksum), never read for this, so no
Delta conf avoids it. The same call registers the app id as read, which is what makes a concurrent commit
of the same ``(app id, version)`` (a zombie driver replaying the batch) fail with
``ConcurrentTransactionException`` instead of adding a second copy; our own log lookup before the write
cannot do that, it races with the other writer.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowException


class CommitMarkerError(AirflowException):
    """Raise when a Delta commit and its marker disagree."""


_COMMIT = re.compile(r"^\d{20}\.json$")
_CHECKPOINT = re.compile(r"^\d{20}\.checkpoint(\.[^/]+)?\.(parquet|json)$")


def _log_dir(path: str) -> Path:
    return Path(path.removeprefix("file://")) / "_delta_log"


def _read_commit(file: Path) -> dict[str, Any]:
    actions: dict[str, Any] = {"txn": []}
    for line in file.read_text().splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "commitInfo" in action:
            actions["commitInfo"] = action["commitInfo"]
        elif "txn" in action:
            actions["txn"].append(action["txn"])
    return actions


def commits(path: str) -> Iterator[tuple[int, dict]]:
    """Yield ``(version, actions)`` of a Delta table's JSON commits, newest first.

    ``actions`` maps ``commitInfo`` to its dict and ``txn`` to the list of transaction actions.

    :param path: the Delta table's location (local path or ``file://`` URI).
    """
    log_dir = _log_dir(path)
    names = os.listdir(log_dir) if log_dir.is_dir() else []
    for version in sorted((int(n[:20]) for n in names if _COMMIT.match(n)), reverse=True):
        yield version, _read_commit(log_dir / f"{version:020d}.json")


def find_commit(path: str, app_id: str, version: int) -> int | None:
    """Return the table version that committed ``(app_id, version)``, or None if none did.

    Cheap on long logs: only the JSON commits after the newest Delta checkpoint are parsed (newest first; a
    streaming writer finds its own last commit in the first file). Older commits are looked at only when
    the checkpoint's ``txn`` state (Delta keeps the newest version per app id there) says the pair is
    already committed, i.e. on a replay. Like Delta itself, which skips a write whose ``txnVersion`` is at
    or below the app's newest one, every such version counts as committed: when its own commit file was
    cleaned up by log retention, the checkpoint version is returned.

    :param path: the Delta table's location.
    :param app_id: the writer's stable application id.
    :param version: the writer's monotonically increasing version for that app id.
    """
    log_dir = _log_dir(path)
    if not log_dir.is_dir():
        return None
    names = os.listdir(log_dir)
    versions = sorted((int(n[:20]) for n in names if _COMMIT.match(n)), reverse=True)
    checkpoint = max((int(n[:20]) for n in names if _CHECKPOINT.match(n)), default=None)

    def matches(table_version: int) -> bool:
        return any(t.get("appId") == app_id and int(t.get("version", -1)) == version
                   for t in _read_commit(log_dir / f"{table_version:020d}.json")["txn"])

    for table_version in versions:
        if checkpoint is not None and table_version <= checkpoint:
            break
        if matches(table_version):
            return table_version
    if checkpoint is None:
        return None
    newest = _checkpoint_txn(log_dir, checkpoint, names).get(app_id)
    if newest is None or newest < version:
        return None
    return next((v for v in versions if v <= checkpoint and matches(v)), checkpoint)


def _checkpoint_txn(log_dir: Path, checkpoint: int, names: list[str]) -> dict[str, int]:
    """Return app id -> newest txn version recorded in the checkpoint of table version ``checkpoint``."""
    newest: dict[str, int] = {}
    prefix = f"{checkpoint:020d}.checkpoint"
    for name in sorted(n for n in names if n.startswith(prefix)):
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            schema = pq.read_schema(log_dir / name)
            if "txn" not in schema.names:
                continue
            txns = pq.read_table(log_dir / name, columns=["txn"]).column("txn").to_pylist()
        else:  # a V2 checkpoint's JSON top-level file (txn actions are never in sidecars)
            txns = _read_commit(log_dir / name)["txn"]
        for txn in txns:
            if txn and txn.get("appId") is not None:
                newest[txn["appId"]] = max(newest.get(txn["appId"], -1), int(txn["version"]))
    return newest


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


def commit_with_marker(df: Any, path: str, marker: dict, app_id: str, version: int, mode: str = "overwrite",
                       replace_where: str | None = None) -> int:
    """Write ``df`` to the Delta table at ``path`` as one commit carrying ``marker``; return the table version.

    Idempotent per ``(app_id, version)``: if that pair is already committed nothing is written.

    :param df: the Spark DataFrame to write.
    :param path: the Delta table's location.
    :param marker: JSON-serialisable progress marker stored in ``commitInfo.userMetadata``.
    :param app_id: stable id of the writer (Delta ``txnAppId``).
    :param version: the writer's version for this commit (Delta ``txnVersion``).
    :param mode: ``overwrite`` (atomic replace of the table) or ``append``.
    :param replace_where: with ``overwrite``: replace only the rows matching this predicate (Delta
        ``replaceWhere``; every row of ``df`` must match it), in the same single commit.
    """
    if mode not in ("overwrite", "append"):
        raise ValueError(f"mode must be 'overwrite' or 'append', got {mode!r}.")
    if replace_where and mode != "overwrite":
        raise ValueError("replace_where needs mode='overwrite'.")
    done = find_commit(path, app_id, version)
    if done is not None:
        return done
    writer = (df.write.format("delta").mode(mode).option("txnAppId", app_id).option("txnVersion", version)
              .option("userMetadata", json.dumps(marker, sort_keys=True)))
    if replace_where:
        writer = writer.option("replaceWhere", replace_where)
    elif mode == "overwrite":
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



def create_with_files(path: str, schema_json: str, files: list[dict], marker: dict, app_id: str,
                      version: int, engine: str = "exactly-once-provider") -> int:
    """Create a NEW Delta table at ``path`` from Parquet files already in it, in one commit carrying ``marker``.

    The publish of a first full load (added for its speed): the files are adopted where they are, nothing is
    rewritten. This writes the table's first commit, ``00000000000000000000.json``, as the Delta protocol
    specifies (the same actions Delta's own first WRITE has: ``commitInfo`` with ``userMetadata``,
    ``metaData``, ``protocol``, ``txn`` = ``(app_id, version)``, one ``add`` per file with its row count as
    ``stats``) and creates it with put-if-absent (a hard link of the fsynced file: the same atomic step
    Delta's local log store takes), so the table appears with every file at once or not at all, and a
    concurrent creator makes one of the two fail. Before it the directory is no Delta table; files in it
    that ``files`` does not list stay invisible.

    Only for a table that has no commit yet (an existing one raises: replace it with
    :func:`commit_with_marker`). Idempotent per ``(app_id, version)`` like :func:`commit_with_marker`.

    :param path: the table's directory (local path or ``file://`` URI); the files are in it.
    :param schema_json: the Spark schema as JSON (``StructType.json()``); flat, no column mapping.
    :param files: ``{"name", "bytes", "rows"}`` per Parquet file, ``name`` relative to ``path``.
    :param marker: JSON-serialisable progress marker stored in ``commitInfo.userMetadata``.
    :param app_id: stable id of the writer (Delta ``txnAppId``).
    :param version: the writer's version for this commit (Delta ``txnVersion``).
    :param engine: the ``engineInfo`` recorded in the commit.
    """
    done = find_commit(path, app_id, version)
    if done is not None:
        return done
    log_dir = _log_dir(path)
    if log_dir.is_dir() and any(_COMMIT.match(name) for name in os.listdir(log_dir)):
        raise CommitMarkerError(f"{path} already is a Delta table: replace it with commit_with_marker().")
    import time
    import uuid
    from urllib.parse import quote

    now = int(time.time() * 1000)
    root = Path(path.removeprefix("file://"))
    # Delta upgrades a new table with a TIMESTAMP_NTZ column to table features (reader 3, writer 7) and
    # lists the legacy writer features of writer version 2 with it; otherwise the table is (1, 2).
    if '"timestamp_ntz"' in schema_json:
        protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["timestampNtz"],
                    "writerFeatures": ["timestampNtz", "invariants", "appendOnly"]}
    else:
        protocol = {"minReaderVersion": 1, "minWriterVersion": 2}
    actions = [
        {"commitInfo": {"timestamp": now, "operation": "WRITE",
                        "operationParameters": {"mode": "ErrorIfExists", "partitionBy": "[]"},
                        "isolationLevel": "Serializable", "isBlindAppend": True,
                        "operationMetrics": {"numFiles": str(len(files)),
                                             "numOutputRows": str(sum(f["rows"] for f in files)),
                                             "numOutputBytes": str(sum(f["bytes"] for f in files))},
                        "userMetadata": json.dumps(marker, sort_keys=True), "engineInfo": engine,
                        "txnId": str(uuid.uuid4())}},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      "schemaString": schema_json, "partitionColumns": [], "configuration": {},
                      "createdTime": now}},
        {"protocol": protocol},
        {"txn": {"appId": app_id, "version": version, "lastUpdated": now}},
    ]
    for f in files:
        stat = (root / f["name"]).stat()
        if stat.st_size != f["bytes"]:
            raise CommitMarkerError(f"{root / f['name']} has {stat.st_size} bytes, not {f['bytes']}.")
        actions.append({"add": {"path": quote(f["name"]), "partitionValues": {}, "size": f["bytes"],
                                "modificationTime": int(stat.st_mtime * 1000), "dataChange": True,
                                "stats": json.dumps({"numRecords": f["rows"]})}})
    log_dir.mkdir(parents=True, exist_ok=True)
    target = log_dir / f"{0:020d}.json"
    tmp = log_dir / f".{target.name}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w") as handle:
        handle.write("".join(json.dumps(a) + "\n" for a in actions))
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, target)  # put-if-absent: fails if another writer created the table first
    except FileExistsError:
        raise CommitMarkerError(f"Another writer created the Delta table at {path} first.") from None
    finally:
        tmp.unlink()
    directory = os.open(log_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return 0
