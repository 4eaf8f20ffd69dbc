"""The one step that writes a Delta commit of files already in the table: delta-rs's ``create_write_transaction``.

Every commit of files the provider chose (the Delta sink's append, the current table's rewrite, the full load's
publish) ends here: delta-rs (``deltalake``) writes ``<L+1>.json`` with put-if-absent (a hard link locally;
on S3 ``If-None-Match: *``, the ``conditional_put=etag`` storage option of
:meth:`~exactly_once_provider.storage.s3.S3Settings.delta_rs_options`), the ``txn`` ``(app id, version)`` and the
caller's marker as ``commitInfo.userMetadata`` in the same commit. No product module writes ``_delta_log/``
entries itself.

What delta-rs does not do is kept by the callers (:mod:`~exactly_once_provider.sinks.delta_commit`,
:mod:`~exactly_once_provider.sinks.delta_merge`): the txn check on the snapshot the commit builds on (delta-rs
accepts a replay of a committed ``(app id, version)`` from a fresh snapshot; it refuses one only from a stale
snapshot), the marker fence and the choice of files and their statistics. Every commit is made on the snapshot
of version ``L`` the caller checked, with ``max_commit_retries=0``: it lands as exactly ``L + 1`` or not at all.
delta-rs's own retry would rebase it onto a newer version without the caller's checks (a MERGE's removes on a
table another writer appended to meanwhile; with ``mode="error"``, a second CREATE TABLE as version 1:
docs/pitfalls.md), so a lost race goes back to the caller, which reads the table again and checks again (the
commit loop, :func:`~exactly_once_provider.sinks.commit_loop.commit_batch`).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

from exactly_once_provider.sinks import delta_log


def storage_options(storage: Any) -> dict[str, str] | None:
    """Return the delta-rs storage options of a table's storage (S3: its settings; local: none)."""
    from exactly_once_provider.storage.s3 import s3_settings

    settings = s3_settings(storage)
    return settings.delta_rs_options() if settings is not None else None


def _hooks() -> Any:
    from deltalake.transaction import PostCommitHookProperties

    # Checkpoints follow Delta's interval (delta_commit.checkpoint_if_due), not delta-rs's default (100).
    return PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)


def _properties(marker: dict, app_id: str, version: int, now: int, metadata: dict) -> Any:
    from deltalake.transaction import CommitProperties, Transaction

    return CommitProperties(
        custom_metadata={"userMetadata": json.dumps(marker, sort_keys=True), **metadata},
        max_commit_retries=0,
        app_transactions=[Transaction(app_id, version, now)],
    )


