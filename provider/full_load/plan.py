"""Chunk plans in JSON: key values keep their exact type (int, str, bytes, Decimal, date/time)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from typing import Any

from exactly_once_provider.source.snapshot import Chunk


def encode_value(value: Any) -> Any:
    """Return a JSON-safe, type-tagged form of a key value."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, decimal.Decimal):
        return {"dec": str(value)}
    if isinstance(value, dt.datetime):
        return {"dt": value.isoformat()}
    if isinstance(value, dt.date):
        return {"d": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"td": value.total_seconds()}
    if isinstance(value, float):
        return {"f": repr(value)}
    raise ValueError(f"Key value {value!r} of type {type(value).__name__} cannot be used as a chunk boundary.")


def decode_value(value: Any) -> Any:
    """Invert :func:`encode_value`."""
    if not isinstance(value, dict):
        return value
    ((tag, text),) = value.items()
    return {
        "b64": lambda: base64.b64decode(text),
        "dec": lambda: decimal.Decimal(text),
        "dt": lambda: dt.datetime.fromisoformat(text),
        "d": lambda: dt.date.fromisoformat(text),
        "td": lambda: dt.timedelta(seconds=text),
        "f": lambda: float(text),
    }[tag]()


def _edge(values: tuple | None) -> list | None:
    return None if values is None else [encode_value(v) for v in values]


def _unedge(values: list | None) -> tuple | None:
    return None if values is None else tuple(decode_value(v) for v in values)


def chunk_to_json(chunk: Chunk) -> dict:
    """Return the JSON form of a chunk."""
    return {"index": chunk.index, "lower": _edge(chunk.lower), "upper": _edge(chunk.upper)}


def chunk_from_json(data: dict) -> Chunk:
    """Return the chunk a :func:`chunk_to_json` dict describes."""
    return Chunk(int(data["index"]), _unedge(data["lower"]), _unedge(data["upper"]))
