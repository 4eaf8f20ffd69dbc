"""The binlog reader: whole committed source transactions of the captured tables, with exact positions.

Built on python-mysql-replication 1.0.x, with its sharp edges handled here (docs/pitfalls.md#mysql-and-mariadb-sources):

* **File/position resume**: ``is_mariadb=False`` + ``resume_stream=True`` + ``log_file``/``log_pos`` (with
  ``is_mariadb=True`` the library ignores the position). The library still sets
  ``@mariadb_slave_capability=4``, so MariaDB sends its GTID events and every transaction carries its GTID.
* **Transaction boundaries only**: rows are buffered per source transaction and a transaction is yielded at
  its ``XID`` (or ``COMMIT`` query for non-transactional engines). The reader only ever restarts the stream at
  the end of the last complete transaction; a ``ROLLBACK`` group is dropped. The library's own reconnect
  resumes mid-transaction (#314): a rotate event inside an open transaction is the sign of it, and the
  reader then discards the partial transaction and restarts from the last boundary itself.
* **Decoding**: tables whose columns are all of the common types are decoded by
  :mod:`~exactly_once_provider.source.row_decoder` (the same values as the library, 2.2x less CPU); the rest by
  the library.
* **Values**: converted to JSON-safe values by per-column converters (:func:`column_converter`) built once per
  table shape (schema version); columns the library already decodes to their JSON value (integers, text in a
  charset Python knows, ENUM) have none, so a row only pays for the columns that need work. TIMESTAMP
  arrives as naive UTC; negative TIME values with a fraction are decoded wrongly by the library (the
  fraction's sign) and fixed here; BINARY(n) arrives without its zero padding; an empty SET arrives as
  ``None``; BIT arrives as a string of bits. All fixed in :func:`column_converter`.
"""

from __future__ import annotations

