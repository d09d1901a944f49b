"""Stopping what a test started: only its own process group, by its pid (never by name)."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the process group a `start_new_session=True` child leads, SIGKILL after `grace_s`, then reap it."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
