"""A Delta table's current state read from its transaction log with plain Python (no Spark), local or on S3.

Read only: every commit is written by Delta's writer or by delta-rs (:mod:`exactly_once_provider.sinks.delta_rs`).
What the current table's rewrite (:mod:`exactly_once_provider.sinks.delta_merge`) and the reconciliation need: the
newest version ``L``, the table's ``protocol`` and ``metaData``, the newest ``txn`` version per app id and the data
files; and the commits' markers (:mod:`exactly_once_provider.sinks.delta_commit`). Like Delta's own snapshot it
starts from the newest COMPLETE checkpoint (only its ``protocol``, ``metaData`` and ``txn`` columns are read, once
per checkpoint file) and replays the JSON commits after it; a table without a checkpoint is replayed from its first
commit.

The log is read through the storage layer (:mod:`exactly_once_provider.storage`): a table is a local path,
``file://`` URI, ``s3://``/``s3a://`` URI (the process's registered S3 settings) or a
:class:`~exactly_once_provider.storage.Storage` rooted at the table (:func:`table_storage`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from exactly_once_provider.storage import Storage

Table = Union[str, "Storage"]  # a table's location, or the storage rooted at it
LOG = "_delta_log/"
LAST_CHECKPOINT = LOG + "_last_checkpoint"
COMMIT = re.compile(r"^(\d{20})\.json$")
# Spark/Delta type names of the columns whose exact file bounds the commits record and readers skip files on
INTEGRAL_TYPES = frozenset({"byte", "short", "integer", "long"})
# classic (one file or parts "<part>.<parts>") and V2 (UUID-named top-level file) checkpoints
_CLASSIC_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_V2_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(?:json|parquet)$")


def log_dir(path: str) -> Path:
    """Return the ``_delta_log`` directory of the LOCAL table at ``path`` (local path or ``file://`` URI)."""
    return Path(path.removeprefix("file://")) / "_delta_log"


@lru_cache(maxsize=64)
def _s3_table(location: str, settings: Any) -> Storage:
    from exactly_once_provider.storage import open_storage

    return open_storage(location, settings)  # one client per table and settings: a new one costs ~50 ms


def table_storage(table: Table) -> Storage:
    """Return the storage rooted at the Delta table ``table`` (a location, or already a storage)."""
    if not isinstance(table, str):
        return table
    from exactly_once_provider.storage import is_s3, open_storage

    if is_s3(table):
        from exactly_once_provider.storage.s3 import s3_settings

        return _s3_table(table, s3_settings(table))
    return open_storage(table)


def spark_path(table: Table) -> str:
    """Return the table's location as Spark names it (``s3a://`` on S3)."""
    return table_storage(table).spark_uri()


def log_names(table: Table, recent: bool = False) -> list[str]:
    """Return the file names in the table's ``_delta_log`` (not those of its subdirectories), sorted.

    :param recent: only the names from the newest checkpoint on (what a snapshot needs), found through
        ``_last_checkpoint`` as Delta does, so the cost stays the same however long the log has grown: on S3
        one listing that starts there (``StartAfter``); on a local disk, where a listing reads every entry,
        the checkpoint's files and the commits from its version on, probed one by one until the first
        missing one (commits are contiguous). Falls back to the whole log when the hint is missing,
        unreadable or names a checkpoint that is not complete (a stale hint never hides state).
    """
    storage = table_storage(table)
    hint = _hinted_checkpoint(storage) if recent else None
    if hint is not None:
        names = (
            _probe_from(storage, hint)
            if _is_local(storage)
            else _names(storage.list(LOG, start_after=f"{LOG}{hint['version']:020d}"))
        )  # "<v>" sorts just before "<v>.*"
        newest = newest_checkpoint(names)
        if commit_versions(names) and newest is not None and newest[0] >= hint["version"]:
            return names
    return _names(storage.list(LOG))


def _names(keys: list[str]) -> list[str]:
    return [k[len(LOG) :] for k in keys if "/" not in k[len(LOG) :]]


def _is_local(storage: Storage) -> bool:
    from exactly_once_provider.storage.local import LocalStorage

    return isinstance(storage, LocalStorage)


def _hinted_checkpoint(storage: Storage) -> dict | None:
    """Return ``_last_checkpoint`` (its ``version`` an int), or None: no such file, or one this reader cannot parse."""
    data = storage.read(LAST_CHECKPOINT)
    try:
        hint = json.loads(data) if data else None
        return {**hint, "version": int(hint["version"])} if hint else None
    except (ValueError, KeyError, TypeError):  # torn or foreign: list the whole log instead
        return None


def _probe_from(storage: Storage, hint: dict) -> list[str]:
    """Return the hinted checkpoint's file names that exist and the commits from its version on, in order."""
    version = hint["version"]
    if isinstance(hint.get("v2Checkpoint"), dict):
        candidates = [str(hint["v2Checkpoint"].get("path", "")).rsplit("/", 1)[-1]]
    elif int(hint.get("parts") or 1) > 1:
        parts = int(hint["parts"])
        candidates = [f"{version:020d}.checkpoint.{n:010d}.{parts:010d}.parquet" for n in range(1, parts + 1)]
    else:
        candidates = [f"{version:020d}.checkpoint.parquet"]
    names = [name for name in candidates if name and storage.exists(LOG + name)]
    while storage.exists(f"{LOG}{version:020d}.json"):
        names.append(f"{version:020d}.json")
        version += 1
    return sorted(names)


def commit_versions(names: list[str]) -> list[int]:
    """Return the versions of the JSON commits among the log's ``names``, ascending."""
    return sorted(int(m.group(1)) for n in names if (m := COMMIT.match(n)))


def read_log_file(table: Table, name: str) -> list[dict[str, Any]]:
    """Return the actions of the log file ``name`` (a JSON commit or V2 checkpoint), in order.

    :raises FileNotFoundError: there is no such file (never written, or removed by log cleanup).
    """
    data = table_storage(table).read(LOG + name)
    if data is None:
        raise FileNotFoundError(f"{table_storage(table).uri(LOG + name)} does not exist.")
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def read_actions(file: Path) -> list[dict[str, Any]]:
    """Return the actions of one local JSON commit (or V2 checkpoint) file, in order."""
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def newest_checkpoint(names: list[str]) -> tuple[int, list[str]] | None:
    """Return ``(version, file names)`` of the newest complete checkpoint among the log's ``names``."""
    parts: dict[int, dict[int, set[str]]] = {}  # version -> expected part count -> names
    for name in names:
        if match := _CLASSIC_CHECKPOINT.match(name):
            count = int(match.group(3)) if match.group(3) else 1
            parts.setdefault(int(match.group(1)), {}).setdefault(count, set()).add(name)
        elif match := _V2_CHECKPOINT.match(name):
            parts.setdefault(int(match.group(1)), {}).setdefault(1, set()).add(name)
    for version in sorted(parts, reverse=True):
        for count, files in parts[version].items():
            if len(files) >= count:  # a multi-part checkpoint counts only when every part is there
                return version, sorted(files)[:count]
    return None


def _map(value: Any) -> dict:
    """pyarrow reads a Parquet map as a list of (key, value) pairs; JSON has an object."""
    return dict(value) if isinstance(value, list) else dict(value or {})


def _metadata(value: dict) -> dict:
    fmt = value.get("format") or {}
    return {
        **value,
        "configuration": _map(value.get("configuration")),
        "format": {**fmt, "options": _map(fmt.get("options"))},
    }


_checkpoints: dict[tuple[str, int], tuple[dict | None, dict | None, dict[str, int]]] = {}


def _checkpoint_file(storage: Storage, name: str) -> tuple[dict | None, dict | None, dict[str, int]]:
    """Return ``(protocol, metaData, {app id: txn version})`` held by one checkpoint file (cached per file and
    size: a checkpoint of a version always holds the same state, whoever rewrites it)."""
    filesystem, file = storage.arrow_path(LOG + name)
    size = filesystem.get_file_info(file).size
    cached = _checkpoints.get((storage.uri(LOG + name), size))
    if cached is not None:
        return cached
    protocol = metadata = None
    txns: dict[str, int] = {}
    if name.endswith(".json"):  # a V2 checkpoint's top-level JSON file
        actions = read_log_file(storage, name)
        columns = {c: [a[c] for a in actions if a.get(c)] for c in ("protocol", "metaData", "txn")}
    else:
        import pyarrow.parquet as pq

        names = [c for c in ("protocol", "metaData", "txn") if c in pq.read_schema(file, filesystem=filesystem).names]
        table = pq.read_table(file, columns=names, filesystem=filesystem)
        columns = {c: [v for v in table.column(c).to_pylist() if v] for c in names}
    for value in columns.get("protocol", []):
        protocol = value
    for value in columns.get("metaData", []):
        metadata = _metadata(value)
    for txn in columns.get("txn", []):
        if txn.get("appId") is not None:
            txns[txn["appId"]] = max(txns.get(txn["appId"], -1), int(txn["version"]))
    if len(_checkpoints) >= 32:
        _checkpoints.clear()
    _checkpoints[(storage.uri(LOG + name), size)] = (protocol, metadata, txns)
    return protocol, metadata, txns


def checkpoint_state(table: Table, files: list[str]) -> tuple[dict | None, dict | None, dict[str, int]]:
    """Return ``(protocol, metaData, {app id: newest txn version})`` of a checkpoint's files."""
    storage = table_storage(table)
    protocol = metadata = None
    txns: dict[str, int] = {}
    for name in files:
        p, m, t = _checkpoint_file(storage, name)
        protocol, metadata = p or protocol, m or metadata
        for app_id, version in t.items():
            txns[app_id] = max(txns.get(app_id, -1), version)
    return protocol, metadata, txns


@dataclass
class TableState:
    """What a writer of version ``version + 1`` must know of a Delta table."""

    path: Table
    version: int
    protocol: dict
    metadata: dict
    checkpoint: int | None  # version of the newest complete checkpoint, None without one
    txns: dict[str, int] = field(default_factory=dict)  # app id -> newest committed txn version

    @property
    def configuration(self) -> dict[str, str]:
        return self.metadata.get("configuration") or {}


def table_state(path: Table) -> TableState | None:
    """Return the state of the Delta table at ``path`` as of its newest commit, or None if it has none."""
    storage = table_storage(path)
    names = log_names(storage, recent=True)
    versions = commit_versions(names)
    if not versions:
        return None
    protocol = metadata = None
    txns: dict[str, int] = {}
    checkpoint = newest_checkpoint(names)
    start = 0
    if checkpoint is not None:
        protocol, metadata, txns = checkpoint_state(storage, checkpoint[1])
        start = checkpoint[0] + 1
    for version in (v for v in versions if v >= start):
        for action in read_log_file(storage, f"{version:020d}.json"):
            if "protocol" in action:
                protocol = action["protocol"]
            elif "metaData" in action:
                metadata = action["metaData"]
            elif "txn" in action:
                app_id = action["txn"]["appId"]
                txns[app_id] = max(txns.get(app_id, -1), int(action["txn"]["version"]))
    if protocol is None or metadata is None:
        raise ValueError(
            f"the Delta log in {storage.uri(LOG)} has no protocol or metaData up to version {versions[-1]}: "
            "it is incomplete (commits before a missing checkpoint were removed?)."
        )
    return TableState(path, versions[-1], protocol, metadata, checkpoint[0] if checkpoint else None, txns)


_checkpoint_files: dict[tuple[str, int], dict[str, dict]] = {}


def _checkpoint_adds(storage: Storage, name: str) -> dict[str, dict]:
    """Return path -> ``add`` of one checkpoint file (cached per file and size, as :func:`_checkpoint_file`)."""
    filesystem, file = storage.arrow_path(LOG + name)
    cache_key = (storage.uri(LOG + name), filesystem.get_file_info(file).size)
    cached = _checkpoint_files.get(cache_key)
    if cached is not None:
        return cached
    if name.endswith(".json"):
        adds = [a["add"] for a in read_log_file(storage, name) if a.get("add")]
    else:
        import pyarrow.parquet as pq

        adds = [a for a in pq.read_table(file, columns=["add"], filesystem=filesystem).column("add").to_pylist() if a]
    files = {
        a["path"]: {
            "path": a["path"],
            "size": a["size"],
            "partitionValues": _map(a.get("partitionValues")),
            "stats": a.get("stats"),
        }
        for a in adds
    }
    if len(_checkpoint_files) >= 8:
        _checkpoint_files.clear()
    _checkpoint_files[cache_key] = files
    return files


def active_files(state: TableState) -> dict[str, dict]:
    """Return path -> ``add`` (``path``, ``size``, ``partitionValues``, ``stats``: JSON text or None) of every data
    file of ``state``'s version.

    What a rewrite of a table's files must remove: the newest checkpoint's ``add`` actions, then every JSON
    commit after it up to the state's version, replayed (``add`` adds a path, ``remove`` removes it). The path is
    kept exactly as the log writes it (URL-encoded, relative to the table): a ``remove`` must name it so.

    :param state: the table's state (:func:`table_state`): the version whose files are wanted.
    """
    storage = table_storage(state.path)
    files: dict[str, dict] = {}
    start = 0
    if state.checkpoint is not None:
        names = log_names(storage, recent=True)
        found = newest_checkpoint(names)
        if found is None or found[0] != state.checkpoint:
            raise ValueError(
                f"the checkpoint of version {state.checkpoint} in {storage.uri(LOG)} is gone: read the "
                "table's state again."
            )
        for name in found[1]:
            files.update(_checkpoint_adds(storage, name))
        start = state.checkpoint + 1
    for version in range(start, state.version + 1):
        for action in read_log_file(storage, f"{version:020d}.json"):
            if action.get("add"):
                add = action["add"]
                files[add["path"]] = {
                    "path": add["path"],
                    "size": add["size"],
                    "partitionValues": add.get("partitionValues") or {},
                    "stats": add.get("stats"),
                }
            elif action.get("remove"):
                files.pop(action["remove"]["path"], None)
    return files
