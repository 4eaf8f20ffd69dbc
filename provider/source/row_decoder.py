"""A faster decoder of binlog row images, giving exactly the values python-mysql-replication gives.

python-mysql-replication decodes each column of each row through a chain of attribute lookups and type tests
(``RowsEvent._read_column_data``): on the capture benchmark that is most of the capture's CPU. Here each table
shape gets its readers once (one small function per column, chosen by type), and a rows event's body is read
from one ``bytes`` object.

Exactness: every reader mirrors the library 1.0.17 code it replaces (same struct formats, signedness, the
``datetime``/``Decimal`` objects it builds), so the capture's conversions see the same values either way
(``tests/integration/provider/source/test_row_decoder.py`` compares both on every supported type). Anything
else is left to the library: a table with a column type not listed in :func:`_reader` (BIT, SET, TIME, JSON,
GEOMETRY, binary-charset strings, charsets Python has no codec for), a partial row image
(``binlog_row_image`` other than FULL), an event split over several packets, and any row that would come out
as a "none source" other than NULL (zero dates): on those the body is handed back to the library untouched.
"""

from __future__ import annotations

import codecs
import datetime as dt
import decimal
import struct
from collections.abc import Callable, Sequence
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.row_event import RowsEvent, UpdateRowsEvent

Reader = Callable[[bytes, int], tuple[Any, int]]
_EPOCH = dt.datetime(1970, 1, 1)
_DECIMAL_SIZES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes of a group of 0..9 leftover digits


class _NotExact(Exception):
    """A value this decoder does not give exactly like the library (zero dates): the library decodes the event."""


def _fixed(fmt: str) -> Reader:
    unpack, size = struct.Struct(fmt).unpack_from, struct.calcsize(fmt)
    return lambda buf, pos: (unpack(buf, pos)[0], pos + size)


def _int24(signed: bool) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[int, int]:
        return int.from_bytes(buf[pos : pos + 3], "little", signed=signed), pos + 3

    return read


def _fraction(fsp: int) -> Callable[[bytes, int], tuple[int, int]]:
    """Return the reader of a DATETIME2/TIMESTAMP2 fraction: (microseconds, new position)."""
    size = (fsp + 1) // 2
    scale = 10 ** (6 - fsp)

    def read(buf: bytes, pos: int) -> tuple[int, int]:
        value = int.from_bytes(buf[pos : pos + size], "big", signed=True)
        if fsp % 2:
            value = int(value / 10)
        return value * scale, pos + size

    if size == 0:
        return lambda buf, pos: (0, pos)
    return read


def _datetime2(fsp: int) -> Reader:
    fraction = _fraction(fsp)

    def read(buf: bytes, pos: int) -> tuple[dt.datetime, int]:
        packed = int.from_bytes(buf[pos : pos + 5], "big")
        year_month = (packed >> 22) & 0x1FFFF
        try:
            value = dt.datetime(
                year_month // 13,
                year_month % 13,
                (packed >> 17) & 0x1F,
                (packed >> 12) & 0x1F,
                (packed >> 6) & 0x3F,
                packed & 0x3F,
            )
        except ValueError:
            raise _NotExact from None
        micros, pos = fraction(buf, pos + 5)
        return (value.replace(microsecond=micros) if micros > 0 else value), pos

    return read


def _timestamp2(fsp: int) -> Reader:
    fraction = _fraction(fsp)

    def read(buf: bytes, pos: int) -> tuple[dt.datetime, int]:
        seconds = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
        micros, pos = fraction(buf, pos + 4)
        return _EPOCH + dt.timedelta(seconds=seconds, microseconds=micros), pos

    return read


def _date(buf: bytes, pos: int) -> tuple[dt.date, int]:
    packed = int.from_bytes(buf[pos : pos + 3], "little")
    year, month, day = (packed >> 9) & 0x7FFF, (packed >> 5) & 0xF, packed & 0x1F
    if not (year and month and day):
        raise _NotExact  # the library returns None with a "none source": the capture refuses it there
    return dt.date(year, month, day), pos + 3


