"""Reading commit markers from a Delta log written by hand (the real Delta writer is in integration)."""

from __future__ import annotations

import json

from exactly_once_provider import delta_commit


def _commit(log, version, user_metadata=None, txn=None):
    actions = [{"commitInfo": {"operation": "WRITE", **({"userMetadata": user_metadata} if user_metadata else {})}}]
    if txn:
        actions.append({"txn": {"appId": txn[0], "version": txn[1]}})
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def test_newest_matching_marker_and_transaction(tmp_path):
    log = tmp_path / "_delta_log"
    log.mkdir()
    _commit(log, 0, json.dumps({"eo_full_load": {"n": 1}}), ("app", 1))
    _commit(log, 1, json.dumps({"other": 1}), ("app2", 7))
    _commit(log, 2, None)
    assert delta_commit.latest_marker(str(tmp_path), "eo_full_load") == (0, {"eo_full_load": {"n": 1}})
    assert delta_commit.latest_marker(f"file://{tmp_path}", "other") == (1, {"other": 1})
    assert delta_commit.find_commit(str(tmp_path), "app2", 7) == 1
    assert delta_commit.find_commit(str(tmp_path), "app2", 8) is None
    assert delta_commit.latest_marker(str(tmp_path / "missing"), "x") is None