def snapshot(storage: Any, app_id: str) -> tuple[Any, delta_log.TableState] | None:
    """Return the table at its newest version (a delta-rs ``DeltaTable``, to commit on) and the state a commit on it
    is checked against (:func:`~exactly_once_provider.sinks.delta_commit.check_appendable`,
    :func:`~exactly_once_provider.sinks.delta_commit.txn_committed`); None when there is no table yet.

    One read of the log for both: the state is the snapshot's own, so the checks hold for the version committed on.

    :param app_id: the writer's app id: the state's ``txns`` holds its newest txn version only.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(storage.uri(), storage_options=storage_options(storage))
    except TableNotFoundError:
        return None
    protocol, metadata, txn = table.protocol(), table.metadata(), table.transaction_version(app_id)
    state = delta_log.TableState(
        path=storage,
        version=table.version(),
        protocol={
            "minReaderVersion": protocol.min_reader_version,
            "minWriterVersion": protocol.min_writer_version,
            "readerFeatures": protocol.reader_features,
            "writerFeatures": protocol.writer_features,
        },
        metadata={
            "schemaString": table.schema().to_json(),
            "partitionColumns": list(metadata.partition_columns),
            "configuration": dict(metadata.configuration),
            # delta-rs does not expose the format; the protocol defines none but Parquet
            "format": {"provider": "parquet"},
        },
        checkpoint=None,  # not read: no caller of a snapshot's state needs it
        txns={} if txn is None else {app_id: txn},
    )
    return table, state


def remove_actions(files: list[dict], now: int) -> list[Any]:
    """Return one delta-rs ``RemoveAction`` per data file of :func:`~.delta_log.active_files`."""
    from deltalake.transaction import RemoveAction

    # delta-rs URL-encodes the path it is given, and takes a remove of a path no add names without a word: a
    # remove carries the DECODED path of the log's add (docs/pitfalls.md).
    return [RemoveAction(unquote(f["path"]), True, now, int(f["size"]), dict(f["partitionValues"])) for f in files]


def create(
    storage: Any, schema_json: str, adds: list[Any], marker: dict, app_id: str, version: int, now: int, metrics: dict
) -> bool:
    """Create the table as version 0 with ``adds`` and the txn; return False if another writer created it first.

    :param schema_json: the table's schema (Spark's ``StructType.json()``, which is Delta's schema format).
    :param metrics: the ``commitInfo.operationMetrics`` to record.
    """
    from deltalake import Schema
    from deltalake.transaction import create_table_with_add_actions

    try:
        create_table_with_add_actions(
            storage.uri(),
            Schema.from_json(schema_json),
            adds,
            mode="error",
            storage_options=storage_options(storage),
            commit_properties=_properties(marker, app_id, version, now, {"operationMetrics": metrics}),
            post_commithook_properties=_hooks(),
        )
    except Exception:  # "already exists" or a lost put-if-absent: decided by what the log now holds
        if not storage.exists(_commit_file(0)):
            raise
        if _holds(storage, 0, adds, app_id, version):  # ours after all (a lost response of a landed put)
            return True
        return False
    return True


def commit(
    storage: Any,
    read_version: int,
    actions: list[Any],
    marker: dict,
    app_id: str,
    version: int,
    now: int,
    metadata: dict,
    table: Any = None,
) -> bool:
    """Commit ``actions`` (adds, removes) as version ``read_version + 1``; return False if another writer took it.

    THE commit step of every Delta commit of files the provider chose: delta-rs on the snapshot of
    ``read_version`` (the one the caller checked), no retry (see the module docstring).

    :param metadata: extra ``commitInfo`` fields (``operationMetrics``, ``isBlindAppend``...).
    :param table: the ``DeltaTable`` at ``read_version`` (:func:`snapshot`); default: loaded at it.
    """
    from deltalake import DeltaTable

    if table is None:
        table = DeltaTable(storage.uri(), version=read_version, storage_options=storage_options(storage))
    elif table.version() != read_version:
        raise ValueError(f"the table given is at version {table.version()}, not {read_version}.")
    try:
        table.create_write_transaction(
            actions,
            "append",
            table.schema(),
            commit_properties=_properties(marker, app_id, version, now, {"readVersion": read_version, **metadata}),
            post_commithook_properties=_hooks(),
        )
    except Exception:  # a lost race (CommitFailedError) or a failure: decided by what the log now holds
        if not storage.exists(_commit_file(read_version + 1)):
            raise
        adds = [a for a in actions if hasattr(a, "stats")]
        return _holds(storage, read_version + 1, adds, app_id, version)
    return True


def _commit_file(version: int) -> str:
    return f"{delta_log.LOG}{version:020d}.json"


def _holds(storage: Any, table_version: int, adds: list[Any], app_id: str, version: int) -> bool:
    """Whether commit ``table_version`` is this writer's own (its txn and its files): a put that landed although
    the call failed (a response lost on the way back). Its files must then not be deleted."""
    txns, paths = set(), set()
    for action in delta_log.read_log_file(storage, f"{table_version:020d}.json"):
        if "txn" in action:
            txns.add((action["txn"].get("appId"), int(action["txn"].get("version", -1))))
        elif "add" in action:
            paths.add(action["add"]["path"])
    return (app_id, version) in txns and paths == {a.path for a in adds}
