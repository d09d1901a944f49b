"""What `ansible-galaxy collection build` puts in the kimi.k2 tarball: the collection a user installs, without
the checkout's tools.

plugins/module_utils holds only what modules, filters and action plugins import. The air-gapped bundle builder,
the advisory refresh, the GPU facts recorder and the planner's CLI are contrib/kimi_tools (run from a checkout by
bin/'s launchers), and galaxy.yml's build_ignore leaves both out; the programs roles install on nodes are role
files. This builds the tarball and reads its file list (no install: tests/local/test_collection.py installs it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath

import pytest
import yaml

from tests.paths import REPO_ROOT

BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((REPO_ROOT / "galaxy.yml").read_text())
# The checkout's tools, by module name: none may be in the tarball, under any directory.
TOOLS = (
    "kimi_bundle_cli",
    "kimi_bundle_build",
    "kimi_bundle_wheels",
    "kimi_bundle_apt",
    "kimi_bundle_hf",
    "kimi_advisories_refresh",
    "kimi_gpu_facts",
    "kimi_plan_cli",
)
LAUNCHERS = ("kimi-bundle", "kimi-advisories", "kimi-gpu-facts", "kimi-plan")
# The node programs: in the tarball as role files (the roles install them), never as module_utils.
NODE_PROGRAMS = {
    "roles/vllm_serve/files/kimi_watchdog.py": "kimi_watchdog",
    "roles/router/files/kimi-haproxy-ctl": "kimi_router",
}


@pytest.fixture(scope="module")
def tarball(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("build")
    # Without the checkout's ANSIBLE_* settings (the Makefile exports them): a build reads galaxy.yml only.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["ANSIBLE_HOME"] = str(root / "home")
    built = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(root), str(REPO_ROOT)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (path,) = root.glob(f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz")
    print(f"{path.name}: {path.stat().st_size} bytes")
    return path


@pytest.fixture(scope="module")
def members(tarball) -> list[PurePosixPath]:
    with tarfile.open(tarball) as archive:
        return [PurePosixPath(name) for name in archive.getnames()]


def test_no_build_tool_recorder_or_cli_is_in_the_tarball(members):
    found = [
        str(path)
        for path in members
        if path.stem in TOOLS
        or path.name in LAUNCHERS
        or (path.parts and path.parts[0] in ("contrib", "bin"))
        or "kimi_tools" in path.parts
    ]
    assert not found, f"the checkout's tools are in the collection tarball: {found}"


def test_module_utils_holds_no_node_program_and_the_roles_ship_them(members):
    names = {str(path) for path in members}
    for role_file, old_module in NODE_PROGRAMS.items():
        assert role_file in names, role_file
        assert f"plugins/module_utils/{old_module}.py" not in names, old_module
    # What the watchdog imports beside it on a node, copied from the collection's module_utils by the role.
    assert {"plugins/module_utils/kimi_systemd.py", "plugins/module_utils/kimi_rendezvous.py"} <= names


def test_the_air_gapped_checkpoint_listing_ships_with_its_module(members):
    names = {str(path) for path in members}
    assert {
        "plugins/modules/kimi_bundle_checkpoint_files.py",
        "plugins/module_utils/kimi_bundle_checkpoint.py",
    } <= names
    assert "roles/checkpoint/files/kimi-checkpoint-fetch.py" in names
