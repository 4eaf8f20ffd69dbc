"""The reconciled sink's dead letters: their keys are reported as dead-lettered, not as mismatches (issue 41).

A record the pipeline dead-lettered (:mod:`exactly_once_provider.sinks.dead_letters`) is a key the sink may lack
or hold in an older state on purpose: the reconciliation reads the keys of the pipeline's letters from its store
and reports a differing key among them as ``dead_lettered`` (not a mismatch: the result stays clean), naming it.
A dead-lettered key the sink holds as the source does (a later good change applied) is no difference at all.

A letter's key is read from its raw value, its undecodable bytes replaced: the row's JSON at the sink's key paths
(record-shaped sinks: a settlement window's ``row``), or the change record's ``after``/``before`` image (the
current table). A letter whose key cannot be read names no key: its row, if it differs, stays a mismatch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from exactly_once_provider.reconcile import engine
from exactly_once_provider.reconcile.keys import Key, from_json
from exactly_once_provider.reconcile.sides import SinkSpec
from exactly_once_provider.sinks.dead_letters import json_at, store_rows

KIND = "dead_lettered"


def letter_keys(values: Iterable[bytes | None], key: Key, spec: SinkSpec) -> dict[int, str]:
    """Return the bisected integer -> label of each key the letters' raw ``values`` name (see the module).

    :param values: the letters' ``record_value`` bytes.
    :param key: the reconciled key.
    :param spec: the sink (its JSON paths, for record-shaped sinks).
    """
    if spec.json_column:
        paths = [list(spec.key_json_paths or ((*spec.json_path, key.names[0]),))] if not key.hashed else None
        if paths is None:  # record-shaped sinks are compared by one integer key (sides.py): no other key to read
            return {}
    else:
        paths = [[("after", name), ("before", name)] for name in key.names]
    found: dict[int, str] = {}
    for value in values:
        if value is None:
            continue
        try:
            record = json.loads(bytes(value).decode("utf-8", errors="replace"))
        except ValueError:
            continue
        raw = [
            next((v for v in (json_at(record, p) for p in alternatives) if v is not None), None)
            for alternatives in paths
        ]
        if any(v is None for v in raw):
            continue
        try:
            typed = [from_json(v, c) for v, c in zip(raw, key.columns, strict=True)]
            found[key.of_values(typed)] = key.label(typed)
        except (ValueError, TypeError, ArithmeticError):
            continue  # a key value the column cannot hold: no key of the source table
    return found


def relabel(report: engine.Report, keys: dict[int, str]) -> list[str]:
    """Report each differing key of ``keys`` as :data:`KIND` instead of a mismatch; return their labels."""
    named = []
    for i, difference in enumerate(report.differences):
        if difference.kind in engine.MISMATCH_KINDS and difference.key in keys:
            report.differences[i] = engine.Difference(
                difference.key,
                KIND,
                difference.source_rows,
                difference.sink_rows,
                difference.label or keys[difference.key],
            )
            named.append(difference.label or keys[difference.key])
    return named


def store_values(
    kind: str, store: str, pipeline: str, pg_conn: Any = None, storage_options: dict | None = None
) -> list[bytes | None]:
    """Return the raw values of ``pipeline``'s letters in its store ([] while it has none: no store yet).

    :param kind: ``postgres`` (the table ``store``, read through ``pg_conn``) or ``delta`` (the Delta table at
        ``store``, read with delta-rs): :func:`~exactly_once_provider.sinks.dead_letters.store_rows`.
    """
    rows = store_rows(kind, store, pipeline, ("record_value",), pg_conn, storage_options)
    return [r["record_value"] for r in rows]
