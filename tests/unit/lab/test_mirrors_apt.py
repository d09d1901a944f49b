"""labctl.mirrors_apt: the placeholder spec, the generated packages and the flat repository's index."""

from __future__ import annotations

import ctypes
import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from labctl import mirrors_apt

HAS_DEB_TOOLS = all(shutil.which(t) for t in ("gcc", "dpkg-deb", "dpkg-scanpackages"))
needs_deb_tools = pytest.mark.skipif(not HAS_DEB_TOOLS, reason="needs gcc, dpkg-deb and dpkg-scanpackages")


@pytest.fixture(scope="module")
def spec() -> list[dict]:
    return mirrors_apt.load_spec()


def versions_of(packages: list[dict], name: str) -> list[str]:
    return [p["version"] for p in packages if p["name"] == name]


def test_spec_models_nvidias_names_and_versions(spec):
    names = {p["name"] for p in spec}
    assert {"cuda-toolkit-13-3", "cuda-cudart-13-3", "libnccl2", "libnccl-dev"} <= names
    assert {"nvidia-driver-580", "nvidia-fabricmanager-580"} <= names
    pinned = "2.30.7-1+cuda13.3"
    assert pinned in versions_of(spec, "libnccl2")
    assert len(versions_of(spec, "libnccl2")) >= 3  # the pin plus one older and one newer for skew/upgrades
    assert versions_of(spec, "libnccl2") == versions_of(spec, "libnccl-dev")
    # Two driver versions, each with a fabric manager of exactly the same version.
    drivers = versions_of(spec, "nvidia-driver-580")
    assert len(drivers) >= 2
    assert drivers == versions_of(spec, "nvidia-fabricmanager-580")


def test_every_placeholder_says_what_it_is(spec):
    for package in spec:
        assert "lab placeholder" in package["description"].lower(), package["name"]


def test_libnccl_dev_depends_on_the_same_libnccl2_version(spec):
    for package in spec:
        if package["name"] == "libnccl-dev":
            assert package["depends"] == [f"libnccl2 (= {package['version']})"]


def test_templates_are_filled_in(spec):
    cudart = next(p for p in spec if p["name"] == "cuda-cudart-13-3")
    version_json = next(f for f in cudart["files"] if f["path"] == "/usr/local/cuda-13.3/version.json")
    parsed = json.loads(version_json["content"])
    assert parsed["cuda"]["version"] == "13.3.0"
    assert parsed["cuda_cudart"]["version"] == cudart["upstream"]
    nccl = next(p for p in spec if p["name"] == "libnccl2" and p["version"] == "2.30.7-1+cuda13.3")
    assert nccl["nccl_library"]["path"] == "/usr/lib/x86_64-linux-gnu/libnccl.so.2.30.7"
    header = next(f for f in spec if f["name"] == "libnccl-dev" and f["version"] == nccl["version"])["files"][0]
    assert "#define NCCL_VERSION_CODE 23007" in header["content"]


def test_spec_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[defaults]\narchitecture="all"\nsection="x"\npriority="optional"\nmaintainer="m"\n'
        '[[package]]\nname="libfoo"\nversions=["1.0-1"]\ndescription="a real library"\n'
    )
    with pytest.raises(mirrors_apt._cache.MirrorBuildError, match="must say it is a lab placeholder"):
        mirrors_apt.load_spec(bad)
    bad.write_text('[[package]]\nname="libfoo-{nope}"\nversions=["1"]\ndescription="lab placeholder"\n')
    with pytest.raises(mirrors_apt._cache.MirrorBuildError, match=r"unknown template name \{nope\}"):
        mirrors_apt.load_spec(bad)


def test_control_text_has_dpkg_fields_and_a_folded_long_description(spec):
    package = next(p for p in spec if p["name"] == "libnccl-dev")
    text = mirrors_apt.control_text(package, 3)
    lines = text.splitlines()
    assert lines[0] == "Package: libnccl-dev"
    assert "Installed-Size: 3" in lines
    assert any(line.startswith("Depends: libnccl2 (= ") for line in lines)
    description_at = next(i for i, line in enumerate(lines) if line.startswith("Description: "))
    assert all(line.startswith(" ") for line in lines[description_at + 1 :])


def test_parse_recursive_depends_keeps_real_packages_only():
    output = "g++\n  Depends: gcc\ngcc\n |Depends: <debconf-2.0>\n    cdebconf\n<debconf-2.0>\nlibc6:i386\ncdebconf\n"
    assert mirrors_apt.parse_recursive_depends(output) == ["cdebconf", "g++", "gcc"]


def test_debian_package_list_has_what_the_nodes_need():
    names = mirrors_apt.read_package_list()
    assert {"python3-venv", "python3-pip", "libnuma1", "g++", "git", "curl", "acl"} <= set(names)


@pytest.fixture(scope="module")
def nvidia_repo(tmp_path_factory) -> Path:
    if not HAS_DEB_TOOLS:
        pytest.skip("needs gcc, dpkg-deb and dpkg-scanpackages")
    repo = tmp_path_factory.mktemp("nvidia")
    mirrors_apt.build_nvidia_repo(repo)
    return repo


def parse_packages_index(text: str) -> list[dict[str, str]]:
    stanzas = []
    for block in text.strip().split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        stanzas.append(fields)
    return stanzas


