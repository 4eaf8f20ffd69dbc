"""Schema changes of a captured table, as the typed sinks follow them: ``ALTER TABLE`` text -> new columns.

The binlog capture writes each ``ALTER TABLE`` of a captured table into the table's topic as a schema record
(:func:`exactly_once_provider.capture.change_record.schema_record`: the statement, its binlog position and its
``version``, in binlog order with the change records). A typed sink (the current table) reads the statement
here, against the columns it holds, and either follows it or refuses it. Where the rule lives: :func:`evolve`; the
statement and its clauses are read by :mod:`exactly_once_provider.source.ddl` (comments, quoted names), the one DDL
reader the capture uses too.

What is followed (docs/schema-changes.md has the table):

* ``ADD COLUMN`` (any position; the sink keeps columns by name): typed as the full load types the column
  (:func:`exactly_once_provider.full_load.columns.arrow_type`). The rows that existed before the statement
  get the value the server gave them without writing a row event: the literal ``DEFAULT``, NULL for a
  nullable column without one, the implicit default (0, '') of a ``NOT NULL`` number or string without one.
  That value is a :class:`Fill`: every row of the sink whose version is below the statement's takes it.
* ``MODIFY`` / ``CHANGE`` to a type the full load loads as the same Spark type, no narrower on the source
  (``TINYINT`` -> ``INT``, longer ``VARCHAR``, ``TEXT`` -> ``MEDIUMTEXT``): follows, nothing to rewrite.
* ``MODIFY`` / ``CHANGE`` to a wider loaded type that holds every old value (:func:`type_change`: ``INT`` ->
  ``BIGINT``, ``INT UNSIGNED`` -> ``BIGINT UNSIGNED``, a larger ``DECIMAL`` precision (and scale with it),
  ``FLOAT`` -> ``DOUBLE``), key columns included: the new columns carry the wider type and the sink widens
  the column in the batch's own commit (Delta: :func:`exactly_once_provider.sinks.delta_merge.merge_widening`;
  PostgreSQL: ``ALTER COLUMN ... TYPE`` in the batch's transaction).
* ``DROP COLUMN``: the column stays in the sink (Delta drops a column only with column mapping, which older
  readers cannot read), and every row takes NULL in it (a :class:`Fill` of NULL): the column reads as gone
  rather than as stale values next to NULLs.
* ``RENAME COLUMN a TO b`` / ``CHANGE a b type`` (same loaded type): ``b`` is added holding ``a``'s values (a
  :class:`Fill` from ``a``), ``a`` stays and reads NULL, like a dropped column.
* Index, comment, engine, ``ALGORITHM``/``LOCK`` and ``SET DEFAULT`` clauses change no row: ignored.

Everything else is refused (:class:`RefusedSchemaChange`, naming the statement, its position and the fix,
``full_reload`` of the table): a default the binlog does not hold (``CURRENT_TIMESTAMP``, expressions,
``AUTO_INCREMENT`` numbering of old rows, generated columns), a type change that narrows the column or that
is no widening the sinks hold in place (each message says which), key changes other than a widening (renames
included), partition clauses and character set conversions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from exactly_once_provider.full_load.columns import Column, arrow_type
from exactly_once_provider.source import ddl

DDL_OP = "ddl"  # the "op" of a schema record in a table's topic
_INTS = ("tinyint", "smallint", "mediumint", "int", "bigint")
_TEXTS = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext")
_TEXT_BYTES = {"tinytext": 255, "text": 65535, "mediumtext": 16777215, "longtext": 4294967295}
# Clauses that change no row of the table (the rows and their values stay as they are).
_IGNORED = re.compile(
    r"^(ADD\s+(CONSTRAINT\s+\S+\s+)?(UNIQUE|INDEX|KEY|FULLTEXT|SPATIAL|FOREIGN|CHECK)\b|"
    r"DROP\s+(INDEX|KEY|FOREIGN\s+KEY|CONSTRAINT|CHECK)\b|RENAME\s+(INDEX|KEY)\b|"
    r"ALTER\s+(COLUMN\s+)?\S+\s+(SET\s+DEFAULT|DROP\s+DEFAULT|SET\s+(IN)?VISIBLE)\b|ALTER\s+INDEX\b|"
    r"ALGORITHM\b|LOCK\b|FORCE\b|COMMENT\b|ENGINE\b|AUTO_INCREMENT\b|ROW_FORMAT\b|KEY_BLOCK_SIZE\b|"
    r"(DEFAULT\s+)?(CHARACTER\s+SET|CHARSET|COLLATE)\b|ENABLE\s+KEYS|DISABLE\s+KEYS|ORDER\s+BY\b|"
    r"STATS_\w+\b|PAGE_COMPRESSED\b|PAGE_COMPRESSION_LEVEL\b|TRANSACTIONAL\b|CHECKSUM\b|DELAY_KEY_WRITE\b)",
    re.IGNORECASE,
)


class RefusedSchemaChange(ValueError):
    """An ``ALTER TABLE`` the sink cannot follow from the binlog alone; the table needs a full reload."""


@dataclass(frozen=True)
class Fill:
    """A value every row older than ``version`` takes in ``column``: ``value`` (the column's text, or None), or
    the row's value of column ``source`` at that version (a renamed column)."""

    column: str
    version: int
    value: str | None
    source: str | None = None


@dataclass(frozen=True)
class SchemaRecord:
    """A schema record of the table's topic: an ``ALTER TABLE`` and where the binlog holds it."""

    query: str
    version: int
    position: str  # "binlog.000003:4711" (the end of the statement's event)

    @classmethod
    def from_json(cls, record: dict) -> SchemaRecord:
        source = record["source"]
        return cls(record["ddl"], int(record["version"]), f"{source['file']}:{source['pos']}")


def refusal(record: SchemaRecord, table: str, why: str) -> RefusedSchemaChange:
    """Return the error that stops ``table`` at ``record``."""
    return RefusedSchemaChange(
        f"{record.query[:300]!r} at {record.position} on {table} cannot be followed by the current table: {why}. "
        "The batches before the one holding it are committed; nothing from that batch on is. Run a full reload "
        "of the table (trigger the DAG with full_reload=true): its snapshot is taken after the statement, so the "
        "stream continues past it."
    )


_IDENT = f"({ddl.IDENT})"  # one identifier, captured
_TYPE = re.compile(
    r"^([A-Za-z]+)\s*(\(((?:[^()'\"]|'(?:[^'\\]|\\.|'')*')*)\))?\s*((?:UNSIGNED|SIGNED|ZEROFILL|"
    r"\s)*)(.*)$",
    re.IGNORECASE | re.DOTALL,
)
_STRING = re.compile(r"^'((?:[^'\\]|\\.|'')*)'", re.DOTALL)
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?(?=\s|$)", re.IGNORECASE)


def _unescape(text: str) -> str:
    return re.sub(
        r"\\(.)",
        lambda m: {"n": "\n", "t": "\t", "0": "\0", "r": "\r"}.get(m.group(1), m.group(1)),
        text.replace("''", "'"),
    )


@dataclass(frozen=True)
class _Definition:
    column: Column
    nullable: bool
    default: str | None  # the literal's text; None: no DEFAULT clause (or DEFAULT NULL, see has_default)
    has_default: bool
    after: str  # what follows the type and attributes the caller must not ignore ("" when none)


def _definition(name: str, text: str, why: Callable[[str], RefusedSchemaChange]) -> _Definition:
    """Parse ``type [attributes]`` of a column definition; refuse what the binlog cannot give old rows."""
    found = _TYPE.match(text.strip())
    if not found:
        raise why(f"the column definition {text[:80]!r} is not understood")
    data_type, args, flags, rest = found.group(1).lower(), found.group(3), found.group(4) or "", found.group(5)
    data_type = {
        "integer": "int",
        "dec": "decimal",
        "numeric": "decimal",
        "fixed": "decimal",
        "bool": "tinyint",
        "boolean": "tinyint",
        "real": "double",
    }.get(data_type, data_type)
    column_type = data_type + (f"({args})" if args else "") + (" unsigned" if "unsigned" in flags.lower() else "")
    precision = scale = None
    if data_type == "decimal":
        numbers = [int(n) for n in (args or "10,0").split(",")]
        precision, scale = numbers[0], numbers[1] if len(numbers) > 1 else 0
    column = Column(name, data_type, column_type, precision, scale)
    try:
        arrow_type(column)
    except ValueError as err:
        raise why(str(err)) from None
    nullable, default, has_default = True, None, False
    rest = rest.strip()
    while rest:
        upper = rest.upper()
        if upper.startswith("NOT NULL"):
            nullable, rest = False, rest[8:].strip()
        elif upper.startswith("NULL"):
            rest = rest[4:].strip()
        elif upper.startswith("DEFAULT"):
            rest = rest[7:].strip()
            has_default = True
            string, number = _STRING.match(rest), _NUMBER.match(rest)
            if string:
                default, rest = _unescape(string.group(1)), rest[string.end() :].strip()
            elif number:
                default, rest = number.group(0), rest[number.end() :].strip()
            elif rest.upper().startswith("NULL"):
                rest = rest[4:].strip()
            elif rest.upper().startswith(("TRUE", "FALSE")):
                default = "1" if rest.upper().startswith("TRUE") else "0"
                rest = rest[4 if default == "1" else 5 :].strip()
            else:
                raise why(
                    f"column {name!r} has DEFAULT {rest.split()[0][:40]}, an expression: the rows that "
                    "existed before the statement got its value at the statement's time, which the binlog "
                    "does not hold"
                )
        elif re.match(r"(CHARACTER\s+SET|CHARSET|COLLATE)\s+\S+", rest, re.IGNORECASE):
            rest = re.sub(r"^(CHARACTER\s+SET|CHARSET|COLLATE)\s+\S+", "", rest, flags=re.IGNORECASE).strip()
        elif re.match(r"COMMENT\s+'", rest, re.IGNORECASE):
            rest = rest[rest.index("'") :]
            rest = rest[_STRING.match(rest).end() :].strip()
        elif re.match(r"ON\s+UPDATE\s+\w+(\(\d*\))?", rest, re.IGNORECASE):  # only later updates: row events
            rest = re.sub(r"^ON\s+UPDATE\s+\w+(\(\d*\))?", "", rest, flags=re.IGNORECASE).strip()
        elif re.match(r"(INVISIBLE|COLUMN_FORMAT\s+\w+|STORAGE\s+\w+)\b", rest, re.IGNORECASE):
            rest = re.sub(r"^(INVISIBLE|COLUMN_FORMAT\s+\w+|STORAGE\s+\w+)", "", rest, flags=re.IGNORECASE).strip()
        else:
            break
    return _Definition(column, nullable, default, has_default, rest)


def _position_only(rest: str, name: str, why: Callable[[str], RefusedSchemaChange]) -> None:
    """Accept ``FIRST`` / ``AFTER col`` (the sink keeps columns by name); refuse any other attribute left."""
    if not rest or re.fullmatch(rf"(FIRST|AFTER\s+{_IDENT})", rest.strip(), re.IGNORECASE):
        return
    upper = rest.upper()
    if upper.startswith(("AUTO_INCREMENT", "SERIAL")):
        raise why(f"column {name!r} is AUTO_INCREMENT: the rows that existed got numbers the binlog does not hold")
    if upper.startswith(("GENERATED", "AS ", "AS(")):
        raise why(f"column {name!r} is generated: its values come from an expression, not from row events")
    if upper.startswith(("PRIMARY", "UNIQUE", "REFERENCES", "CHECK")):
        raise why(f"column {name!r} comes with {rest.split()[0]}: a key or constraint change")
    raise why(f"the clause {rest[:60]!r} of column {name!r} is not understood")


def _old_rows_value(definition: _Definition, why: Callable[[str], RefusedSchemaChange]) -> str | None:
    """Return the text of the value the server gave the rows that existed when the column was added."""
    column = definition.column
    t = column.data_type
    if not definition.has_default or definition.default is None:
        if definition.nullable:
            return None
        if t in _INTS or t in ("decimal", "float", "double", "year"):
            return "0"
        if t in _TEXTS or t == "json":
            return ""
        if t == "enum":  # the first member
            first = _STRING.match(column.column_type[5:])
            return _unescape(first.group(1)) if first else None
        raise why(
            f"column {column.name!r} ({column.column_type}) is NOT NULL without a DEFAULT: the implicit "
            "value the server gave the existing rows is not one the sink can follow"
        )
    value = definition.default
    if t in ("timestamp", "time", "set", "bit") or t in ("binary", "varbinary") or "blob" in t:
        # TIMESTAMP literals are read in the DDL session's time zone, which the binlog does not say; the
        # others have server-side normal forms the sink does not reproduce.
        raise why(f"column {column.name!r} ({column.column_type}) has a DEFAULT the sink cannot type exactly")
    if t == "char":
        value = value.rstrip(" ")  # CHAR reads without its trailing spaces
    return value


# The values each integer type holds: (signed range, unsigned range) by width in bytes.
_INT_BYTES = {"tinyint": 1, "smallint": 2, "mediumint": 3, "int": 4, "bigint": 8}


def _int_range(column: Column) -> tuple[int, int]:
    bits = 8 * _INT_BYTES[column.data_type]
    return (0, 2**bits - 1) if column.unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def _decimal(column: Column) -> tuple[int, int]:
    return column.precision or 10, column.scale or 0


def _loaded(column: Column) -> str:
    """The loaded (Spark/Arrow) type of ``column``, for the messages."""
    return str(arrow_type(column)).replace("decimal128", "decimal").replace("int32", "int").replace("int64", "bigint")


def type_change(old: Column, new: Column) -> str | None:
    """Return why the current table cannot follow column ``old`` becoming ``new`` in place, or None if it can.

    Followed: every value of ``old`` is a value of ``new`` (a widening, or the same type) and the loaded type
    stays or widens the way the sinks widen a column in place (docs/schema-changes.md): an integer to a wider
    integer (signed or unsigned, when the whole old range fits: ``INT`` -> ``BIGINT``, ``INT UNSIGNED`` ->
    ``BIGINT UNSIGNED``, ``TINYINT UNSIGNED`` -> ``SMALLINT``) or to a ``DECIMAL`` with as many integer digits,
    a ``DECIMAL`` to one with no fewer integer digits and no fewer decimals (up to 38 digits: wider ones are
    loaded as text), ``FLOAT`` -> ``DOUBLE``, a longer text type.

    :param old: the column the current table holds.
    :param new: the column after the statement.
    """
    what = f"column {old.name!r} from {old.column_type} to {new.column_type}"
    o, n = old.data_type, new.data_type
    if o in _INT_BYTES and n in _INT_BYTES:
        (old_low, old_high), (new_low, new_high) = _int_range(old), _int_range(new)
        if new_low <= old_low and old_high <= new_high:
            return None
        return (
            f"it narrows {what}: values in [{old_low}, {old_high}] do not all fit in [{new_low}, {new_high}], "
            "and the server truncates or rejects them without a row event (a type holding every old value "
            "is followed in place)"
        )
    if o in _INT_BYTES and n == "decimal":
        precision, scale = _decimal(new)
        low, high = _int_range(old)
        if precision <= 38 and precision - scale >= len(str(max(-low, high))):
            return None
    if o == "decimal" and n == "decimal":
        (p, s), (p2, s2) = _decimal(old), _decimal(new)
        if s2 < s or p2 - s2 < p - s:
            return (
                f"it narrows {what}: fewer {'decimals' if s2 < s else 'integer digits'}, so old values are "
                "rounded or rejected by the server without a row event"
            )
        if p <= 38 < p2:
            return (
                f"it changes {what}: a DECIMAL of more than 38 digits is loaded as text, a type change the "
                f"current table's format cannot hold in place (decimal({p},{s}) -> string)"
            )
        return None
    if o == "float" and n == "double":
        return None
    if o == "double" and n == "float":
        return f"it narrows {what}: DOUBLE values lose precision in FLOAT without a row event"
    if o in _TEXTS and n in _TEXTS:
        # To CHAR from another type would strip trailing spaces from the values read.
        if _length(new) >= _length(old) and (n != "char" or o == "char"):
            return None
        return f"it narrows {what}: longer values are truncated by the server without a row event"
    if arrow_type(old) == arrow_type(new) and old.column_type.lower() == new.column_type.lower():
        return None
    return (
        f"it changes {what}, a type change ({_loaded(old)} -> {_loaded(new)}) that is no widening the "
        "current table's format holds in place"
    )


def _length(column: Column) -> int:
    if column.data_type in _TEXT_BYTES:
        return _TEXT_BYTES[column.data_type]
    found = re.search(r"\((\d+)\)", column.column_type)
    return int(found.group(1)) if found else 1


def evolve(
    columns: list[Column], key: tuple[str, ...], record: SchemaRecord, table: str
) -> tuple[list[Column], list[Fill]]:
    """Return the sink's columns after ``record``'s statement and the fills of the rows older than it.

    :param columns: the columns the sink holds (the full load's, evolved by earlier statements).
    :param key: the table's primary key columns.
    :param record: the schema record.
    :param table: ``schema.table``, for the messages.
    :raises RefusedSchemaChange: when the statement cannot be followed (the message says what to do).
    """

    def why(reason: str) -> RefusedSchemaChange:
        return refusal(record, table, reason)

    statement = ddl.parse(record.query)
    if statement is None or statement.verb != "ALTER":
        raise why("it is not an ALTER TABLE statement the sink understands")
    by_name = {c.name.lower(): c for c in columns}
    order = [c.name for c in columns]
    fills: list[Fill] = []

    def rename(old: Column, new: Column) -> None:
        # The new name is a new column holding the old one's values; the old one reads NULL from here on, like
        # a dropped column (Delta renames only with column mapping, which older readers cannot read).
        if old.name in key:
            raise why(f"it renames key column {old.name!r}")
        if new.name.lower() in by_name:
            raise why(f"column {new.name!r} is already in the current table (a dropped or renamed column stays in it)")
        by_name[new.name.lower()] = new
        order.append(new.name)
        fills.extend([Fill(new.name, record.version, None, old.name), Fill(old.name, record.version, None)])

    for clause in statement.clauses:
        if re.match(
            r"^(ADD|DROP|MODIFY|CHANGE|ALTER|RENAME)\s+PRIMARY\b|^(ADD|DROP)\s+(CONSTRAINT\s+\S+\s+)?"
            r"PRIMARY\s+KEY\b",
            clause,
            re.IGNORECASE,
        ):
            raise why("it changes the primary key, which identifies the rows of the current table")
        if re.match(
            r"^(PARTITION|ADD\s+PARTITION|DROP\s+PARTITION|TRUNCATE\s+PARTITION|REORGANIZE|EXCHANGE|"
            r"COALESCE|REBUILD|REMOVE\s+PARTITIONING|ANALYZE\s+PARTITION|CONVERT\s+(PARTITION|TABLE))",
            clause,
            re.IGNORECASE,
        ):
            raise why("a partition clause can remove or move rows without row events")
        if re.match(r"^CONVERT\s+TO\b", clause, re.IGNORECASE):
            raise why("CONVERT TO CHARACTER SET rewrites every text value without row events")
        if _IGNORED.match(clause):
            continue
        found = re.match(
            rf"^ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?{_IDENT}\s+(.*)$", clause, re.IGNORECASE | re.DOTALL
        )
        if found and not found.group(2).lstrip().startswith("("):
            name = ddl.unquote(found.group(1))
            if name.lower() in by_name:
                raise why(f"column {name!r} is already in the table")
            definition = _definition(name, found.group(2), why)
            _position_only(definition.after, name, why)
            by_name[name.lower()] = definition.column
            order.append(name)
            value = _old_rows_value(definition, why)
            if value is not None:
                fills.append(Fill(name, record.version, value))
            continue
        found = re.match(
            rf"^(MODIFY|CHANGE)\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?{_IDENT}\s+(.*)$", clause, re.IGNORECASE | re.DOTALL
        )
        if found:
            old_name, rest = ddl.unquote(found.group(2)), found.group(3)
            new_name = old_name
            if found.group(1).upper() == "CHANGE":
                renamed = re.match(rf"^{_IDENT}\s+(.*)$", rest, re.DOTALL)
                if not renamed:
                    raise why(f"the clause {clause[:80]!r} is not understood")
                new_name, rest = ddl.unquote(renamed.group(1)), renamed.group(2)
            old = by_name.get(old_name.lower())
            if old is None:
                raise why(f"column {old_name!r} is not a column the sink holds")
            definition = _definition(new_name if new_name.lower() != old_name.lower() else old.name, rest, why)
            _position_only(definition.after, old_name, why)
            problem = type_change(old, definition.column)
            if problem and old.name in key:
                raise why(f"it changes the type of key column {old.name!r} and {problem.removeprefix('it ')}")
            if problem:
                raise why(problem)
            converted = old.data_type == "float" and definition.column.data_type == "double"
            if new_name.lower() != old_name.lower():
                if converted:
                    raise why(
                        f"it renames column {old.name!r} and widens it from FLOAT to DOUBLE in one clause; "
                        "run them as two statements (MODIFY, then RENAME COLUMN), each of which is followed"
                    )
                rename(old, definition.column)
            else:
                by_name[old.name.lower()] = definition.column
            if converted:
                # The server converts each stored FLOAT to the DOUBLE of its 32 bits, without row events; the
                # change records before the statement carry the FLOAT as its shortest decimal ("0.1"), which a
                # DOUBLE reads as another number (0.1, not 0.10000000149011612). A fill of the column from
                # itself tells the sinks which changes to convert as the server did
                # (exactly_once_provider.sinks.current_table.as_converted).
                fills.append(Fill(old.name, record.version, None, old.name))
            continue
        found = re.match(
            rf"^DROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?{_IDENT}\s*(RESTRICT|CASCADE)?$", clause, re.IGNORECASE
        )
        if found:
            name = ddl.unquote(found.group(1))
            old = by_name.get(name.lower())
            if old is None:
                raise why(f"column {name!r} is not a column the sink holds")
            if old.name in key:
                raise why(f"it drops key column {old.name!r}")
            fills.append(Fill(old.name, record.version, None))
            continue
        found = re.match(rf"^RENAME\s+COLUMN\s+{_IDENT}\s+TO\s+{_IDENT}$", clause, re.IGNORECASE)
        if found:
            old = by_name.get(ddl.unquote(found.group(1)).lower())
            if old is None:
                raise why(f"column {ddl.unquote(found.group(1))!r} is not a column the sink holds")
            rename(old, replace(old, name=ddl.unquote(found.group(2))))
            continue
        raise why(f"the clause {clause[:80]!r} is not one the sink follows")
    return [by_name[n.lower()] for n in order], fills
