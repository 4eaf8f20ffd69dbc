"""The one reader of MySQL/MariaDB DDL text: which statement, which tables, which ``ALTER TABLE`` clauses.

Two readers use it: the binlog capture, to classify a statement on a captured table
(:func:`exactly_once_provider.source.binlog.ddl_tables`, :func:`~exactly_once_provider.source.binlog.removes_tables`),
and the typed sinks, to follow an ``ALTER TABLE`` clause by clause
(:func:`exactly_once_provider.spark_jobs.schema_change.evolve`). Pure Python, no Airflow: the Spark driver imports
it.

Why not sqlglot (docs/pitfalls.md, ``tests/unit/provider/source/test_ddl.py``): its MySQL dialect falls back to an
opaque ``Command`` for statements MariaDB writes to the binlog (``ALTER ONLINE TABLE``, ``ALTER IGNORE TABLE``,
``WAIT n``, ``RENAME TABLE a TO b, c TO d``, ``ADD COLUMN (a INT, b INT)``, ``CONVERT TO CHARACTER SET``), fails on
partition clauses and reads ``TIMESTAMP`` as ``TIMESTAMPTZ``: the capture must still name the tables of every one
of them, and the sink refuse or follow each clause knowing its exact MySQL type.

What is read here:

* comments anywhere outside quotes (``/* */``, ``-- ``, ``#``); the text of an executable comment
  (``/*!50100 ... */``, ``/*M!100100 ... */``) is kept, as the server runs it;
* identifiers quoted with backticks (a doubled backtick is one backtick: a hostile name stays one name) or
  unquoted (letters, digits, ``_``, ``$`` and the non-ASCII characters MySQL allows);
* the statements that change a table's rows or shape: ``ALTER [ONLINE] [IGNORE] TABLE [IF EXISTS] t [WAIT n |
  NOWAIT] clause, ...``, ``DROP [TEMPORARY] TABLE [IF EXISTS] a, b``, ``TRUNCATE [TABLE] t``,
  ``RENAME TABLE a TO b, ...``, ``CREATE [OR REPLACE] TABLE [IF NOT EXISTS] t ...``;
* an ``ALTER TABLE``'s clauses, split at the commas outside quotes and parentheses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# One identifier: backtick-quoted (`` `` `` inside is one backtick) or unquoted (MySQL allows U+0080 .. U+FFFF).
IDENT = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$\u0080-\uffff]+)"
QUALIFIED = re.compile(rf"({IDENT})(?:\s*\.\s*({IDENT}))?")
_HEAD = re.compile(
    r"^(ALTER\s+(?:ONLINE\s+|IGNORE\s+)*TABLE|DROP\s+(?:TEMPORARY\s+)?TABLE|TRUNCATE(?:\s+TABLE)?|RENAME\s+TABLE|"
    r"CREATE\s+(?:OR\s+REPLACE\s+)?TABLE)\s+(.*)$",
    re.IGNORECASE | re.DOTALL,
)
_IF_EXISTS = re.compile(r"^IF\s+(?:NOT\s+)?EXISTS\s+", re.IGNORECASE)
_WAIT = re.compile(r"^(?:WAIT\s+\d+(?:\.\d*)?|NOWAIT)(?:\s+|$)", re.IGNORECASE)
_TABLE_RENAME = re.compile(r"^RENAME\s+(?!(?:COLUMN|INDEX|KEY)\s)", re.IGNORECASE)
_EXECUTABLE = re.compile(r"^/\*M?!\d*")


@dataclass(frozen=True)
class Statement:
    """A table DDL statement.

    :param verb: ``ALTER``, ``DROP``, ``TRUNCATE``, ``RENAME`` or ``CREATE``.
    :param tables: the ``(schema, table)`` names it touches, in the order written (a RENAME: old, new, ...).
    :param clauses: an ``ALTER TABLE``'s clauses (comments removed, each stripped); empty for the other verbs.
    """

    verb: str
    tables: tuple[tuple[str, str], ...]
    clauses: tuple[str, ...] = ()

    @property
    def renames_table(self) -> bool:
        """Whether an ``ALTER TABLE`` moves the table (``RENAME [TO|AS] t``; not RENAME COLUMN / INDEX / KEY)."""
        return self.verb == "ALTER" and any(_TABLE_RENAME.match(c) for c in self.clauses)

    @property
    def removes_tables(self) -> bool:
        """Whether the statement removes or moves its tables: their rows end there (DROP, RENAME, ALTER ... RENAME)."""
        return self.verb in ("DROP", "RENAME") or self.renames_table


def unquote(token: str) -> str:
    """Return the name an identifier token stands for (a quoted one without its backticks, ``````→ `````).

    :param token: an identifier as written.
    """
    return token[1:-1].replace("``", "`") if token.startswith("`") else token


def strip_comments(text: str) -> str:
    """Return ``text`` without its comments (each becomes one space); an executable comment keeps its text.

    Quotes (``'``, ``"``, backticks) are skipped whole: a comment marker inside a string or a name is text.

    :param text: SQL text.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"`":
            end = _quote_end(text, i)
            out.append(text[i:end])
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            executable = _EXECUTABLE.match(text[i:end])
            out.append(f" {strip_comments(text[i + executable.end() : end - 2])} " if executable else " ")
            i = end
        elif text.startswith("#", i) or (text.startswith("--", i) and (i + 2 == n or text[i + 2] in " \t\r\n")):
            end = text.find("\n", i)
            i = n if end < 0 else end
            out.append(" ")
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _quote_end(text: str, start: int) -> int:
    """Return the index after the quoted token starting at ``start`` (its end of text if unterminated)."""
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":  # a backslash escapes in strings, never in a quoted name
            i += 2
        elif text[i] == quote:
            if text[i + 1 : i + 2] == quote:  # a doubled quote is one quote character
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return len(text)


def split(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside quotes and parentheses; return the stripped, non-empty parts.

    :param text: SQL text without comments.
    :param sep: one character.
    """
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch in "'\"`":
            i = _quote_end(text, i)
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _name(text: str, default_schema: str) -> tuple[tuple[str, str] | None, str]:
    """Return the (schema, table) name at the start of ``text`` and the text after it."""
    found = QUALIFIED.match(text)
    if not found:
        return None, text
    first, second = found.group(1), found.group(2)
    name = (unquote(first), unquote(second)) if second else (default_schema, unquote(first))
    return name, text[found.end() :].strip()


def parse(query: str, default_schema: str = "") -> Statement | None:
    """Return the table DDL statement ``query`` is, or None when it is none (DML, GRANT, CREATE INDEX...).

    :param query: the statement text (e.g. from the binlog).
    :param default_schema: the session's current database, for unqualified names (the query event's schema).
    """
    head = _HEAD.match(strip_comments(query).strip())
    if not head:
        return None
    verb = head.group(1).split()[0].upper()
    rest = _IF_EXISTS.sub("", head.group(2).strip(), count=1)
    tables: list[tuple[str, str]] = []
    if verb in ("DROP", "RENAME"):
        for part in split(rest):
            for token in re.split(r"\s+TO\s+", part, flags=re.IGNORECASE) if verb == "RENAME" else [part]:
                name, _ = _name(token.strip(), default_schema)
                if name is not None:
                    tables.append(name)
        return Statement(verb, tuple(tables))
    name, rest = _name(rest, default_schema)
    if name is None:
        return None
    if verb != "ALTER":
        return Statement(verb, (name,))
    rest = _WAIT.sub("", rest, count=1)
    return Statement(verb, (name,), tuple(split(rest)))
