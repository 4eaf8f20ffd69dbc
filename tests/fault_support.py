"""Shared pieces of the fault scenarios: the oracle's counts and a concurrent source writer.

Every scenario in tests/faults ends with :func:`check`: it counts, by source version, what the sink (or
topic) holds against what it must hold, reports the counts through the ``fault_outcome`` fixture (the
matrix table) and then asserts 0 lost, 0 duplicated and nothing unexpected (e.g. an aborted record).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from tests.mysql_support import connect


@dataclass(frozen=True)
class Outcome:
    """What an oracle counted: rows expected, rows missing, extra copies, rows that must not be there."""

    rows: int
    lost: int
    duplicated: int
    unexpected: int
    example: str = ""


def compare(expected: Iterable[Hashable], got: Iterable[Hashable]) -> Outcome:
    """Compare two multisets of source versions (each expected once) row by row."""
    want, have = Counter(expected), Counter(got)
    missing = want - have
    duplicated = {row: n - want[row] for row, n in have.items() if row in want and n > want[row]}
    unexpected = {row: n for row, n in have.items() if row not in want}
    example = "; ".join(
        part
        for part in (
            f"missing e.g. {sorted(missing, key=repr)[:3]}" if missing else "",
            f"duplicated e.g. {list(duplicated.items())[:3]}" if duplicated else "",
            f"unexpected e.g. {list(unexpected)[:3]}" if unexpected else "",
        )
        if part
    )
    return Outcome(
        sum(want.values()), sum(missing.values()), sum(duplicated.values()), sum(unexpected.values()), example
    )


def check(
    fault_outcome: Callable[..., None],
    expected: Iterable[Hashable],
    got: Iterable[Hashable],
    what: str = "rows",
    duplicated_versions: int = 0,
) -> Outcome:
    """
    Report the comparison to the matrix, then assert exactly once: 0 lost, 0 duplicated, 0 unexpected.

    :param duplicated_versions: copies found before ``got`` was reduced to one row per key (e.g. a source
        version published twice in a topic whose latest version per key is compared with the source).
    """
    outcome = compare(expected, got)
    if duplicated_versions:
        outcome = Outcome(
            outcome.rows,
            outcome.lost,
            outcome.duplicated + duplicated_versions,
            outcome.unexpected,
            f"{outcome.example}; {duplicated_versions} source versions published more than once",
        )
    fault_outcome(rows=outcome.rows, lost=outcome.lost, duplicated=outcome.duplicated)
    assert outcome.rows > 0, f"the oracle expected no {what}: the scenario checked nothing"
    assert (outcome.lost, outcome.duplicated, outcome.unexpected) == (0, 0, 0), (
        f"{what}: {outcome.lost} lost, {outcome.duplicated} duplicated, {outcome.unexpected} unexpected of "
        f"{outcome.rows}: {outcome.example}"
    )
    return outcome


class ConcurrentWriter:
    """
    A writer thread on a MariaDB table ``(id BIGINT PK, v INT, s VARCHAR, ...)`` while a scenario runs.

    Inserts new ids, updates and (unless ``deletes=False``: cursors cannot see them) deletes existing ones, and
    every ``long_every`` operations holds a transaction open for ``long_seconds``, so snapshots and windows meet
    open transactions. ``stop()`` joins the thread and returns the number of committed operations; any error
    of the thread fails the test.
    """

    def __init__(
        self,
        stack,
        table: str,
        first_new_id: int,
        existing: int,
        seed: int = 1,
        pause: float = 0.005,
        long_every: int = 50,
        long_seconds: float = 0.8,
        deletes: bool = True,
    ) -> None:
        self.stack, self.table, self.deletes = stack, table, deletes
        self.next_id, self.existing = first_new_id, existing
        self.rng = random.Random(seed)
        self.pause, self.long_every, self.long_seconds = pause, long_every, long_seconds
        self.ops = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"writer-{table}", daemon=True)

    def start(self) -> ConcurrentWriter:
        self._thread.start()
        return self

    def _one(self, cur) -> None:
        op = self.rng.random()
        if op < 0.5:
            cur.execute(f"INSERT INTO `{self.table}` (id, v, s) VALUES (%s, 0, 'new')", (self.next_id,))
            self.next_id += 1
        elif op < 0.85 or not self.deletes:
            cur.execute(
                f"UPDATE `{self.table}` SET v = v + 1, s = 'upd' WHERE id = %s", (self.rng.randint(1, self.existing),)
            )
        else:
            cur.execute(f"DELETE FROM `{self.table}` WHERE id = %s", (self.rng.randint(1, self.existing),))

    def _run(self) -> None:
        conn = connect(self.stack)
        try:
            cur = conn.cursor()
            while not self._stop.is_set():
                if self.long_every and self.ops % self.long_every == self.long_every - 1:
                    cur.execute("START TRANSACTION")
                    for _ in range(3):
                        self._one(cur)
                    time.sleep(self.long_seconds)
                    cur.execute("COMMIT")
                    self.ops += 3
                else:
                    self._one(cur)
                    self.ops += 1
                time.sleep(self.pause)
        except BaseException as error:  # noqa: BLE001 - surfaced by stop()
            self.error = error
        finally:
            conn.close()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the concurrent writer did not stop"
        if self.error is not None:
            raise AssertionError(f"the concurrent writer failed: {self.error!r}") from self.error
        return self.ops