@needs_deb_tools
def test_packages_index_lists_every_placeholder(nvidia_repo, spec):
    index = parse_packages_index((nvidia_repo / "Packages").read_text())
    listed = {(s["Package"], s["Version"]) for s in index}
    assert listed == {(p["name"], p["version"]) for p in spec}
    for stanza in index:
        assert (nvidia_repo / stanza["Filename"]).is_file()
        assert "lab placeholder" in stanza["Description"].lower()
    assert (nvidia_repo / "Packages.gz").is_file()
    assert "Packages.gz" in (nvidia_repo / "Release").read_text()
    assert not (nvidia_repo / ".work").exists()


@needs_deb_tools
def test_libnccl2_deb_ships_a_library_that_reports_its_version(nvidia_repo, tmp_path):
    deb = nvidia_repo / "libnccl2_2.30.7-1+cuda13.3_amd64.deb"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    library = tmp_path / "usr/lib/x86_64-linux-gnu/libnccl.so.2"
    assert library.is_symlink()
    assert library.resolve().name == "libnccl.so.2.30.7"
    version = ctypes.c_int(0)
    assert ctypes.CDLL(str(library)).ncclGetVersion(ctypes.byref(version)) == 0
    assert version.value == 23007


@needs_deb_tools
def test_cudart_deb_ships_version_json_and_the_tree_skeleton(nvidia_repo, tmp_path):
    deb = nvidia_repo / "cuda-cudart-13-3_13.3.40-1_amd64.deb"
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], check=True, capture_output=True, text=True).stdout
    assert "./usr/local/cuda-13.3/version.json" in listing
    assert "./usr/local/cuda-13.3/targets/x86_64-linux/lib/" in listing
    assert "./usr/local/cuda-13.3/lib64 -> targets/x86_64-linux/lib" in listing
    assert "root/root" in listing and "lab-placeholder" in listing


@needs_deb_tools
def test_placeholder_debs_are_reproducible(nvidia_repo, tmp_path):
    again = tmp_path / "again"
    again.mkdir()
    mirrors_apt.build_nvidia_repo(again)
    assert (again / "Packages").read_text() == (nvidia_repo / "Packages").read_text()


def test_recipe_key_covers_specs_and_builder_source():
    files = {p.name for p in mirrors_apt.recipe_files()}
    assert {"nvidia-placeholders.toml", "debian-packages.txt", "nccl_version.c", "mirrors_apt.py"} <= files
    assert mirrors_apt._cache.recipe_key(mirrors_apt.recipe_files()) == mirrors_apt._cache.recipe_key(
        mirrors_apt.recipe_files()
    )


# ------------------------------------------------------------- slow: the repositories in the lab cache

LAB_CACHE = Path(os.environ.get("KIMI_LAB_CACHE", "/var/cache/kimi-lab"))


@pytest.fixture(scope="module")
def served_repos() -> Iterator[str]:
    """Both built repositories over HTTP on loopback (a thread of this test, stopped afterwards)."""
    built = mirrors_apt.existing(LAB_CACHE)
    if built is None:
        pytest.skip(f"the apt repositories for the current recipe are not built under {LAB_CACHE} (lab/lab up)")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(built["nvidia"].parent))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("apt-get") is None, reason="apt-get is not installed")
def test_a_bare_node_can_install_the_pins_and_the_debian_packages(served_repos, tmp_path):
    """apt on an empty dpkg status, with only the lab's two repositories: the closure must be complete."""
    for directory in ("state/lists/partial", "cache/archives/partial", "etc/apt.conf.d", "etc/preferences.d"):
        (tmp_path / directory).mkdir(parents=True)
    (tmp_path / "status").write_text("")
    sources = tmp_path / "etc/sources.list"
    sources.write_text(f"deb [trusted=yes] {served_repos}/nvidia ./\ndeb [trusted=yes] {served_repos}/debian ./\n")
    options = []
    for key, value in {
        "Dir::State": tmp_path / "state", "Dir::State::status": tmp_path / "status",
        "Dir::Cache": tmp_path / "cache", "Dir::Etc": tmp_path / "etc", "Dir::Etc::sourcelist": sources,
        "Dir::Etc::sourceparts": tmp_path / "etc/sources.list.d", "Dir::Etc::parts": tmp_path / "etc/apt.conf.d",
        "Dir::Etc::preferencesparts": tmp_path / "etc/preferences.d", "APT::Architecture": "amd64",
        "Debug::NoLocking": "1",
    }.items():  # fmt: skip
        options += ["-o", f"{key}={value}"]
    subprocess.run(["apt-get", *options, "update"], check=True, capture_output=True)
    wanted = ["libnccl2=2.30.7-1+cuda13.3", "libnccl-dev=2.30.7-1+cuda13.3", "cuda-toolkit-13-3",
              "nvidia-driver-580=580.95.05-1", "nvidia-fabricmanager-580=580.95.05-1",
              *mirrors_apt.read_package_list()]  # fmt: skip
    result = subprocess.run(
        ["apt-get", *options, "--simulate", "install", *wanted], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    installs = {
        line.split()[1]: line.split()[2].strip("(") for line in result.stdout.splitlines() if line.startswith("Inst ")
    }
    assert installs["libnccl2"] == "2.30.7-1+cuda13.3"
    assert installs["nvidia-fabricmanager-580"] == installs["nvidia-driver-580"] == "580.95.05-1"
    assert {"g++", "python3-venv", "libnuma1", "cuda-cudart-13-3"} <= set(installs)