def _decimal(precision: int, scale: int) -> Reader:
    integral = precision - scale
    whole_int, lead = divmod(integral, 9)
    whole_frac, tail = divmod(scale, 9)
    lead_size, tail_size = _DECIMAL_SIZES[lead], _DECIMAL_SIZES[tail]
    size = lead_size + 4 * (whole_int + whole_frac) + tail_size

    def read(buf: bytes, pos: int) -> tuple[decimal.Decimal, int]:
        raw = bytearray(buf[pos : pos + size])
        negative = not raw[0] & 0x80
        raw[0] ^= 0x80
        if negative:  # every byte is inverted
            raw = bytes(b ^ 0xFF for b in raw)
        parts = ["-" if negative else ""]
        at = 0
        if lead_size:
            parts.append(str(int.from_bytes(raw[:lead_size], "big")))
            at = lead_size
        for _ in range(whole_int):
            parts.append(f"{int.from_bytes(raw[at : at + 4], 'big'):09d}")
            at += 4
        parts.append(".")
        for _ in range(whole_frac):
            parts.append(f"{int.from_bytes(raw[at : at + 4], 'big'):09d}")
            at += 4
        if tail_size:
            parts.append(f"{int.from_bytes(raw[at : at + tail_size], 'big'):0{tail}d}")
        return decimal.Decimal("".join(parts)), pos + size

    return read


def _text(length_size: int, encoding: str) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[str, int]:
        length = int.from_bytes(buf[pos : pos + length_size], "little")
        start = pos + length_size
        return buf[start : start + length].decode(encoding), start + length

    return read


def _enum(size: int, values: Sequence[str]) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[str, int]:
        return values[int.from_bytes(buf[pos : pos + size], "little")], pos + size

    return read


def _encoding(column: Any) -> str | None:
    name = getattr(column, "character_set_name", None)
    if name is None:
        return "utf-8"  # no charset in the table map: the library decodes as UTF-8
    if name == "binary":
        return None
    encoding = RowsEvent.charset_to_encoding(name)
    try:
        codecs.lookup(encoding)
    except LookupError:
        return None
    return encoding


def _reader(column: Any) -> Reader | None:
    """Return the reader of one column's value, or None if the library must decode this table."""
    kind, unsigned = column.type, bool(getattr(column, "unsigned", False))
    if kind == FIELD_TYPE.TINY:
        return _fixed("<B" if unsigned else "<b")
    if kind == FIELD_TYPE.SHORT:
        return _fixed("<H" if unsigned else "<h")
    if kind == FIELD_TYPE.INT24:
        return _int24(signed=not unsigned)
    if kind == FIELD_TYPE.LONG:
        return _fixed("<I" if unsigned else "<i")
    if kind == FIELD_TYPE.LONGLONG:
        return _fixed("<Q" if unsigned else "<q")
    if kind == FIELD_TYPE.FLOAT:
        return _fixed("<f")
    if kind == FIELD_TYPE.DOUBLE:
        return _fixed("<d")
    if kind == FIELD_TYPE.YEAR:
        return lambda buf, pos: (buf[pos] + 1900, pos + 1)
    if kind == FIELD_TYPE.NEWDECIMAL:
        return _decimal(column.precision, column.decimals)
    if kind == FIELD_TYPE.DATE:
        return _date
    if kind == FIELD_TYPE.DATETIME2:
        return _datetime2(column.fsp)
    if kind == FIELD_TYPE.TIMESTAMP2:
        return _timestamp2(column.fsp)
    if kind == FIELD_TYPE.ENUM and getattr(column, "enum_values", None):
        return _enum(column.size, column.enum_values)
    encoding = _encoding(column)
    if encoding is None:
        return None
    if kind in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING):
        return _text(2 if column.max_length > 255 else 1, encoding)
    if kind == FIELD_TYPE.BLOB:
        return _text(column.length_size, encoding)
    return None


