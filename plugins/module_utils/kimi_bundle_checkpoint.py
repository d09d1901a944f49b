"""The checkpoint an air-gapped bundle carries, as the checkpoint role reads it on a node: the files the bundle's
manifest lists under ``hf/ORG/NAME/resolve/SHA/``, in the shape kimi_hf_repo_files gives for the Hub (path, size,
sha256), and the plain URL each one is served at by the offline mirror.

Why plain files and the manifest, not an imitation of the Hub: the nodes fetch each file with a plain GET (resumed
with a Range request) and the checkpoint role checks its size and sha256 against this listing, which is the
manifest whose signature the mirror host checked against the pinned key. Nothing here depends on how
huggingface_hub talks to the Hub (its HEAD headers, its xet protocol, its listing API), so a bump of the hf pin
changes nothing on the mirror or in an air-gapped converge (docs/air-gapped.md).

Standard library only: it runs on the nodes, which have no ``packaging`` (kimi_bundle_manifest.read_manifest needs
it; the document checks used here are kimi_bundle_tree's).
"""

from __future__ import annotations

import posixpath
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from .kimi_bundle_tree import read_document
from .kimi_checkpoint import RepoFile, select_files

# Where a bundle keeps the checkpoint's files, relative to its root (and the mirror's URL).
CHECKPOINT_ROOT = "hf"


class BundleCheckpointError(Exception):
    """The served bundle holds no checkpoint, or another one than the inventory pins."""


def files_prefix(repo_id: str, revision: str) -> str:
    """The manifest paths of a checkpoint's files start with this (the bundle's layout)."""
    return f"{CHECKPOINT_ROOT}/{repo_id}/resolve/{revision}/"


def file_url(mirror_url: str, repo_id: str, revision: str, path: str) -> str:
    """Where the offline mirror serves one file of the checkpoint (`mirror_url` ends with a slash)."""
    return mirror_url + urllib.parse.quote(files_prefix(repo_id, revision) + path)


def carried_checkpoint(document: Mapping[str, Any]) -> tuple[str, str]:
    """(repo_id, revision) of the checkpoint the bundle was built with; BundleCheckpointError when it has none."""
    checkpoint = (document.get("built_for") or {}).get("checkpoint")
    if not isinstance(checkpoint, Mapping) or not checkpoint.get("repo_id") or not checkpoint.get("revision"):
        raise BundleCheckpointError(
            "the bundle carries no checkpoint (it was built without kimi_bundle_checkpoint): build it with the "
            "checkpoint, or set kimi_bundle_checkpoint: false so that the nodes fetch it from checkpoint_hf_endpoint"
        )
    return str(checkpoint["repo_id"]), str(checkpoint["revision"])


def _content(entry: Mapping[str, Any], by_path: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """A file entry itself, or for a link (a build links a file two revisions share) the entry it points at: nginx
    serves the target's bytes at the link's URL."""
    seen = set()
    while "symlink" in entry and entry["path"] not in seen:
        seen.add(entry["path"])
        target = posixpath.normpath(posixpath.join(posixpath.dirname(entry["path"]), entry["symlink"]))
        if target not in by_path:
            raise BundleCheckpointError(f"{entry['path']} links to {entry['symlink']}, which the manifest omits")
        entry = by_path[target]
    if "sha256" not in entry:
        raise BundleCheckpointError(f"{entry['path']} is a loop of links in the manifest")
    return entry


def bundle_listing(
    manifest_text: str, repo_id: str, revision: str, include: Sequence[str], exclude: Sequence[str]
) -> dict[str, Any]:
    """The checkpoint's files as the role's download, verification and marker read them, from the manifest's text.

    The repository and revision must be the ones the bundle carries: the role would otherwise write a marker for a
    checkpoint the mirror does not hold. The role's own include/exclude patterns select among the bundle's files,
    as they select among the Hub's (the bundle was built with the same patterns; the match check compares them).
    """
    document = read_document(manifest_text)
    carried = carried_checkpoint(document)
    if carried != (repo_id, revision):
        raise BundleCheckpointError(
            f"the bundle carries {carried[0]} at {carried[1]}, the inventory pins {repo_id} at {revision} "
            "(kimi_checkpoint_repo_id, kimi_checkpoint_revision): serve a bundle built for this checkpoint"
        )
    prefix = files_prefix(repo_id, revision)
    by_path = {entry["path"]: entry for entry in document["files"]}
    files = [
        RepoFile(path=entry["path"][len(prefix) :], size=content["size"], sha256=content["sha256"])
        for entry in document["files"]
        if entry["path"].startswith(prefix)
        for content in [_content(entry, by_path)]
    ]
    chosen = select_files(files, list(include), list(exclude))
    if not chosen:
        raise BundleCheckpointError(
            f"the bundle lists no file of {repo_id} at {revision} that kimi_checkpoint_include/kimi_checkpoint_exclude "
            "select"
        )
    return {
        "revision": revision,
        "resolved_from": None,
        "files": [asdict(item) for item in chosen],
        "file_count": len(chosen),
        "total_bytes": sum(item.size for item in chosen),
    }
