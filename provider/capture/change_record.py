"""The change record: one changed row of a captured table, as the binlog capture writes it to Kafka.

Record format (format 1)
------------------------
* topic: one per table, from a template (default :data:`DEFAULT_TOPIC_TEMPLATE`, ``{pipeline}``, ``{schema}``,
  ``{table}`` placeholders); rendered names are checked against Kafka's naming rules.
* key: UTF-8 compact JSON of the primary key (the full load's chunk key), columns in key order, e.g.
  ``{"id":42}``; records of one key go to one partition, so per-key order is kept.
* value: UTF-8 compact JSON::

    {
      "format": 1,
      "op": "c" | "u" | "d",                  # insert, update, delete
      "pk": {"id": 42},                        # same as the key
      "before": {...} | null,                  # full row before (u, d); column name -> JSON value
      "after":  {...} | null,                  # full row after (c, u)
      "version": 4294971391,                   # orders all changes of a server, see below
      "source": {
        "server_id": 1, "file": "binlog.000001", "pos": 4095,   # the rows event's start
        "row": 0,                              # index of the row inside its rows event
        "gtid": "0-1-77" | null,               # the source transaction (MariaDB GTID)
        "commit_file": "binlog.000001", "commit_pos": 4200,     # end of the transaction's commit event
        "txn_row": 0, "txn_rows": 3,           # index of the change in its transaction / changes in it
        "schema": "eo", "table": "orders"
      },
      "commit_ts": "2026-11-21T03:00:00Z",    # commit time (the binlog keeps seconds)
      "schema_version": "9f86d081884c7d65"    # changes when the table's columns change (ALTER TABLE)
    }

Values are typed as :func:`exactly_once_provider.source.binlog.column_converter` documents (DECIMAL as
exact strings, TIMESTAMP as UTC ISO with ``Z``, DATETIME as wall-clock ISO, binary as base64, SET as arrays).

The JSON text is exactly Python's ``json.dumps(..., separators=(",", ":"), ensure_ascii=False)`` of that object
(UTF-8, keys in the order shown, image columns in table order); orjson writes it, with FLOAT/DOUBLE values
spelled as Python's ``repr`` (orjson would write ``1e-5`` where Python writes ``1e-05``).

``version`` = ``file_index * 2**32 + event_start + row``: a row occupies at least one byte of its rows event, so
``event_start + row`` stays below the next event's start, and the number strictly increases with binlog order
(fits a signed 64-bit integer; Spark's CDC mode reads it as ``bigint``). After a failover to another server the
capture adds a ``version_base`` (kept in its ledger record) so versions keep growing across servers. An UPDATE that changes the key is
written as a delete of the old key and a create of the new one (same version, different keys).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import orjson

from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source.binlog import RowChange, SchemaChange, SourceTransaction, TableShape

FORMAT = 1
DEFAULT_TOPIC_TEMPLATE = "{pipeline}.{schema}.{table}"
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_dumps = orjson.dumps  # compact UTF-8 JSON bytes, the same text as the stdlib's for every type but float
# One record's value; the parts that do not change within a transaction or a table are pre-encoded.
_VALUE = (
    b'{"format":%d,"op":"%b","pk":%b,"before":%b,"after":%b,"version":%d,"source":{"server_id":%b,'
    b'"file":%b,"pos":%d,"row":%d,%b%d%b'
)
_OPS = {op: op.encode() for op in ("c", "u", "d")}


@functools.lru_cache(maxsize=64)
def _file_index(file: str) -> int:
    return BinlogPosition(file, 0).sort_key[0]


def version_of(file: str, event_start: int, row: int) -> int:
    """
    Return the ordering version of a row change: ``file_index * 2**32 + event_start + row``.

    :param file: the binlog file name (``binlog.000042``).
    :param event_start: the start offset of the rows event.
    :param row: the index of the row inside the event.
    """
    return (_file_index(file) << 32) + event_start + row


def topic_for(template: str, pipeline: str, schema: str, table: str) -> str:
    """
    Return the topic of a table, refusing names Kafka does not accept.

    :param template: e.g. ``"{pipeline}.{schema}.{table}"``.
    :param pipeline: the pipeline name.
    :param schema: the source database.
    :param table: the source table.
    """
    try:
        name = template.format(pipeline=pipeline, schema=schema, table=table)
    except (KeyError, IndexError) as err:
        raise ValueError(
            f"topic_template {template!r} uses unknown placeholder {err}; use {{pipeline}}, {{schema}} and {{table}}."
        ) from None
    if not _TOPIC.match(name) or name in (".", ".."):
        raise ValueError(
            f"topic_template {template!r} gives {name!r} for {schema}.{table}, which is not a valid "
            "Kafka topic name (1-249 of letters, digits, '.', '_', '-'). Change the template."
        )
    return name


class ChangeRecord(NamedTuple):
    """A change ready to produce: a :class:`~exactly_once_provider.kafka.writer.Message` (its first
    four fields, same names, same order) plus what the handoff filter needs; the capture hands it to the
    writer as is.

    A named tuple: one is built per changed row, and tuples are the cheapest to build.
    """

    value: bytes
    key: bytes
    headers: None
    topic: str
    key_values: tuple
    schema: str
    table: str


def _iso(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def records_of(
    txn: SourceTransaction, topics: dict[tuple[str, str], str], version_base: int = 0
) -> Iterator[ChangeRecord]:
    """
    Yield the change records of a committed transaction, in binlog order.

    The value is filled into a byte template from JSON-encoded parts (one encode per image, the transaction's
    and the table's constant parts once): the same bytes a compact ``json.dumps`` of the documented object gives.

    :param txn: the transaction.
    :param topics: the topic of each captured ``(schema, table)``.
    :param version_base: added to every version: raised when the capture moves to another server (a failover),
        whose binlog positions are not comparable with the old server's (:mod:`exactly_once_provider.capture.resume`).
    """
    changes = list(_split_key_changes(txn.rows))
    tail = b'"gtid":%b,"commit_file":%b,"commit_pos":%d,"txn_rows":%d,"txn_row":' % (
        _dumps(txn.gtid),
        _dumps(txn.end.file),
        txn.end.pos,
        len(changes),
    )
    server_id = _dumps(txn.server_id)
    commit_ts = _dumps(_iso(txn.commit_ts))
    tables: dict[int, tuple] = {}  # id(shape) -> what every record of that table shares in this transaction
    files: dict[str, tuple[bytes, int]] = {}
    for index, (op, row, before, after, key_values) in enumerate(changes):
        shape = row.shape
        table = tables.get(id(shape))  # the rows hold their shape: its id is stable for this call
        if table is None:
            table = tables[id(shape)] = (
                topics[(shape.schema, shape.table)],
                shape.key,
                _image_encoder(shape),
                b',"schema":%b,"table":%b},"commit_ts":%b,"schema_version":%b}'
                % (_dumps(shape.schema), _dumps(shape.table), commit_ts, _dumps(shape.schema_version)),
            )
        topic, key_columns, encode, closing = table
        file = files.get(row.file)
        if file is None:
            file = files[row.file] = (_dumps(row.file), (_file_index(row.file) << 32) + version_base)
        image = after if after is not None else before
        key = encode({column: image[column] for column in key_columns})
        value = _VALUE % (
            FORMAT,
            _OPS[op],
            key,
            b"null" if before is None else encode(before),
            b"null" if after is None else encode(after),
            file[1] + row.event_pos + row.row_index,
            server_id,
            file[0],
            row.event_pos,
            row.row_index,
            tail,
            index,
            closing,
        )
        yield ChangeRecord(value, key, None, topic, key_values, shape.schema, shape.table)


def schema_record(change: SchemaChange, topics: dict[tuple[str, str], str]) -> list[ChangeRecord]:
    """
    Return the schema record of an ``ALTER TABLE`` for the topic of each captured table it touches.

    Value (format 1, no key: it names no row; consumers of rows skip it)::

        {"format": 1, "op": "ddl", "ddl": "ALTER TABLE ...", "version": 4294971391,
         "source": {"file": "binlog.000001", "pos": 4200, "gtid": "0-1-78",
                    "schema": "eo", "table": "orders"}}

    ``version`` is the version of the position after the statement
    (:attr:`~exactly_once_provider.positions.BinlogPosition.version`): every change before it has a lower
    version, every change after it one at least as high, so a typed sink tells which rows the statement
    found (:mod:`exactly_once_provider.spark_jobs.schema_change`). The record is written in binlog order with the
    change records, in the same Kafka transactions; a topic of one partition keeps that order for readers.

    :param change: the statement.
    :param topics: the topic of each captured ``(schema, table)``.
    """
    records = []
    for schema, table in change.tables:
        value = {
            "format": FORMAT,
            "op": "ddl",
            "ddl": change.query,
            "version": change.end.version,
            "source": {
                "file": change.end.file,
                "pos": change.end.pos,
                "gtid": change.gtid,
                "schema": schema,
                "table": table,
            },
        }
        records.append(ChangeRecord(_dumps(value), None, None, topics[(schema, table)], (), schema, table))
    return records


def _image_encoder(shape: TableShape) -> Callable[[dict[str, Any]], bytes]:
    """Return the JSON encoder of the table's images (and keys): orjson, floats spelled as Python's json."""
    floats = shape.float_columns
    if not floats:
        return _dumps

    def encode(image: dict[str, Any]) -> bytes:
        image = dict(image)  # the row's image stays a plain dict of values
        for column in floats:
            value = image.get(column)
            if isinstance(value, float):
                image[column] = orjson.Fragment(_json_float(value))
        return _dumps(image)

    return encode


def _json_float(value: float) -> str:
    """Return ``value`` as Python's json writes it (``repr``; NaN and infinities as its extensions)."""
    if math.isfinite(value):
        return float.__repr__(value)
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def _split_key_changes(rows: Iterable[RowChange]) -> Iterator[tuple[str, RowChange, Any, Any, tuple]]:
    """Turn each row into (op, row, before, after, key); an update of the key becomes a delete and a create."""
    for row in rows:
        if row.op == "u" and row.key_before != row.key_after:
            yield "d", row, row.before, None, row.key_before
            yield "c", row, None, row.after, row.key_after
        elif row.op == "d":
            yield "d", row, row.before, None, row.key_before
        else:
            yield row.op, row, row.before, row.after, row.key_after


def parse(value: bytes) -> dict:
    """Parse a change record value, refusing unknown formats."""
    record = json.loads(value)
    if record.get("format") != FORMAT:
        raise ValueError(f"Change record format {record.get('format')!r} is not {FORMAT}; upgrade the reader.")
    return record
