"""The attributes every kimi.k2 module declares (check_mode, diff_mode), described once.

A module extends ``kimi.k2.attributes`` for the descriptions and one of the named fragments for its support,
or states its own support (with details) under ``attributes`` when neither fits.
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and say what it would change without changing the target.
  diff_mode:
    description: Returns the details of what it changes (or would change in check mode) for C(--diff).
"""

    # Gathers, computes or judges; changes nothing anywhere.
    READS_ONLY = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: Reads or computes only, so check mode runs it unchanged and returns the same answer.
  diff_mode:
    support: none
    details: Changes nothing, so there is no diff.
"""

    # Writes a report on the controller: output, not managed state.
    WRITES_REPORTS = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: >-
      Its reports are output, not managed state, so it writes them in check mode as well; nothing on a node
      changes.
  diff_mode:
    support: none
    details: A report is output; its content is in the result, not in a diff.
"""
