"""Binlog positions: the version every change carries and the resume point every reader stores."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_BINLOG_INDEX = re.compile(r"\.(\d+)$")


@dataclass(frozen=True, order=False)
class BinlogPosition:
    """A position in the server's binary log: ``file`` (e.g. ``binlog.000042``) and byte offset ``pos``.

    Positions order by the numeric suffix of the file name, then by offset, so they can be compared
    across log rotations (``binlog.000009`` < ``binlog.000010``).
    """

    file: str
    pos: int

    def __post_init__(self) -> None:
        if not _BINLOG_INDEX.search(self.file):
            raise ValueError(f"Binlog file name {self.file!r} has no numeric suffix like '.000001'.")
        if self.pos < 0:
            raise ValueError(f"Binlog position must be >= 0, got {self.pos}.")

    @property
    def sort_key(self) -> tuple[int, int]:
        """Return ``(file index, offset)``, the total order of positions on one server."""
        match = _BINLOG_INDEX.search(self.file)
        assert match is not None  # checked in __post_init__
        return int(match.group(1)), self.pos

    @property
    def version(self) -> int:
        """Return ``file_index * 2**32 + offset``: the change-record version of row 0 of a rows event starting here.

        A change record's ``version`` is ``file_index * 2**32 + event_start + row``
        (:mod:`exactly_once_provider.capture.change_record`), so a change is in a snapshot taken at this position
        exactly when its version is below this one: its event ends at or before the position.
        """
        index, offset = self.sort_key
        return (index << 32) + offset

    def __lt__(self, other: BinlogPosition) -> bool:
        return self.sort_key < other.sort_key

    def __le__(self, other: BinlogPosition) -> bool:
        return self.sort_key <= other.sort_key

    def __gt__(self, other: BinlogPosition) -> bool:
        return self.sort_key > other.sort_key

    def __ge__(self, other: BinlogPosition) -> bool:
        return self.sort_key >= other.sort_key

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}"

    def to_json(self) -> dict[str, Any]:
        """Return ``{"file": ..., "pos": ...}``, the JSON form :func:`parse_position` reads back."""
        return {"file": self.file, "pos": self.pos}


def parse_position(value: Any) -> BinlogPosition:
    """Return the binlog position ``value`` holds: THE parser of every wire form a position travels in.

    The forms: ``"FILE:POS"`` (``str(position)``: a user's ``start_position``, status and result JSON),
    ``{"file": f, "pos": p}`` (:meth:`BinlogPosition.to_json`: the capture's ledger offset, the full load's
    handoff chunks and staging manifest), the same nested under ``"position"``, and the names other readers use,
    ``log_file``/``log_pos`` (python-mysql-replication) and ``binlog_file``/``binlog_pos`` (a full-load chunk's
    result). A :class:`BinlogPosition` is returned as it is.

    :param value: the position in any of these forms.
    :raises ValueError: ``value`` holds no binlog position.
    """
    if isinstance(value, BinlogPosition):
        return value
    if isinstance(value, str):
        file, sep, pos = value.rpartition(":")
        if not sep or not pos.isdigit():
            raise ValueError(f"Binlog position {value!r}: use 'FILE:POS', e.g. 'binlog.000003:4711'.")
        return BinlogPosition(file, int(pos))
    if isinstance(value, dict):
        if isinstance(value.get("position"), (dict, str)):
            return parse_position(value["position"])
        for file_key, pos_key in (("file", "pos"), ("log_file", "log_pos"), ("binlog_file", "binlog_pos")):
            if file_key in value and pos_key in value:
                return BinlogPosition(str(value[file_key]), int(value[pos_key]))
    raise ValueError(f"{value!r} holds no binlog position (file and pos).")