class RowDecoder:
    """Decode the rows of a table's rows events; built once per table shape (:func:`row_decoder`)."""

    def __init__(self, names: tuple[str, ...], readers: tuple[Reader, ...]) -> None:
        self.names = names
        self.readers = readers
        self.null_bytes = (len(names) + 7) // 8
        self.full_bitmap = (b"\xff" * self.null_bytes)[:-1] + bytes(
            [(1 << (len(names) - 8 * (self.null_bytes - 1))) - 1]
        )

    def rows(self, event: Any) -> list[dict[str, Any]] | None:
        """
        Return the event's rows as the library's ``event.rows`` would and move past them, or None when the library
        must decode them (the event is then untouched).

        :param event: a Write/Update/DeleteRowsEvent of this decoder's table, not yet read.
        """
        rows = self.peek(event)
        if rows is not None:
            event.packet.advance(event.event_size - event.packet.read_bytes)
        return rows

    def peek(self, event: Any) -> list[dict[str, Any]] | None:
        """Return the event's rows without moving past them, or None when the library must decode them."""
        update = isinstance(event, UpdateRowsEvent)
        wrapper = event.packet
        if (
            not event.complete
            or event.number_of_columns != len(self.names)
            or event.columns_present_bitmap != self.full_bitmap
            or (update and event.columns_present_bitmap2 != self.full_bitmap)
            or getattr(wrapper, "_BinLogPacketWrapper__data_buffer", b"")
        ):
            return None
        # Read the body where the packet holds it, without consuming it: the library's own "unread" appends to
        # its buffer instead of prepending (its DECIMAL reader relies on an empty buffer), so bytes handed back
        # would be decoded out of order.
        packet = wrapper.packet
        start = packet._position
        body = packet._data[start : start + event.event_size - wrapper.read_bytes]
        try:
            return self._decode(body, update)
        except (_NotExact, ValueError, IndexError, struct.error, UnicodeDecodeError):
            return None

    def _decode(self, body: bytes, update: bool) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        image = self._image
        pos, end = 0, len(body)
        while pos < end:
            if update:
                before, pos = image(body, pos)
                after, pos = image(body, pos)
                rows.append(
                    {
                        "before_values": before,
                        "before_none_sources": _nulls(before),
                        "after_values": after,
                        "after_none_sources": _nulls(after),
                    }
                )
            else:
                values, pos = image(body, pos)
                rows.append({"values": values, "none_sources": _nulls(values)})
        if pos != end:
            raise _NotExact
        return rows

    def _image(self, body: bytes, pos: int) -> tuple[dict[str, Any], int]:
        nulls = int.from_bytes(body[pos : pos + self.null_bytes], "little")
        pos += self.null_bytes
        values: dict[str, Any] = {}
        if not nulls:
            for name, read in zip(self.names, self.readers):
                values[name], pos = read(body, pos)
            return values, pos
        bit = 1
        for name, read in zip(self.names, self.readers):
            if nulls & bit:
                values[name] = None
            else:
                values[name], pos = read(body, pos)
            bit <<= 1
        return values, pos


def _nulls(values: dict[str, Any]) -> dict[str, str]:
    return {name: "null" for name, value in values.items() if value is None} if None in values.values() else {}


def row_decoder(columns: Sequence[Any]) -> RowDecoder | None:
    """Return the decoder of a table map's columns, or None if some column is left to the library."""
    readers = tuple(_reader(column) for column in columns)
    if not columns or any(reader is None for reader in readers):
        return None
    return RowDecoder(tuple(column.name for column in columns), readers)  # type: ignore[arg-type]


_TYPE_NAMES = {code: name for name, code in reversed(vars(FIELD_TYPE).items()) if name.isupper()}


def library_columns(columns: Sequence[Any]) -> list[str]:
    """Return the columns that make a table's rows go to the library, as ``name (binlog type[, charset])``."""
    return [
        f"{column.name} ({_TYPE_NAMES.get(column.type, column.type)}"
        + (f", {column.character_set_name}" if getattr(column, "character_set_name", None) else "")
        + ")"
        for column in columns
        if _reader(column) is None
    ]
