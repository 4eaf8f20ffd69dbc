"""The durable local write primitive every local commit uses."""

from __future__ import annotations

from exactly_once_provider.storage.durable import put_if_absent, replace


def test_put_if_absent_creates_once_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "log" / "00000000000000000001.json"
    assert put_if_absent(target, b"first")
    assert not put_if_absent(target, b"second")  # the name is taken: nothing written
    assert target.read_bytes() == b"first"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]


def test_replace_swaps_the_whole_file(tmp_path):
    target = tmp_path / "staging" / "manifest.json"
    replace(target, b"v1")
    replace(target, b"v2")
    assert target.read_bytes() == b"v2"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]
