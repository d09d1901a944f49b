"""labctl._cache: recipe keys, atomic cache entries, NCCL version codes and the compiled placeholder library."""

from __future__ import annotations

import ctypes
import os
import shutil

import pytest
from labctl import _cache


@pytest.mark.parametrize(
    ("version", "code"),
    [("2.30.7", 23007), ("2.30.4", 23004), ("2.28.9", 22809), ("2.9.0", 20900), ("2.8.4", 2804), ("2.4.8", 2408)],
)
def test_nccl_version_code_follows_nccls_two_encodings(version, code):
    assert _cache.nccl_version_code(version) == code


@pytest.mark.parametrize("bad", ["2.30", "2.30.7.1", "v2.30.7", "2.x.7"])
def test_nccl_version_code_rejects_malformed_versions(bad):
    with pytest.raises(ValueError):
        _cache.nccl_version_code(bad)


def test_nccl_upstream_version_strips_debian_revision_and_cuda_suffix():
    assert _cache.nccl_upstream_version("2.30.7-1+cuda13.3") == "2.30.7"
    assert _cache.nccl_upstream_version("580.95.05-1") == "580.95.05"


def test_recipe_key_is_stable_and_content_sensitive(tmp_path):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("alpha")
    second.write_text("beta")
    key = _cache.recipe_key([first, second])
    assert key == _cache.recipe_key([second, first])  # order of the list does not matter
    assert len(key) == _cache.KEY_LENGTH
    assert key != _cache.recipe_key([first, second], extra="python 3.12")
    second.write_text("beta2")
    assert key != _cache.recipe_key([first, second])


def test_cached_build_builds_once_and_reuses(tmp_path):
    calls = []

    def build(directory):
        calls.append(directory)
        (directory / "payload").write_text("x")

    entry = _cache.cached_build(tmp_path / "kind", "k1", build)
    again = _cache.cached_build(tmp_path / "kind", "k1", build)
    assert entry == again == tmp_path / "kind" / "k1"
    assert len(calls) == 1
    assert (entry / "payload").read_text() == "x"
    assert _cache.complete_entries(tmp_path / "kind") == [entry]


def test_cached_build_leaves_nothing_behind_when_the_build_fails(tmp_path):
    def broken(directory):
        (directory / "half").write_text("half")
        raise _cache.MirrorBuildError("boom")

    with pytest.raises(_cache.MirrorBuildError, match="boom"):
        _cache.cached_build(tmp_path / "kind", "k1", broken)
    leftovers = [p.name for p in (tmp_path / "kind").iterdir() if p.name != ".lock"]
    assert leftovers == []


def test_cached_build_in_place_rebuilds_an_unfinished_entry(tmp_path):
    entry = tmp_path / "tools" / "k"
    entry.mkdir(parents=True)
    (entry / "stale").write_text("from a killed build")
    _cache.cached_build_in_place(entry, lambda d: (d / "fresh").write_text("ok"))
    assert sorted(p.name for p in entry.iterdir()) == [_cache.COMPLETE_MARKER, "fresh"]


def test_run_reports_the_failing_step_and_its_output():
    with pytest.raises(_cache.MirrorBuildError, match=r"my step failed \(exit 3\):\nsaid this"):
        _cache.run(["sh", "-c", "echo said this; exit 3"], what="my step")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_compiled_placeholder_library_reports_its_version(tmp_path):
    library = _cache.compile_nccl_stub("2.30.7", tmp_path / "libnccl.so.2.30.7")
    nccl = ctypes.CDLL(str(library))
    version = ctypes.c_int(0)
    assert nccl.ncclGetVersion(ctypes.byref(version)) == 0
    assert version.value == 23007
    assert nccl.ncclGetVersion(None) != 0  # NULL is an invalid argument, as in NCCL
    nccl.ncclGetErrorString.restype = ctypes.c_char_p
    assert b"placeholder" in nccl.ncclGetErrorString(3)
    assert b"lab placeholder" in library.read_bytes().lower()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_compiled_placeholder_library_is_reproducible(tmp_path):
    first = _cache.compile_nccl_stub("2.30.5", tmp_path / "a" / "libnccl.so.2")
    second = _cache.compile_nccl_stub("2.30.5", tmp_path / "b" / "libnccl.so.2")
    assert first.read_bytes() == second.read_bytes()


def test_old_entries_are_pruned_to_the_newest_few(tmp_path):
    kind = tmp_path / "kind"
    built = []
    for index in range(_cache.KEEP_ENTRIES + 2):
        entry = _cache.cached_build(kind, f"k{index}", lambda d: None)
        marker = entry / _cache.COMPLETE_MARKER
        os.utime(marker, (1_000_000 + index, 1_000_000 + index))  # completion order, made explicit
        built.append(entry)
    _cache.prune_old_entries(kind)
    assert _cache.complete_entries(kind) == list(reversed(built[-_cache.KEEP_ENTRIES :]))
