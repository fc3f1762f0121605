"""The reference cache prunes the folders of old fingerprints on write: the newest few stay, the current one
always, and a removal that fails or races with another grader never fails a check."""
from __future__ import annotations

import os

import pytest

from minivllm.labs import refcache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache dir of our own (MINIVLLM_CACHE_DIR, read through minivllm/envs.py), and a way to switch fingerprint."""
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))

    def use(fingerprint: str):
        monkeypatch.setattr(refcache, "_FINGERPRINT", fingerprint)
        return refcache.folder()
    return use


def _old(root, name: str, age_s: float):
    path = root / name
    path.mkdir(parents=True)
    (path / "lab08-check00.json").write_text('{"check": "x", "obs": {}}')
    stamp = os.stat(root).st_mtime - age_s
    os.utime(path, (stamp, stamp))
    return path


def _names(root):
    return sorted(p.name for p in root.iterdir())


def test_a_write_keeps_the_newest_folders_and_removes_the_rest(cache):
    root = cache("current").parent
    for i, name in enumerate(["old1", "old2", "old3", "old4", "old5"]):
        _old(root, name, age_s=100 * (i + 1))  # old1 newest ... old5 oldest
    refcache.store(8, 0, "masks = formula", {"kept": [1]})
    assert _names(root) == ["current", "old1", "old2"]  # KEEP = 3, the current one counted
    assert refcache.load(8, 0, "masks = formula") == {"kept": [1]}


def test_the_current_folder_is_kept_whatever_keep_says(cache):
    root = cache("current").parent
    _old(root, "old1", age_s=10)
    refcache.store(8, 0, "c", {})
    assert refcache.prune(keep=0) == [root / "old1"] and _names(root) == ["current"]


def test_a_folder_in_use_is_kept_before_one_written_later(cache):
    """load touches its folder: a fingerprint still read (e.g. a second checkout) outlives newer unused ones."""
    root = cache("a").parent
    refcache.store(8, 0, "c", {"v": "a"})
    stamp = os.stat(root / "a").st_mtime - 1000
    os.utime(root / "a", (stamp, stamp))
    _old(root, "b", age_s=500)
    _old(root, "c", age_s=400)
    assert refcache.load(8, 0, "c") == {"v": "a"}  # a is used now
    cache("d")
    refcache.store(8, 0, "c", {"v": "d"})
    assert _names(root) == ["a", "c", "d"]


def test_a_failed_removal_does_not_fail_the_write(cache, monkeypatch):
    root = cache("current").parent
    for name in ("old1", "old2", "old3"):
        _old(root, name, age_s=100)

    def refuse(src, dst):
        raise PermissionError(13, "read-only", str(src))
    monkeypatch.setattr(refcache.os, "rename", refuse)
    refcache.store(8, 0, "c", {"v": 1})
    assert refcache.load(8, 0, "c") == {"v": 1}
    assert _names(root) == ["current", "old1", "old2", "old3"]  # left for the next write


def test_a_folder_another_grader_removed_first_is_skipped(cache, monkeypatch):
    """Two graders prune at once: the one that loses the rename skips the folder; a reader of a pruned folder
    finds nothing and recomputes."""
    root = cache("current").parent
    for i, name in enumerate(["old1", "old2", "old3", "old4"]):
        _old(root, name, age_s=100 * (i + 1))
    real_rename = os.rename

    def raced(src, dst):
        real_rename(src, str(dst) + "-other")  # the other grader renamed it just before us
        return real_rename(src, dst)
    monkeypatch.setattr(refcache.os, "rename", raced)
    refcache.store(8, 0, "c", {"v": 1})  # both renames lose the race: no exception
    monkeypatch.setattr(refcache.os, "rename", real_rename)
    assert refcache.load(8, 0, "c") == {"v": 1}
    assert [n for n in _names(root) if not n.startswith(".")] == ["current", "old1", "old2"]
    cache("old4")  # a grader still on old4's fingerprint: its file is gone, it recomputes
    assert refcache.load(8, 0, "x") is None
    cache("current")
    refcache.store(8, 1, "c", {})  # the next write finishes the other grader's half-done removal
    assert _names(root) == ["current", "old1", "old2"]


def test_leftovers_of_a_stopped_prune_go_and_other_entries_stay(cache):
    root = cache("current").parent
    _old(root, ".old-gone-123", age_s=5)
    (root / ".tmp-notes").write_text("not a folder")
    refcache.store(8, 0, "c", {})
    assert _names(root) == [".tmp-notes", "current"]


def test_an_unwritable_cache_neither_writes_nor_prunes(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache dir should be")
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(blocker))
    monkeypatch.setattr(refcache, "_FINGERPRINT", "current")
    refcache.store(8, 0, "c", {})  # no exception
    assert refcache.load(8, 0, "c") is None and refcache.prune() == []
