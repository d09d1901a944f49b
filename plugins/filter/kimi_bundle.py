"""`kimi.k2.hf_mirror_headers`: the per-file headers the offline mirror's nginx adds to the checkpoint's files.

The offline_mirror role renders them into `map $uri` blocks from the tree listing the bundle carries; the rows
are kimi_hf_headers.file_headers (plugins/module_utils/kimi_hf_headers.py), the one definition the bundle builder
lays the checkpoint out by and the bundle's tests serve the layout by.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible_collections.kimi.k2.plugins.module_utils.kimi_hf_headers import nginx_header_rows


def hf_mirror_headers(
    tree: Sequence[Mapping[str, Any]], repo_id: str, revision: str, url_prefix: str = "/hf"
) -> list[dict[str, str]]:
    """`tree | kimi.k2.hf_mirror_headers(repo_id, revision)`: [{uri, etag, size}] for every listed file."""
    return nginx_header_rows(tree, str(repo_id), str(revision), str(url_prefix))


class FilterModule:
    """Ansible's entry point for the filters of this file."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"hf_mirror_headers": hf_mirror_headers}