import base64
import codecs
import datetime as dt
import hashlib
import json
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter, methodcaller
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.event import (
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, RowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from exactly_once_provider.errors import PipelineError, SourceConfigurationError
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source import ddl
from exactly_once_provider.source.row_decoder import RowDecoder, library_columns, row_decoder

# Server error 1236: "Could not find first log file name in binary log index file" (and other fatal
# reading errors of the dump thread); the message tells which.
_ER_MASTER_FATAL_READING_BINLOG = 1236
_CONNECTION_ERRORS = (pymysql.err.OperationalError, pymysql.err.InterfaceError, ConnectionError, OSError)
_EMPTY_SET = "empty set"  # python-mysql-replication's NONE_SOURCE for a SET holding no member
_OUT_OF_RANGE = "out of date"  # its NONE_SOURCE prefix for zero dates ("out of date range", "... datetime ...")
_MARIADB_GTID_STANDALONE = 1  # a group of one event (DDL) with no COMMIT/XID after it
_ROLLBACK = re.compile(r"ROLLBACK\s*(?:WORK\s*)?;?\s*$")  # not "ROLLBACK TO SAVEPOINT"
TableName = tuple[str, str]


class PurgedPositionError(SourceConfigurationError):
    """Raise when the position to read from is no longer in the server's binlog."""


def purged_message(position: BinlogPosition, retained: list[str]) -> str:
    return (
        f"Binlog position {position} can no longer be read: {position.file} was purged (the server keeps "
        f"{retained[:1] + ['...'] + retained[-1:] if len(retained) > 2 else retained}). Changes after it are "
        "lost to the binlog, so the capture refuses to skip them: run a new full load (trigger the DAG with "
        "full_reload=true) to take a new snapshot, and raise binlog_expire_logs_seconds so the capture keeps "
        "up."
    )


# ------------------------------------------------------------------------------------------ conversions
def _float32(value: float) -> float:
    """Return the shortest decimal that is the same float32 (the binlog holds FLOAT as 4 bytes)."""
    packed = struct.pack("<f", value)
    for digits in range(6, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("<f", candidate) == packed:
            return candidate
    return value


def _time_text(value: dt.timedelta, fix_fraction: bool) -> str:
    micros = value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    if fix_fraction and micros < 0 and micros % 1_000_000:
        # python-mysql-replication 1.0.17 decodes a negative TIME(fsp) as -(whole seconds + 1 - fraction):
        # -12:34:56.789 arrives as -12:34:56.211. Undo it (tests/integration/hooks/test_mysql_binlog.py).
        whole, fraction = divmod(-micros, 1_000_000)
        micros = -(whole * 1_000_000 + 1_000_000 - fraction)
    sign, micros = ("-" if micros < 0 else ""), abs(micros)
    seconds, fraction = divmod(micros, 1_000_000)
    text = f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return text + (f".{fraction:06d}" if fraction else "")


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _timestamp_text(value: dt.datetime) -> str:
    return value.isoformat() + "Z"


_isoformat = methodcaller("isoformat")  # DATETIME, DATE: C-level call, no Python frame per value
_FLOAT_TYPES = (FIELD_TYPE.FLOAT, FIELD_TYPE.DOUBLE)


def _decoded_as_text(column: Any) -> bool:
    """Return whether the library hands a text column's values over as ``str`` (it only fails to for charsets
    Python has no codec for, and then passes the raw bytes)."""
    name = getattr(column, "character_set_name", None)
    if name is None:
        return True  # no charset in the table map: the library decodes as UTF-8
    try:
        codecs.lookup(RowsEvent.charset_to_encoding(name))
    except LookupError:
        return False
    return True


def column_converter(column: Any) -> Callable[[Any], Any] | None:
    """
    Return the function turning a decoded binlog value of ``column`` into its JSON value, or None if the
    decoded value is already JSON-exact (integers of any size, text, NULL).

    ============================  =====================================================================
    source type                   JSON value
    ============================  =====================================================================
    TINYINT..BIGINT [UNSIGNED]    number (exact: BIGINT UNSIGNED up to 18446744073709551615)
    DECIMAL                       string, exact digits (``"12.30"``)
    FLOAT / DOUBLE                number (FLOAT as the shortest decimal of its 4 bytes)
    DATETIME                      ``"YYYY-MM-DDTHH:MM:SS[.ffffff]"`` (wall clock, no zone: none is stored)
    TIMESTAMP                     ``"YYYY-MM-DDTHH:MM:SS[.ffffff]Z"`` (UTC)
    DATE / TIME / YEAR            ``"YYYY-MM-DD"`` / ``"[-]HH:MM:SS[.ffffff]"`` / number
    CHAR/VARCHAR/TEXT/JSON        string (MariaDB JSON is text: kept exactly as stored)
    ENUM / SET                    string / sorted array of strings (``[]`` for the empty set)
    BINARY/VARBINARY/BLOB/BIT     base64 string (BINARY(n) zero-padded to n bytes like the server's SELECT)
    MySQL JSON (binary)           string (compact JSON text)
    ============================  =====================================================================

    :param column: a python-mysql-replication column of a table map event.
    """
    kind = column.type
    binary = getattr(column, "character_set_name", None) == "binary"
    if kind == FIELD_TYPE.NEWDECIMAL:
        return str
    if kind == FIELD_TYPE.FLOAT:
        return _float32
    if kind in (FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIMESTAMP2):
        return _timestamp_text
    if kind in (FIELD_TYPE.DATETIME, FIELD_TYPE.DATETIME2, FIELD_TYPE.DATE):
        return _isoformat
    if kind in (FIELD_TYPE.TIME, FIELD_TYPE.TIME2):
        fix = kind == FIELD_TYPE.TIME2
        return lambda v: _time_text(v, fix)
    if kind == FIELD_TYPE.SET:
        return sorted
    if kind == FIELD_TYPE.BIT:
        size = (column.bits + 7) // 8 if getattr(column, "bits", None) else None
        return lambda v: _b64(int(v, 2).to_bytes(size or max(1, (len(v) + 7) // 8), "big"))
    if kind == FIELD_TYPE.STRING and binary:
        width = column.max_length
        return lambda v: _b64(v.ljust(width, b"\x00") if isinstance(v, bytes) else v.encode())
    if kind in (FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.BLOB, FIELD_TYPE.GEOMETRY) and binary:
        return lambda v: _b64(v) if isinstance(v, bytes) else _b64(v.encode())
    if kind in (FIELD_TYPE.BLOB, FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING) and _decoded_as_text(column):
        return None  # already str
    if kind in (FIELD_TYPE.BLOB, FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING, FIELD_TYPE.VAR_STRING):
        return lambda v: v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v
    if kind == FIELD_TYPE.JSON:
        return lambda v: json.dumps(_json_text_keys(v), separators=(",", ":"), ensure_ascii=False)
    return None


def _json_text_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {(k.decode() if isinstance(k, bytes) else k): _json_text_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_text_keys(v) for v in value]
    return value.decode() if isinstance(value, bytes) else value


def _raw_key_fix(column: Any) -> Callable[[Any], Any] | None:
    """Return the fix that makes a decoded key value equal to what the snapshot (MySQLdb) read."""
    if column.type == FIELD_TYPE.STRING and getattr(column, "character_set_name", None) == "binary":
        width = column.max_length
        return lambda v: v.ljust(width, b"\x00")
    return None


@dataclass(frozen=True)
class TableShape:
    """A captured table as one table map event describes it; converters are built once per shape."""

    schema: str
    table: str
    columns: tuple[str, ...]
    schema_version: str
    converters: tuple[tuple[str, Callable[[Any], Any]], ...]
    empty_sets: frozenset[str]
    key: tuple[str, ...]
    key_fixes: tuple[Callable[[Any], Any] | None, ...]
    float_columns: tuple[str, ...] = ()  # FLOAT/DOUBLE: the record encoder writes them as Python's json does
    decoder: RowDecoder | None = field(default=None, compare=False)  # None: the library decodes the rows

    def __post_init__(self) -> None:
        object.__setattr__(self, "_key_getter", _key_getter(self.key, self.key_fixes))

    def convert(self, values: dict[str, Any], none_sources: dict[str, str]) -> dict[str, Any]:
        """Return the row with JSON-safe values (converted in place: the decoded row is not used again)."""
        row = values
        for name, convert in self.converters:
            value = row[name]
            if value is not None:
                row[name] = convert(value)
        if none_sources:
            for name, why in none_sources.items():
                if why == _EMPTY_SET and name in self.empty_sets:
                    row[name] = []
                elif why.startswith(_OUT_OF_RANGE):
                    raise PipelineError(
                        f"Column {name!r} of {self.schema}.{self.table} holds a zero or invalid date ({why}), which "
                        "has no date value: the capture refuses to turn it into NULL. Fix the row in the source "
                        "(and set sql_mode NO_ZERO_DATE,NO_ZERO_IN_DATE), then run a full reload of the table."
                    )
        return row

    def key_of(self, values: dict[str, Any]) -> tuple:
        """Return the row's key as the snapshot reads it (for the handoff comparison)."""
        try:
            return self._key_getter(values)
        except KeyError as missing:
            raise PipelineError(
                f"Key column {missing} of {self.schema}.{self.table} is not in the binlog row (columns "
                f"{list(self.columns)}): was it dropped or renamed by an ALTER TABLE? The capture cannot tell "
                "rows apart without it; restore the key or run a full reload with the new key."
            ) from None


def _key_getter(key: tuple[str, ...], fixes: tuple[Callable[[Any], Any] | None, ...]) -> Callable[[dict], tuple]:
    """Return the function reading a row's key tuple, built once per shape (most keys need no fix)."""
    if any(fixes):
        return lambda values: tuple(fix(values[c]) if fix else values[c] for c, fix in zip(key, fixes))
    if len(key) == 1:
        (column,) = key
        return lambda values: (values[column],)
    return itemgetter(*key)  # a tuple for two or more names


def table_shape(event: TableMapEvent, key: tuple[str, ...]) -> TableShape:
    """Describe a captured table from its table map event (binlog_row_metadata=FULL gives column names)."""
    columns = event.columns
    names = tuple(c.name for c in columns)
    if any(not n for n in names):
        raise SourceConfigurationError(
            f"The binlog has no column names for {event.schema}.{event.table}: set binlog_row_metadata=FULL "
            "(SET GLOBAL and my.cnf). Without it columns cannot be mapped after an ALTER TABLE."
        )
    described = [
        (
            c.name,
            c.type,
            bool(getattr(c, "unsigned", False)),
            getattr(c, "max_length", 0),
            getattr(c, "character_set_name", None),
            getattr(c, "precision", None),
            getattr(c, "decimals", None),
            list(getattr(c, "enum_values", None) or []),
            list(getattr(c, "set_values", None) or []),
        )
        for c in columns
    ]
    version = hashlib.sha256(json.dumps(described, default=str).encode()).hexdigest()[:16]
    by_name = {c.name: c for c in columns}
    converters = tuple((c.name, f) for c in columns if (f := column_converter(c)) is not None)
    empty_sets = frozenset(c.name for c in columns if c.type == FIELD_TYPE.SET)
    fixes = tuple(_raw_key_fix(by_name[k]) if k in by_name else None for k in key)
    floats = tuple(c.name for c in columns if c.type in _FLOAT_TYPES)
    return TableShape(
        event.schema, event.table, names, version, converters, empty_sets, key, fixes, floats, row_decoder(columns)
    )


# ----------------------------------------------------------------------------------------- transactions
@dataclass(slots=True)
class RowChange:
    """One changed row of a captured table: JSON-safe images, key, and where it sits in the binlog."""

    shape: TableShape
    op: str  # "c", "u", "d"
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    key_before: tuple | None
    key_after: tuple | None
    file: str
    event_pos: int  # start offset of the rows event
    row_index: int  # index of the row inside its rows event


@dataclass
class SourceTransaction:
    """A committed source transaction: its captured rows and the position right after its commit."""

    gtid: str | None
    server_id: int | None
    start: BinlogPosition
    end: BinlogPosition
    commit_ts: int  # seconds since the epoch, from the commit event header
    rows: list[RowChange] = field(default_factory=list)
    standalone: bool = False  # a MariaDB group of one statement (DDL): no COMMIT/XID follows
    tables: set[TableName] = field(default_factory=set)  # the captured tables its rows change


@dataclass(frozen=True)
class Idle:
    """No new transaction for a heartbeat period; ``position`` is the last transaction boundary."""

    position: BinlogPosition


@dataclass(frozen=True)
class SchemaChange:
    """A DDL statement on a captured table (its own transaction, ending at ``end``)."""

    tables: tuple[TableName, ...]
    kind: str  # "alter" (rows continue with a new schema version) or "rewrite" (rows changed without row events)
    query: str
    gtid: str | None
    end: BinlogPosition


def ddl_tables(query: str, default_schema: str) -> tuple[str, list[TableName]]:
    """
    Return ``(kind, tables)`` a DDL statement touches, ``kind`` ``""`` when it is not table DDL.

    ``kind`` is ``"alter"`` for ALTER TABLE (rows keep flowing with a new schema version) and ``"rewrite"`` for
    statements that change or remove rows without row events (TRUNCATE, DROP, RENAME, CREATE OR REPLACE,
    ALTER ... RENAME). Read by :func:`exactly_once_provider.source.ddl.parse`.

    :param query: the statement text from the binlog.
    :param default_schema: the session's current database (the query event's schema).
    """
    statement = ddl.parse(query, default_schema)
    if statement is None:
        return "", []
    # ALTER ... RENAME [TO|AS] new_name moves the table; RENAME COLUMN / INDEX / KEY keep its rows (followed).
    kind = "alter" if statement.verb == "ALTER" and not statement.renames_table else "rewrite"
    return kind, list(statement.tables)


def removes_tables(query: str) -> bool:
    """Return whether a DDL statement removes or moves its tables (``DROP TABLE``, ``RENAME TABLE``, ``ALTER TABLE
    ... RENAME TO``): their rows end there, unlike a TRUNCATE or a CREATE OR REPLACE that changes them in place.

    :param query: the statement text from the binlog.
    """
    statement = ddl.parse(query)
    return statement is not None and statement.removes_tables


def first_transaction_after(connection: dict[str, Any], gtid_position: str, server_id: int) -> BinlogPosition | None:
    """
    Return where the first transaction after a MariaDB GTID position starts in this server's binlog, or None
    when the binlog holds none yet (the position is its end).

    The server itself finds the place, as for a replica connecting with ``MASTER_USE_GTID``: the dump starts
    at ``@slave_connect_state`` in strict mode (a position the server's binlog does not hold is refused with
    error 1236). The caller checks the answer with ``BINLOG_GTID_POS`` (:meth:`MySqlBinlogHook.locate_gtid`).

    :param connection: the replication connection settings.
    :param gtid_position: ``"0-1-77,..."``: the last GTID of each domain already read.
    :param server_id: the replica server id to register with.
    """
    stream = BinLogStreamReader(
        dict(connection),
        server_id=server_id,
        is_mariadb=True,
        auto_position=gtid_position,
        blocking=False,
        only_events=[RotateEvent, MariadbGtidEvent],
        enable_logging=False,
    )
    file = None
    try:
        for event in stream:
            if isinstance(event, RotateEvent):
                file = event.next_binlog
            elif isinstance(event, MariadbGtidEvent) and event.packet.log_pos and file is not None:
                return BinlogPosition(file, event.packet.log_pos - event.packet.event_size)
    except pymysql.err.OperationalError as error:
        if error.args and error.args[0] == _ER_MASTER_FATAL_READING_BINLOG:
            raise GtidNotInBinlogError(
                f"The server refuses to send its binlog from GTID position {gtid_position}: {error.args[1]}. Its "
                "binlog no longer holds (purged) or never held that position, so the capture cannot continue from it "
                "on this server: run a full reload (trigger the DAG with full_reload=true)."
            ) from None
        raise
    finally:
        stream.close()
    return None


class GtidNotInBinlogError(PipelineError):
    """Raise when the server's binlog does not hold a GTID position the capture must resume from."""


def replica_server_id(pipeline: str) -> int:
    """Return a stable replica server id for a pipeline (in 2^20 .. 2^31, away from typical small ids)."""
    return (1 << 20) + zlib.crc32(pipeline.encode()) % ((1 << 31) - (1 << 20))


class _RestartStream(Exception):
    """The stream must restart from the last transaction boundary (connection lost, library reconnect)."""


class BinlogReader:
    """Iterate committed transactions from a position; see :meth:`transactions`. Not thread-safe."""

    def __init__(
        self,
        connection: dict[str, Any],
        tables: dict[TableName, tuple[str, ...]],
        server_id: int,
        heartbeat_seconds: float,
        reconnect_timeout: float,
        log: Any,
    ) -> None:
        self._connection = connection
        self.tables = dict(tables)
        self.server_id = server_id
        self.heartbeat_seconds = heartbeat_seconds
        self.reconnect_timeout = reconnect_timeout
        self.log = log
        self._shapes: dict[tuple, TableShape] = {}
        self.stream: BinLogStreamReader | None = None
        self.events_read = 0

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    def _open(self, position: BinlogPosition, blocking: bool) -> BinLogStreamReader:
        self.close()
        self.stream = BinLogStreamReader(
            dict(self._connection),
            server_id=self.server_id,
            resume_stream=True,
            log_file=position.file,
            log_pos=position.pos,
            blocking=blocking,
            is_mariadb=False,
            only_schemas=sorted({s for s, _ in self.tables}),
            only_tables=sorted({t for _, t in self.tables}),
            only_events=[
                MariadbGtidEvent,
                QueryEvent,
                XidEvent,
                XAPrepareEvent,
                RotateEvent,
                HeartbeatLogEvent,
                TableMapEvent,
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
            ],
            slave_heartbeat=self.heartbeat_seconds if blocking else None,
            enable_logging=False,
        )
        return self.stream

    def transactions(
        self, start: BinlogPosition, until: BinlogPosition | None = None, blocking: bool = False
    ) -> Iterator[SourceTransaction | SchemaChange | Idle]:
        """
        Yield every committed transaction after ``start`` (a transaction boundary), in commit order.

        Transactions that touch no captured table are yielded too (with no rows) so the caller's position
        advances. A lost connection restarts the stream at the last yielded boundary.

        :param start: the end of the last transaction already processed.
        :param until: stop after the first transaction ending at or after this position.
        :param blocking: wait for new transactions (and yield :class:`Idle` at each heartbeat); otherwise stop
            at the end of the binlog.
        """
        boundary = start
        failing_since: float | None = None
        while True:
            try:
                for item in self._read(boundary, until, blocking):
                    failing_since = None
                    if not isinstance(item, Idle):
                        boundary = item.end
                    yield item
                    if until is not None and not isinstance(item, Idle) and boundary >= until:
                        return
                return
            except _RestartStream as why:
                reason = str(why)
            except pymysql.err.OperationalError as error:
                if error.args and error.args[0] == _ER_MASTER_FATAL_READING_BINLOG:
                    self.close()
                    raise PurgedPositionError(
                        f"The server refused to send the binlog from {boundary}: {error.args[1]}. "
                        + purged_message(boundary, [])
                    ) from None
                reason = repr(error)
            except _CONNECTION_ERRORS as error:
                reason = repr(error)
            self.close()
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > self.reconnect_timeout:
                raise PipelineError(
                    f"Lost the binlog stream ({reason}) and could not resume it for {self.reconnect_timeout:.0f}s; "
                    f"nothing after {boundary} was captured. Retry the task once the server is back."
                )
            self.log.warning(
                "Binlog stream interrupted (%s); resuming at the last transaction boundary %s", reason, boundary
            )
            time.sleep(min(5.0, 0.5 + (now - failing_since) / 4))

    def _read(
        self, start: BinlogPosition, until: BinlogPosition | None, blocking: bool
    ) -> Iterator[SourceTransaction | SchemaChange | Idle]:
        stream = self._open(start, blocking)
        file = start.file
        current: SourceTransaction | None = None
        boundary = start
        maps: dict[int, TableShape | None] = {}
        for event in stream:
            self.events_read += 1
            packet = event.packet
            end = packet.log_pos
            if isinstance(event, RotateEvent):
                if current is not None:
                    raise _RestartStream("the stream restarted inside a transaction")
                file = event.next_binlog
                if event.timestamp != 0 and BinlogPosition(file, event.position) > boundary:
                    boundary = BinlogPosition(file, event.position)  # a real rotation: next file
                maps.clear()
                continue
            if isinstance(event, HeartbeatLogEvent):
                if current is None:
                    yield Idle(boundary)
                continue
            if end == 0:
                continue  # artificial events sent at the start of a dump
            event_start = end - packet.event_size
            if isinstance(event, MariadbGtidEvent):
                current = SourceTransaction(
                    event.gtid,
                    packet.server_id,
                    BinlogPosition(file, event_start),
                    boundary,
                    packet.timestamp,
                    standalone=bool(event.flags & _MARIADB_GTID_STANDALONE),
                )
                continue
            if isinstance(event, TableMapEvent):
                name = (event.schema, event.table)
                maps[event.table_id] = self._shape(event, self.tables[name]) if name in self.tables else None
                continue
            if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                shape = maps.get(event.table_id)
                if shape is None:
                    continue  # a table not captured (only_tables matches names in any schema)
                if current is None:
                    current = SourceTransaction(
                        None, packet.server_id, BinlogPosition(file, event_start), boundary, packet.timestamp
                    )
                current.rows.extend(_row_changes(event, shape, file, event_start))
                current.tables.add((shape.schema, shape.table))
                continue
            if isinstance(event, XidEvent):
                if current is None:
                    current = SourceTransaction(None, packet.server_id, boundary, boundary, packet.timestamp)
                boundary = BinlogPosition(file, end)
                current.end, current.commit_ts = boundary, packet.timestamp
                yield current
                current = None
                continue
            if isinstance(event, XAPrepareEvent):
                raise PipelineError(
                    f"XA transaction at {file}:{event_start}: XA PREPARE writes rows to the binlog before the "
                    "outcome is known, which this capture does not support. Avoid XA on captured tables."
                )
            if isinstance(event, QueryEvent):
                query = event.query if isinstance(event.query, str) else event.query.decode(errors="replace")
                statement = query.lstrip().upper()
                if statement.startswith("BEGIN"):
                    if current is None:
                        current = SourceTransaction(
                            None, packet.server_id, BinlogPosition(file, event_start), boundary, packet.timestamp
                        )
                    continue
                if statement.startswith("COMMIT"):
                    boundary = BinlogPosition(file, end)
                    if current is not None:
                        current.end, current.commit_ts = boundary, packet.timestamp
                        yield current
                        current = None
                    continue
                if _ROLLBACK.match(statement):
                    # A group ending in ROLLBACK (non-transactional changes mixed in): it never committed.
                    boundary = BinlogPosition(file, end)
                    current = None
                    continue
                if current is not None and not current.standalone:
                    continue  # a statement inside a transaction (SAVEPOINT, temporary tables, XA START ...)
                schema = event.schema.decode() if isinstance(event.schema, bytes) else event.schema
                kind, touched = ddl_tables(query, schema)
                captured = tuple(t for t in touched if t in self.tables)
                boundary = BinlogPosition(file, end)
                gtid = current.gtid if current is not None else None
                current = None
                if captured:
                    yield SchemaChange(captured, kind, query, gtid, boundary)
                else:
                    yield SourceTransaction(gtid, packet.server_id, boundary, boundary, packet.timestamp)
                continue
        if current is not None and blocking:
            raise _RestartStream("the stream ended inside a transaction")

    def _shape(self, event: TableMapEvent, key: tuple[str, ...]) -> TableShape:
        signature = (
            event.schema,
            event.table,
            tuple((c.name, c.type, getattr(c, "max_length", 0), getattr(c, "unsigned", False)) for c in event.columns),
        )
        shape = self._shapes.get(signature)
        if shape is None:
            shape = self._shapes[signature] = table_shape(event, key)
            if shape.decoder is None:
                self.log.info(
                    "Rows of %s.%s are decoded by python-mysql-replication (about half the speed of the "
                    "capture's own decoder) because of column(s) %s",
                    event.schema,
                    event.table,
                    ", ".join(library_columns(event.columns)),
                )
        return shape


def _row_changes(event: Any, shape: TableShape, file: str, event_start: int) -> Iterator[RowChange]:
    decoded = shape.decoder.rows(event) if shape.decoder is not None else None
    rows = event.rows if decoded is None else decoded
    # Keys first: convert() rewrites the decoded values in place.
    if isinstance(event, WriteRowsEvent):
        for index, row in enumerate(rows):
            values = row["values"]
            key = shape.key_of(values)
            yield RowChange(
                shape, "c", None, shape.convert(values, row["none_sources"]), None, key, file, event_start, index
            )
    elif isinstance(event, DeleteRowsEvent):
        for index, row in enumerate(rows):
            values = row["values"]
            key = shape.key_of(values)
            yield RowChange(
                shape, "d", shape.convert(values, row["none_sources"]), None, key, None, file, event_start, index
            )
    else:
        for index, row in enumerate(rows):
            before, after = row["before_values"], row["after_values"]
            key_before, key_after = shape.key_of(before), shape.key_of(after)
            yield RowChange(
                shape,
                "u",
                shape.convert(before, row["before_none_sources"]),
                shape.convert(after, row["after_none_sources"]),
                key_before,
                key_after,
                file,
                event_start,
                index,
            )


__all__ = [
    "BinlogReader",
    "GtidNotInBinlogError",
    "Idle",
    "PurgedPositionError",
    "RowChange",
    "SchemaChange",
    "SourceTransaction",
    "TableShape",
    "column_converter",
    "ddl_tables",
    "first_transaction_after",
    "replica_server_id",
    "table_shape",
]
