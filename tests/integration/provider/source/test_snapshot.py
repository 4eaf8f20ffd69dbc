"""Chunk membership of string keys under collations, decided by the real server (provider/source/snapshot.py)."""

from __future__ import annotations

import bisect
import random

import pytest

from exactly_once_provider.source.identifiers import sql_literal
from exactly_once_provider.source.snapshot import (
    ServerChunkLocator,
    plan_chunks,
    range_predicate,
    server_ordered_columns,
)
from tests.mysql_support import connect, unique_name

# Case, accents, punctuation, digits, CJK and a trailing space: code point order and collation order disagree.
ALPHABET = ["a", "A", "b", "B", "z", "Z", "é", "Ö", "ß", "_", "-", " ", "0", "9", "中", "~", "Ω"]


def _chunk_rows(cur, table: str, chunk) -> tuple:
    """Return the rows of ``chunk`` (key ``(k, n)``), checking the inlined bounds select exactly the same rows."""
    where, params = range_predicate(("k", "n"), chunk)
    cur.execute(f"SELECT k, n FROM `{table}` WHERE {where} ORDER BY k, n", params)
    selected = cur.fetchall()
    inlined, no_params = range_predicate(("k", "n"), chunk, literal=sql_literal)  # the native reader's form
    cur.execute(f"SELECT k, n FROM `{table}` WHERE {inlined} ORDER BY k, n")
    assert no_params == [] and cur.fetchall() == selected, (chunk, inlined)
    return selected


@pytest.mark.parametrize("collation", ["utf8mb4_unicode_ci", "utf8mb4_general_ci", "utf8mb4_bin"])
def test_locator_places_every_key_in_the_chunk_whose_predicate_selects_it(stack, collation):
    table = unique_name("loc")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE `{table}` (k VARCHAR(12) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL, "
        "n INT NOT NULL, PRIMARY KEY (k, n))"
    )
    rng = random.Random(7)
    candidates = {
        ("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 4))).lstrip() or "x", rng.randint(0, 2))
        for _ in range(600)
    }
    cur.executemany(f"INSERT IGNORE INTO `{table}` VALUES (%s, %s)", sorted(candidates))
    try:
        chunks = plan_chunks(cur, stack.DB_NAME, table, ("k", "n"), 23)
        expected = {}
        for chunk in chunks:
            for row in _chunk_rows(cur, table, chunk):
                assert row not in expected, f"{row} selected by chunks {expected[row]} and {chunk.index}"
                expected[row] = chunk.index
        cur.execute(f"SELECT COUNT(*) FROM `{table}`")
        assert len(expected) == cur.fetchone()[0] > 300 and len(chunks) > 10

        collations = server_ordered_columns(cur, stack.DB_NAME, table, ("k", "n"))
        assert collations == {"k": ("utf8mb4", collation)}  # even _bin is PAD SPACE here: the server decides
        uppers = [c.upper for c in chunks[:-1]]
        locate = ServerChunkLocator(lambda: connect(stack), ("k", "n"), collations, uppers)
        try:
            located = {row: locate(row) for row in expected}
        finally:
            locate.close()
        assert located == expected
        by_code_point = {row: bisect.bisect_left(uppers, row) for row in expected}
        if collation.endswith("_ci"):
            assert by_code_point != expected, "the data must contain keys Python orders differently"
    finally:
        cur.execute(f"DROP TABLE `{table}`")
        conn.close()


def test_numeric_and_nopad_bin_keys_are_ordered_in_python(stack):
    table = unique_name("loc_num")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE `{table}` (id BIGINT NOT NULL, code VARCHAR(8) COLLATE utf8mb4_nopad_bin NOT NULL, "
        "label VARCHAR(8) COLLATE utf8mb4_unicode_ci, PRIMARY KEY (id, code))"
    )
    try:
        assert server_ordered_columns(cur, stack.DB_NAME, table, ("id", "code")) == {}
        assert server_ordered_columns(cur, stack.DB_NAME, table, ("label",)) == {
            "label": ("utf8mb4", "utf8mb4_unicode_ci")
        }
    finally:
        cur.execute(f"DROP TABLE `{table}`")
        conn.close()


KEY_TYPES = {
    "latin1 text": (
        "VARCHAR(8) CHARACTER SET latin1 COLLATE latin1_swedish_ci",
        ["a", "B", "é", "Ö", "z ", "'", "\\", "%s"],
    ),
    "binary": ("VARBINARY(4)", [b"", b"\x00", b"\x00\x01", b"'", b"\\", b"\xff", b"a", b"\x7f\x80"]),
    "datetime(6)": (
        "DATETIME(6)",
        ["1000-01-01 00:00:00", "2024-02-29 12:00:00.000001", "2024-02-29 12:00:00.5", "9999-12-31 23:59:59.999999"],
    ),
    "date": ("DATE", ["1000-01-01", "2024-02-29", "9999-12-31"]),
    "time(6)": ("TIME(6)", ["-838:59:59", "-00:00:00.000001", "00:00:00", "12:00:00.5", "838:59:59"]),
    "decimal": ("DECIMAL(30,10)", ["-99999999999999999999.9999999999", "-0.0000000001", "0", "0.5", "12345.678"]),
    "bigint unsigned": ("BIGINT UNSIGNED", [0, 1, 2**63, 2**64 - 1]),
    "double": ("DOUBLE", [-1.5e300, -0.1, 0.0, 1e-05, 0.30000000000000004]),
}


@pytest.mark.parametrize("kind", sorted(KEY_TYPES))
def test_inlined_chunk_bounds_select_exactly_what_bound_parameters_select(stack, kind):
    column_type, values = KEY_TYPES[kind]
    table = unique_name("inline")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (k {column_type} NOT NULL, n INT NOT NULL, PRIMARY KEY (k, n))")
    cur.executemany(f"INSERT IGNORE INTO `{table}` VALUES (%s, %s)", [(v, n) for v in values for n in range(3)])
    try:
        chunks = plan_chunks(cur, stack.DB_NAME, table, ("k", "n"), 2)
        cur.execute(f"SELECT COUNT(*) FROM `{table}`")
        total, seen = cur.fetchone()[0], 0
        assert len(chunks) >= total // 2
        for chunk in chunks:
            seen += len(_chunk_rows(cur, table, chunk))
        assert seen == total
    finally:
        cur.execute(f"DROP TABLE `{table}`")
        conn.close()
