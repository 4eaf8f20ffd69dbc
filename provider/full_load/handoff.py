"""The history -> stream handoff: per-chunk snapshot positions recorded in the full load's sink commit.

Format, stored as the Delta commit's ``userMetadata`` (JSON) by :mod:`exactly_once_provider.full_load.job`::

    {"eo_full_load": {
        "format": 1, "load_id": "...", "schema": "eo", "table": "orders", "key": ["id"],
        "columns": [{"name": "id", "data_type": "int", ...}, ...],   # the loaded columns (columns.Column)
        "version_base": 0, "server_id": 1,   # added to the rows' snapshot versions; the server read
        "rows": 1000000, "min_position": {"file": "binlog.000003", "pos": 4711},
        "max_position": {...},
        "chunks": [{"index": 0, "lower": null, "upper": [100000], "file": "binlog.000003", "pos": 4711,
                    "rows": 100000}, ...]}}

Key bounds are JSON-typed by :mod:`exactly_once_provider.full_load.plan` (``{"b64": ..}`` for bytes, ...).
A chunk holds the keys ``lower < key <= upper`` (``null`` = unbounded). The capture starts at
``min_position`` and drops a change of key ``k`` whose position is at or before the position of the chunk
holding ``k`` (the capture's :class:`~exactly_once_provider.capture.loop.HandoffFilter`); after ``max_position`` every change passes.

The rows' versions are their chunk's snapshot version plus ``version_base``, the capture's version base on
``server_id`` (raised at a failover: :func:`exactly_once_provider.capture.resume.full_load_version_base`); the
capture hands off only a load with its own base and server (:func:`~exactly_once_provider.capture.resume.
check_full_loads`). Markers without them (older loads) mean base 0, server not recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.full_load.plan import chunk_from_json
from exactly_once_provider.positions import BinlogPosition, parse_position
from exactly_once_provider.sinks import current_table, delta_commit, delta_log
from exactly_once_provider.source.snapshot import Chunk

MARKER_KEY = current_table.FULL_LOAD_MARKER
FORMAT = 1


@dataclass(frozen=True)
class ChunkPosition:
    """One loaded chunk: its key range and the exact binlog position of its snapshot."""

    chunk: Chunk
    position: BinlogPosition
    rows: int


@dataclass(frozen=True)
class Handoff:
    """What the full load hands to the binlog capture."""

    load_id: str
    schema: str
    table: str
    key: tuple[str, ...]
    rows: int
    chunks: tuple[ChunkPosition, ...]
    table_version: int
    columns: tuple[Column, ...] = ()
    version_base: int = 0
    server_id: int | None = None

    @property
    def min_position(self) -> BinlogPosition:
        """Where the capture starts reading."""
        return min((c.position for c in self.chunks), key=lambda p: p.sort_key)

    @property
    def max_position(self) -> BinlogPosition:
        """After this position every change passes the filter."""
        return max((c.position for c in self.chunks), key=lambda p: p.sort_key)

    @property
    def min_version(self) -> int:
        """The change-record version at ``min_position`` (on the capture's scale: base included)."""
        return self.min_position.version + self.version_base

    def chunk_version(self, chunk: ChunkPosition) -> int:
        """Return the change-record version at ``chunk``'s snapshot position (base included)."""
        return chunk.position.version + self.version_base

    def snapshot_version_sql(self, key_sql: str) -> str:
        """Return a Spark SQL expression: the snapshot version of the chunk holding the key ``key_sql``.

        Exact per chunk for a key of one integer column (Spark orders integers as the server does). For other
        keys it is :attr:`min_version`, the oldest chunk's: a collation orders text on the server, not in Spark,
        and a key placed in the wrong chunk could be given a newer snapshot than the one that read it.

        :param key_sql: the key column as Spark SQL (quoted).
        """
        chunks = sorted(self.chunks, key=lambda c: c.chunk.index)
        bounds = [c.chunk.upper for c in chunks[:-1]]
        if len(self.key) != 1 or not all(b is not None and type(b[0]) is int for b in bounds):
            return str(self.min_version)
        cases: list[tuple[int, int]] = []  # (upper, version); neighbours of one version share one branch
        for upper, chunk in zip(bounds, chunks):
            if cases and cases[-1][1] == self.chunk_version(chunk):
                cases[-1] = (upper[0], cases[-1][1])
            else:
                cases.append((upper[0], self.chunk_version(chunk)))
        last = self.chunk_version(chunks[-1])
        while cases and cases[-1][1] == last:
            cases.pop()
        branches = " ".join(f"WHEN {key_sql} <= {upper} THEN {version}" for upper, version in cases)
        return f"(CASE {branches} ELSE {last} END)" if branches else str(last)


def marker(
    load_id: str,
    schema: str,
    table: str,
    key: tuple[str, ...],
    chunks: list[dict],
    columns: list[dict] = (),
    staging: str | None = None,
    version_base: int = 0,
    server_id: int | None = None,
) -> dict:
    """Build the commit marker from chunk dicts (``plan.chunk_to_json`` + file, pos, rows) and column dicts.

    :param staging: the load's staging directory (its manifest keeps the published marker).
    :param version_base: added to the rows' snapshot versions (the capture's base on ``server_id``).
    :param server_id: the ``server_id`` of the server the snapshots were read from.
    """
    positions = [parse_position(c) for c in chunks]
    lowest, highest = (min(positions, key=lambda p: p.sort_key), max(positions, key=lambda p: p.sort_key))
    return {
        MARKER_KEY: {
            "format": FORMAT,
            "load_id": load_id,
            "schema": schema,
            "table": table,
            "key": list(key),
            "columns": list(columns),
            "staging": staging,
            "version_base": int(version_base),
            "server_id": server_id,
            "rows": sum(c["rows"] for c in chunks),
            "min_position": lowest.to_json(),
            "max_position": highest.to_json(),
            "chunks": sorted(chunks, key=lambda c: c["index"]),
        }
    }


def parse(table_version: int, data: dict) -> Handoff:
    """Return the :class:`Handoff` a commit marker describes."""
    body = data[MARKER_KEY]
    if body.get("format") != FORMAT:
        raise ValueError(f"Unknown full-load handoff format {body.get('format')!r}; expected {FORMAT}.")
    chunks = tuple(ChunkPosition(chunk_from_json(c), parse_position(c), int(c["rows"])) for c in body["chunks"])
    return Handoff(
        body["load_id"],
        body["schema"],
        body["table"],
        tuple(body["key"]),
        int(body["rows"]),
        chunks,
        table_version,
        tuple(Column(**c) for c in body.get("columns", ())),
        int(body.get("version_base") or 0),
        body.get("server_id"),
    )


def read_handoff(sink_path: delta_log.Table) -> Handoff:
    """Return the handoff of the newest full load published into the Delta table at ``sink_path``.

    Reads the log newest first and stops at the first commit that is a full load or a current-table stream
    commit; a stream commit points to its full load (:data:`~exactly_once_provider.sinks.current_table.POINTER`),
    read from its commit file or, when log cleanup removed it, from the load's staging manifest.

    :param sink_path: the lakehouse table the full load wrote (its location, or the storage rooted at it).
    """
    if not isinstance(sink_path, str):
        return _read_handoff(sink_path, sink_path.uri())
    return _read_handoff(sink_path, sink_path)


def _read_handoff(table: delta_log.Table, sink_path: str) -> Handoff:
    for version, actions in delta_commit.commits(table):
        raw = actions.get("commitInfo", {}).get("userMetadata")
        found = json.loads(raw) if raw else None
        if not isinstance(found, dict):
            continue
        if MARKER_KEY in found:
            return parse(version, found)
        pointer = next(
            (
                body[current_table.POINTER]
                for key, body in found.items()
                if key.startswith("eo_stream:") and isinstance(body, dict) and body.get(current_table.POINTER)
            ),
            None,
        )
        if pointer is not None:
            return _pointed(table, sink_path, pointer)
    raise LookupError(
        f"No full-load commit found in the Delta log of {sink_path}: run the full load (or a full_reload) "
        "before starting the capture."
    )


def has_full_load(sink_path: str) -> bool:
    """Return whether a full load was published into ``sink_path``."""
    try:
        read_handoff(sink_path)
    except LookupError:
        return False
    return True


def _pointed(table: delta_log.Table, sink_path: str, pointer: dict) -> Handoff:
    """Return the handoff a stream commit points to: its commit file, else the load's staging manifest."""
    from exactly_once_provider.full_load.staging import Staging

    version, load_id = int(pointer["version"]), pointer["load_id"]
    try:
        actions = delta_commit.read_commit(table, version)
    except FileNotFoundError:
        actions = None
    if actions is not None:
        found = json.loads(actions.get("commitInfo", {}).get("userMetadata") or "{}")
        if found.get(MARKER_KEY, {}).get("load_id") == load_id:
            return parse(version, found)
    manifest = Staging(pointer["staging"]).load() if pointer.get("staging") else None
    published = (manifest or {}).get("published") or {}
    if published.get("marker", {}).get(MARKER_KEY, {}).get("load_id") == load_id:
        return parse(int(published["table_version"]), published["marker"])
    raise delta_commit.CommitMarkerError(
        f"The full load {load_id} (Delta version {version}) that {sink_path} builds on is neither in its Delta log "
        f"(cleaned up) nor in its staging manifest {pointer.get('staging')}: its handoff positions are lost. Run a "
        "full_reload."
    )
