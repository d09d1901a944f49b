"""Talking to the lab's served model from the host, the way a user's client does."""

from __future__ import annotations

import json
import subprocess
import urllib.request

RANK0_ADDRESS = "198.18.0.11"
RANK0_API = f"http://{RANK0_ADDRESS}:8000"
SERVED_MODEL = "kimi-k2"


def generates_a_token(timeout: float = 30) -> bool:
    """Rank 0 answers a one-token completion (a group whose headless rank is gone still answers /health)."""
    route = subprocess.run(["ip", "route", "get", RANK0_ADDRESS], capture_output=True, text=True, check=True)
    assert "dev br-lab" in route.stdout, f"{RANK0_ADDRESS} does not route via the lab bridge: {route.stdout}"
    body = json.dumps({"model": SERVED_MODEL, "prompt": "ping", "max_tokens": 1}).encode()
    request = urllib.request.Request(
        f"{RANK0_API}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status == 200 and bool(json.load(reply)["choices"])
    except OSError:
        return False
