"""The per-file headers the offline mirror's nginx adds to the checkpoint's files (filter `kimi.k2.hf_mirror_headers`,
plugins/filter/kimi_bundle.py), and the request path of a file under a static Hub layout.

The bundle builder (contrib/kimi_tools/kimi_tools/kimi_bundle_hf.py) lays the checkpoint out by the same paths and
imports these, so the layout and the mirror's headers have one definition.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .kimi_checkpoint import RepoFile, files_from_tree


def resolve_path(repo_id: str, revision: str, path: str) -> str:
    return f"{repo_id}/resolve/{revision}/{path}"


def file_headers(
    repo_id: str, revision: str, files: Iterable[RepoFile], url_prefix: str = ""
) -> dict[str, dict[str, str]]:
    """Per-file headers of resolve answers, by request path: X-Linked-Etag, the file's checksum as the Hub
    gives it (LFS sha256, else git blob id), and X-Linked-Size.

    hf takes X-Linked-Etag before ETag (file_download.py: get_hf_file_metadata). A sha256 there lets hf keep a
    file already in a node's --local-dir without its metadata after hashing it, as with the Hub
    (_hf_hub_download_to_local_dir), instead of deleting and fetching it again; with nginx's own ETag (mtime and
    size) it refetches. X-Linked-Size is hf's expected size, so a truncated copy on the mirror fails hf's
    consistency check instead of being accepted. nginx: a `map $uri` per header.
    """
    prefix = url_prefix.rstrip("/")
    headers = {}
    for repo_file in files:
        etag = repo_file.sha256 or repo_file.git_oid
        if etag is None:
            continue
        path = f"{prefix}/{resolve_path(repo_id, revision, repo_file.path)}"
        headers[path] = {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(repo_file.size)}
    return headers


# What an nginx configuration cannot put in a double-quoted map key as it is.
_UNQUOTABLE = re.compile(r'["\\\x00-\x1f\x7f]')
# The offline_mirror role's map_hash_bucket_size; a longer key (with nginx's own bytes per entry) would not fit.
NGINX_MAP_BUCKET = 512
NGINX_MAP_KEY_LIMIT = NGINX_MAP_BUCKET - 32


def nginx_header_rows(
    tree: Sequence[Mapping[str, Any]], repo_id: str, revision: str, url_prefix: str = ""
) -> list[dict[str, str]]:
    """file_headers of every file the bundled tree listing names, as rows {uri, etag, size} for the offline_mirror
    role's `map $uri` blocks, sorted by uri. A path no map key can quote (a double quote, a backslash, a control
    character) or longer than NGINX_MAP_KEY_LIMIT bytes is left out: hf then gets nginx's own ETag for it, which
    makes it fetch the file again rather than keep a copy, never take wrong bytes."""
    headers = file_headers(repo_id, revision, files_from_tree(list(tree)), url_prefix)
    return [
        {"uri": uri, "etag": values["X-Linked-Etag"], "size": values["X-Linked-Size"]}
        for uri, values in sorted(headers.items())
        if not _UNQUOTABLE.search(uri) and len(uri.encode()) <= NGINX_MAP_KEY_LIMIT
    ]
