"""Chunk membership of string keys under collations, decided by the real server (hooks/mysql_snapshot.py)."""

from __future__ import annotations

import bisect
import random

import pytest

from exactly_once_provider.hooks.mysql_snapshot import (
    ServerChunkLocator,
    plan_chunks,
    range_predicate,
    server_ordered_columns,
)
from tests.mysql_support import connect, unique_name

# Case, accents, punctuation, digits, CJK and a trailing space: code point order and collation order disagree.
ALPHABET = ["a", "A", "b", "B", "z", "Z", "é", "Ö", "ß", "_", "-", " ", "0", "9", "中", "~", "Ω"]


@pytest.mark.parametrize("collation", ["utf8mb4_unicode_ci", "utf8mb4_general_ci", "utf8mb4_bin"])
def test_locator_places_every_key_in_the_chunk_whose_predicate_selects_it(stack, collation):
    table = unique_name("loc")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (k VARCHAR(12) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL, "
                "n INT NOT NULL, PRIMARY KEY (k, n))")
    rng = random.Random(7)
    candidates = {("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 4))).lstrip() or "x", rng.randint(0, 2))
                  for _ in range(600)}
    cur.executemany(f"INSERT IGNORE INTO `{table}` VALUES (%s, %s)", sorted(candidates))
    try:
        chunks = plan_chunks(cur, stack.DB_NAME, table, ("k", "n"), 23)
        expected = {}
        for chunk in chunks:
            where, params = range_predicate(("k", "n"), chunk)
            cur.execute(f"SELECT k, n FROM `{table}` WHERE {where}", params)
            for row in cur.fetchall():
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
    cur.execute(f"CREATE TABLE `{table}` (id BIGINT NOT NULL, code VARCHAR(8) COLLATE utf8mb4_nopad_bin NOT NULL, "
                "label VARCHAR(8) COLLATE utf8mb4_unicode_ci, PRIMARY KEY (id, code))")
    try:
        assert server_ordered_columns(cur, stack.DB_NAME, table, ("id", "code")) == {}
        assert server_ordered_columns(cur, stack.DB_NAME, table, ("label",)) == {
            "label": ("utf8mb4", "utf8mb4_unicode_ci")}
    finally:
        cur.execute(f"DROP TABLE `{table}`")
        conn.close()
