"""The history -> stream handoff: per-chunk snapshot positions recorded in the full load's sink commit.

Format, stored as the Delta commit's ``userMetadata`` (JSON) by :mod:`exactly_once_provider.full_load.job`::

    {"eo_full_load": {
        "format": 1, "load_id": "...", "schema": "eo", "table": "orders", "key": ["id"],
        "columns": [{"name": "id", "data_type": "int", ...}, ...],   # the loaded columns (columns.Column)
        "rows": 1000000, "min_position": {"file": "binlog.000003", "pos": 4711},
        "max_position": {...},
        "chunks": [{"index": 0, "lower": null, "upper": [100000], "file": "binlog.000003", "pos": 4711,
                    "rows": 100000}, ...]}}

Key bounds are JSON-typed by :mod:`exactly_once_provider.full_load.plan` (``{"b64": ..}`` for bytes, ...).
A chunk holds the keys ``lower < key <= upper`` (``null`` = unbounded). The capture starts at
``min_position`` and drops a change of key ``k`` whose position is at or before the position of the chunk
holding ``k`` (the capture's :class:`~exactly_once_provider.capture.loop.HandoffFilter`); after ``max_position`` every change passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from exactly_once_provider.sinks import delta_commit
from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.full_load.plan import chunk_from_json
from exactly_once_provider.source.snapshot import Chunk
from exactly_once_provider.positions import BinlogPosition, parse_position

MARKER_KEY = "eo_full_load"
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

    @property
    def min_position(self) -> BinlogPosition:
        """Where the capture starts reading."""
        return min((c.position for c in self.chunks), key=lambda p: p.sort_key)

    @property
    def max_position(self) -> BinlogPosition:
        """After this position every change passes the filter."""
        return max((c.position for c in self.chunks), key=lambda p: p.sort_key)


def marker(load_id: str, schema: str, table: str, key: tuple[str, ...], chunks: list[dict],
           columns: list[dict] = ()) -> dict:
    """Build the commit marker from chunk dicts (``plan.chunk_to_json`` + file, pos, rows) and column dicts."""
    positions = [parse_position(c) for c in chunks]
    lowest, highest = (min(positions, key=lambda p: p.sort_key), max(positions, key=lambda p: p.sort_key))
    return {MARKER_KEY: {
        "format": FORMAT, "load_id": load_id, "schema": schema, "table": table, "key": list(key),
        "columns": list(columns),
        "rows": sum(c["rows"] for c in chunks),
        "min_position": lowest.to_json(),
        "max_position": highest.to_json(),
        "chunks": sorted(chunks, key=lambda c: c["index"]),
    }}


def parse(table_version: int, data: dict) -> Handoff:
    """Return the :class:`Handoff` a commit marker describes."""
    body = data[MARKER_KEY]
    if body.get("format") != FORMAT:
        raise ValueError(f"Unknown full-load handoff format {body.get('format')!r}; expected {FORMAT}.")
    chunks = tuple(ChunkPosition(chunk_from_json(c), parse_position(c), int(c["rows"]))
                   for c in body["chunks"])
    return Handoff(body["load_id"], body["schema"], body["table"], tuple(body["key"]), int(body["rows"]), chunks,
                   table_version, tuple(Column(**c) for c in body.get("columns", ())))


def read_handoff(sink_path: str) -> Handoff:
    """Return the handoff of the newest full load published into the Delta table at ``sink_path``.

    :param sink_path: the lakehouse table the full load wrote.
    """
    found = delta_commit.latest_marker(sink_path, MARKER_KEY)
    if found is None:
        raise LookupError(
            f"No full-load commit found in the Delta log of {sink_path}: run the full load (or a full_reload) "
            "before starting the capture."
        )
    return parse(*found)
