"""The programs roles install on nodes (roles/*/files: not module helpers, so not in plugins/module_utils), imported
by tests the way a node runs them.

The watchdog is imported from a directory laid out as roles/vllm_serve/tasks/watchdog.yml lays out
vllm_serve_watchdog_lib_dir: the script, kimi_evidence.py and copies of the three collection module_utils it
imports, nothing else, so a test fails if it ever needs more than that directory and the standard library.
kimi-haproxy-ctl has no `.py` name (it is installed as a command), so it is loaded from its file.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.machinery
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from tests.paths import REPO_ROOT

MODULE_UTILS = REPO_ROOT / "plugins" / "module_utils"
WATCHDOG = REPO_ROOT / "roles" / "vllm_serve" / "files" / "kimi_watchdog.py"
# What watchdog.yml writes beside the script, from the collection's module_utils.
WATCHDOG_BESIDE = ("kimi_systemd.py", "kimi_rendezvous.py", "kimi_start_phases.py")
# What it writes beside the script from the role's own files.
WATCHDOG_FILES_BESIDE = ("kimi_evidence.py",)
HAPROXY_CTL = REPO_ROOT / "roles" / "router" / "files" / "kimi-haproxy-ctl"


def watchdog() -> ModuleType:
    """roles/vllm_serve/files/kimi_watchdog.py, imported as `kimi_watchdog` from a node-like directory of its own."""
    if "kimi_watchdog" in sys.modules:
        return sys.modules["kimi_watchdog"]
    directory = Path(tempfile.mkdtemp(prefix="kimi-watchdog-lib-"))
    atexit.register(shutil.rmtree, directory, True)
    shutil.copy(WATCHDOG, directory)
    for name in WATCHDOG_BESIDE:
        shutil.copy(MODULE_UTILS / name, directory)
    for name in WATCHDOG_FILES_BESIDE:
        shutil.copy(WATCHDOG.parent / name, directory)
    sys.path.insert(0, str(directory))
    try:
        return importlib.import_module("kimi_watchdog")
    finally:
        sys.path.remove(str(directory))


def haproxy_ctl() -> ModuleType:
    """roles/router/files/kimi-haproxy-ctl, imported as `kimi_haproxy_ctl`."""
    name = "kimi_haproxy_ctl"
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.SourceFileLoader(name, str(HAPROXY_CTL))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    # Registered before it runs: its dataclasses look their module up in sys.modules.
    sys.modules[name] = module
    loader.exec_module(module)
    return module
