"""The one commit loop (sinks/commit_loop.commit_batch) on a fake table: a list of commits, each ``(app id, version)``,
committed only as the direct successor of the state a plan read."""

from __future__ import annotations

import logging

import pytest

from exactly_once_provider.errors import PipelineError
from exactly_once_provider.sinks import commit_loop


class _Zombie(RuntimeError):
    pass


class _Table:
    """A table whose commits are ``(app id, version)``; ``others`` commit first on the next plans, one each."""

    def __init__(self, commits: list[tuple[str, int]] | None = None, others: int = 0) -> None:
        self.commits = list(commits or [])
        self.others = others
        self.plans: list[int] = []
        self.removed = 0

    def read(self, lost: int | None = None) -> int:
        return len(self.commits)

    def committed(self, app_id: str, version: int):
        def check(state: int):
            held = [v for a, v in self.commits[:state] if a == app_id]
            if held and max(held) >= version:  # Delta's rule: at or below the app's newest is committed
                return self.commits.index((app_id, version if version in held else max(held)))
            if any(a.split(":")[0] == app_id.split(":")[0] and a != app_id for a, _ in self.commits[:state]):
                raise _Zombie(f"another checkpoint of {app_id.split(':')[0]} committed")
            return None

        return check

    def plan_and_commit(self, app_id: str, version: int):
        def attempt(state: int):
            self.plans.append(state)
            if self.others:  # another writer takes state + 1 while this plan writes its files
                self.others -= 1
                self.commits.append(("compaction", len(self.commits)))
            if len(self.commits) != state:
                self.removed += 1  # the loser deletes what it wrote
                return None
            self.commits.append((app_id, version))
            return state

        return attempt

    def commit(self, app_id: str, version: int, attempts: int = commit_loop.ATTEMPTS):
        return commit_loop.commit_batch(
            "lake.t",
            app_id,
            version,
            self.read(),
            self.committed(app_id, version),
            self.plan_and_commit(app_id, version),
            self.read,
            attempts=attempts,
        )


def test_a_batch_commits_once_on_the_state_it_was_planned_on():
    table = _Table()
    assert table.commit("p:c1", 0) == (0, True)
    assert table.commit("p:c1", 1) == (1, True)
    assert table.plans == [0, 1] and table.commits == [("p:c1", 0), ("p:c1", 1)]


def test_a_replay_writes_nothing_and_returns_the_commit_that_holds_it():
    table = _Table([("p:c1", 0), ("p:c1", 1)])
    assert table.commit("p:c1", 0) == (0, False)
    assert table.commit("p:c1", 1) == (1, False)
    assert table.plans == [] and len(table.commits) == 2


def test_a_zombie_of_another_checkpoint_is_refused_before_it_plans():
    table = _Table([("p:c2", 0)])
    with pytest.raises(_Zombie, match="another checkpoint of p"):
        table.commit("p:c1", 5)
    assert table.plans == [] and table.commits == [("p:c2", 0)]


def test_a_lost_race_is_planned_again_on_the_newer_state(caplog):
    table = _Table([("p:c1", 0)], others=2)
    with caplog.at_level(logging.INFO, logger=commit_loop.__name__):
        assert table.commit("p:c1", 1) == (3, True)
    assert table.plans == [1, 2, 3] and table.removed == 2
    assert table.commits[-1] == ("p:c1", 1) and table.commits.count(("p:c1", 1)) == 1
    assert "planned again on the newer state (attempt 3 of 3)" in caplog.text


def test_a_zombie_that_commits_the_batch_first_leaves_it_in_once():
    table = _Table([("p:c1", 0)])
    plan = table.plan_and_commit("p:c1", 1)

    def zombie_first(state: int):
        if not table.plans:
            table.commits.append(("p:c1", 1))  # the zombie: same app id, same version, committed meanwhile
        return plan(state)

    result = commit_loop.commit_batch(
        "lake.t", "p:c1", 1, table.read(), table.committed("p:c1", 1), zombie_first, table.read
    )
    assert result == (1, False) and table.commits == [("p:c1", 0), ("p:c1", 1)]


def test_giving_up_names_the_table_the_batch_and_the_attempts():
    table = _Table([("p:c1", 0)], others=5)
    with pytest.raises(PipelineError, match=r"committed to lake\.t first 3 times in a row while \(p:c1, 1\)"):
        table.commit("p:c1", 1)
    assert table.plans == [1, 2, 3] and ("p:c1", 1) not in table.commits
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        table.commit("p:c1", 1, attempts=0)
