"""A scripted DB-API cursor/connection: answers by statement prefix, records statements, raises on demand."""

from __future__ import annotations


class FakeCursor:
    def __init__(self, answers: dict[str, object]):
        self.answers = answers  # prefix -> rows (list of tuples) or an exception instance to raise
        self.statements: list[str] = []
        self.params: list[object] = []
        self._last: list[tuple] = []

    def execute(self, sql, args=None):
        self.statements.append(sql)
        self.params.append(args)
        answer = next((rows for prefix, rows in self.answers.items() if sql.startswith(prefix)), [])
        if isinstance(answer, BaseException):
            raise answer
        self._last = list(answer)

    def fetchone(self):
        return self._last[0] if self._last else None

    def fetchall(self):
        return self._last


class FakeConnection:
    def __init__(self, cursor: FakeCursor):
        self._cursor = cursor
        self.closed = False
        self.rolled_back = False

    def cursor(self, *args):
        return self._cursor

    def rollback(self):
        self.rolled_back = True

    def close(self):
        self.closed = True
