"""A headless rank's connections to rank 0's rendezvous (master port), read from `ss -Htan`: one reading for the
serve phase's group decision (kimi_serve, kimi_serve_group) and the node's watchdog
(roles/vllm_serve/files/kimi_watchdog.py).

Standard library only and free of package-relative imports: the vllm_serve role copies this file beside the
watchdog on each node, where it is imported as a plain module by the node's own /usr/bin/python3.
"""

from __future__ import annotations

from collections.abc import Sequence


def _peer(address: str) -> tuple[str, str]:
    """'[::ffff:198.18.0.11]:29501' or '198.18.0.11:29501' -> ('198.18.0.11', '29501')."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host.startswith("::ffff:"):
        host = host[len("::ffff:") :]
    return host, port


def rendezvous_states(ss_text: str, rendezvous: str) -> list[str]:
    """The TCP states of this node's sockets whose peer is `rendezvous` ("ADDRESS:PORT"), from `ss -Htan`.

    A headless rank keeps a connection to rank 0's master port for as long as its group lives. When rank 0's
    process goes away, that socket stays in CLOSE-WAIT: the rank holds on to a group that no longer exists.
    """
    wanted = _peer(rendezvous)
    states = []
    for line in ss_text.splitlines():
        words = line.split()
        if len(words) >= 5 and _peer(words[4]) == wanted:
            states.append(words[0])
    return states


def rendezvous_closed(states: Sequence[str]) -> bool:
    """Rank 0 closed this rank's connection to its rendezvous and the rank has no live one: rank 0 was restarted
    (or stopped) and the rank still holds on to the group rank 0 left."""
    return "CLOSE-WAIT" in states and "ESTAB" not in states
