"""The part of an air-gapped bundle's manifest that needs only the standard library: the tree walk, each file's
size and sha256, the document's shape, and verify_tree, the check the mirror host runs before it serves a bundle.

It lives apart from kimi_bundle_inputs.py and kimi_bundle_manifest.py because the mirror host runs it
(plugins/modules/kimi_bundle_verify.py): a node's python3 has nothing but the standard library, and those need
`packaging` for the build inputs. Nothing re-exports these names: every caller imports them from here.

What this module cannot judge without `packaging` is built_for (the inputs and their recorded sha256):
read_document checks everything else, kimi_bundle_manifest.read_manifest adds built_for. On the mirror host the detached
signature (kimi_bundle_signature.py) is what vouches for built_for.

Stdlib only, free of Ansible imports. Imported as
``ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_tree`` everywhere, the tests included.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .kimi_checkpoint import HASH_BLOCK

# 1: files are {path, size, sha256} or {path, symlink}; built_for is BuildInputs.to_dict().
SCHEMA_VERSION = 1
MANIFEST_KIND = "kimi.k2 bundle manifest"
MANIFEST_NAME = "kimi-bundle.json"
SIGNATURE_NAME = "kimi-bundle.json.asc"
# The manifest cannot list itself, nor the signature made over it afterwards.
OWN_FILES = frozenset({MANIFEST_NAME, SIGNATURE_NAME})
SHA256_HEX = re.compile(r"[0-9a-f]{64}")

FILE, SYMLINK, REFUSED = "file", "symlink", "refused"


class BundleError(ValueError):
    """A bundle, its manifest or the inputs it is built from cannot be used; the message names what and why."""


class ManifestError(BundleError):
    """A manifest this collection cannot read or trust (malformed, another schema, edited by hand)."""


class BundleTreeError(BundleError):
    """A bundle directory the manifest cannot describe (a symlink leaving it, a device file, a bad name)."""


# --------------------------------------------------------------------------------------- the bundle tree


@dataclass(frozen=True)
class TreeItem:
    """One thing under the bundle root, never followed: a regular file, a symlink inside it, or a refusal (reason)."""

    path: str
    kind: str
    size: int = 0
    target: str = ""
    reason: str = ""


def _symlink_item(root: Path, link: Path, relative: str) -> TreeItem:
    target = str(link.readlink())
    if Path(target).is_absolute():
        # Refused even inside the root: the bundle is copied to the mirror host, where the path means another thing.
        return TreeItem(relative, REFUSED, target=target, reason=f"is a symlink to the absolute path {target}")
    try:
        resolved = link.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling, or a loop (RuntimeError before Python 3.13)
        return TreeItem(relative, REFUSED, target=target, reason=f"is a symlink to {target}, which does not exist")
    if not resolved.is_relative_to(root):
        return TreeItem(relative, REFUSED, target=target, reason=f"is a symlink to {target}, outside the bundle")
    return TreeItem(relative, SYMLINK, target=target)


def _tree_item(root: Path, entry: os.DirEntry) -> TreeItem | None:
    """The item for one directory entry; None for a directory (walked separately)."""
    relative = Path(entry.path).relative_to(root).as_posix()
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        return TreeItem(relative, REFUSED, reason="has a name that is not UTF-8 (a manifest is JSON text)")
    if entry.is_symlink():
        return _symlink_item(root, Path(entry.path), relative)
    if entry.is_dir(follow_symlinks=False):
        return None
    if entry.is_file(follow_symlinks=False):
        return TreeItem(relative, FILE, size=entry.stat(follow_symlinks=False).st_size)
    return TreeItem(relative, REFUSED, reason="is not a regular file, a directory or a symlink")


def tree_items(root: Path) -> list[TreeItem]:
    """Everything under `root` but directories and the manifest's own files, sorted by path; nothing is
    followed, so a symlinked directory is one item and the walk never leaves the root."""
    real_root = Path(root).resolve(strict=True)
    items: list[TreeItem] = []
    pending = [real_root]
    while pending:
        with os.scandir(pending.pop()) as listing:
            for entry in listing:
                item = _tree_item(real_root, entry)
                if item is None:
                    pending.append(Path(entry.path))
                elif item.path not in OWN_FILES:
                    items.append(item)
    return sorted(items, key=lambda item: item.path)


def hash_file(path: Path) -> tuple[int, str]:
    """(bytes read, sha256) in one streaming pass: the size is of the very bytes hashed."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while block := handle.read(HASH_BLOCK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def manifest_entries(root: Path, known: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every regular file under `root` ({path, size, sha256}) and every symlink inside it ({path, symlink}),
    sorted by path; BundleTreeError names every symlink that leaves the root and every special file.

    `known`: {path: {size, sha256}} of files the caller hashed as it wrote them (the checkpoint step verifies
    every file it places): such a file of that size is not read again, which for a 1 TB checkpoint saves as
    long as the download's own verification took."""
    known = known or {}
    items = tree_items(root)
    refused = [f"{item.path} {item.reason}" for item in items if item.kind == REFUSED]
    if refused:
        raise BundleTreeError(f"{root}: " + "; ".join(refused))
    real_root = Path(root).resolve()
    entries: list[dict[str, Any]] = []
    for item in items:
        if item.kind == SYMLINK:
            entries.append({"path": item.path, "symlink": item.target})
            continue
        given = known.get(item.path)
        if given is not None and given.get("size") == item.size:
            entries.append({"path": item.path, "size": item.size, "sha256": given["sha256"]})
            continue
        size, sha256 = hash_file(real_root / item.path)
        entries.append({"path": item.path, "size": size, "sha256": sha256})
    return entries


# ------------------------------------------------------------------------------------------ the document


def safe_path(path: Any) -> bool:
    """A relative POSIX path in canonical form that cannot leave the root ('a/b', never '../a', '/a', 'a//b')."""
    if not isinstance(path, str) or not path or "\0" in path:
        return False
    parts = PurePosixPath(path).parts
    return not path.startswith("/") and "/".join(parts) == path and not {".", ".."} & set(parts)


def _check_entry(entry: Any, where: str) -> str | None:
    """Why one files[] entry is malformed, or None."""
    if not isinstance(entry, Mapping) or not safe_path(entry.get("path")):
        return f"{where}: needs a relative path inside the bundle (got {entry!r})"
    if entry["path"] in OWN_FILES:
        return f"{where}: lists {entry['path']}, which the manifest cannot describe"
    if set(entry) == {"path", "symlink"}:
        target = entry["symlink"]
        ok = isinstance(target, str) and target and not target.startswith("/")
        return None if ok else f"{where} ({entry['path']}): symlink must be a relative target"
    if set(entry) != {"path", "size", "sha256"}:
        return f"{where} ({entry['path']}): needs exactly path, size and sha256 (got {sorted(entry)})"
    size = entry["size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return f"{where} ({entry['path']}): size must be a whole number of bytes (got {size!r})"
    if not isinstance(entry["sha256"], str) or not SHA256_HEX.fullmatch(entry["sha256"]):
        return f"{where} ({entry['path']}): sha256 must be 64 lower-case hex digits (got {entry['sha256']!r})"
    return None


def checked_entries(entries: Any, where: str = "files") -> list[dict[str, Any]]:
    """The entries, each well-formed, sorted by path with no path twice; ManifestError names the first bad one."""
    if not isinstance(entries, list):
        raise ManifestError(f"{where} must be a list (got {type(entries).__name__})")
    for index, entry in enumerate(entries):
        problem = _check_entry(entry, f"{where}[{index}]")
        if problem:
            raise ManifestError(problem)
    paths = [entry["path"] for entry in entries]
    for earlier, later in itertools.pairwise(paths):
        if later <= earlier:
            raise ManifestError(f"{where}: {later} is listed after {earlier} (paths must be sorted and unique)")
    return [dict(entry) for entry in entries]


def totals(entries: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    files = [entry for entry in entries if "sha256" in entry]
    return {"files": len(files), "symlinks": len(entries) - len(files), "bytes": sum(e["size"] for e in files)}


def manifest_text(document: Mapping[str, Any]) -> str:
    """The bytes that are signed: sorted keys, two-space indent, ASCII, one trailing newline."""
    return json.dumps(document, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def read_document(text: str) -> dict[str, Any]:
    """A manifest's document after every check that needs neither the tree nor `packaging`: schema, kind,
    created_at, built_for being an object, files and totals. ManifestError names the key that fails.
    kimi_bundle_manifest.read_manifest checks built_for's inputs as well."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ManifestError(f"{MANIFEST_NAME} is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ManifestError(f"{MANIFEST_NAME} must hold a JSON object")
    if document.get("schema") != SCHEMA_VERSION or document.get("kind") != MANIFEST_KIND:
        raise ManifestError(
            f"{MANIFEST_NAME}: schema {document.get('schema')!r} of kind {document.get('kind')!r} is not one this "
            f"collection reads (schema {SCHEMA_VERSION}, {MANIFEST_KIND!r}): build the bundle with this collection"
        )
    if not isinstance(document.get("created_at"), str):
        raise ManifestError(f"{MANIFEST_NAME}: created_at must be a timestamp string")
    if not isinstance(document.get("built_for"), dict):
        raise ManifestError(f"{MANIFEST_NAME}: built_for must be a JSON object")
    files = checked_entries(document.get("files"))
    if document.get("totals") != totals(files):
        raise ManifestError(
            f"{MANIFEST_NAME}: totals {document.get('totals')} do not add up to files ({totals(files)})"
        )
    return document


# ------------------------------------------------------------------------------------------- verification


def _listed_kind(entry: Mapping[str, Any]) -> str:
    return SYMLINK if "symlink" in entry else FILE


def _shape_problem(entry: Mapping[str, Any], item: TreeItem | None) -> str | None:
    """What a stat shows to be wrong (missing, wrong kind, wrong size, wrong link), without reading content."""
    if item is None:
        listed = f"a symlink to {entry['symlink']}" if "symlink" in entry else f"{entry['size']} bytes"
        return f"missing (the manifest lists {listed})"
    if item.kind == REFUSED:
        return item.reason
    if item.kind != _listed_kind(entry):
        return f"is a {item.kind}, the manifest lists a {_listed_kind(entry)}"
    if item.kind == SYMLINK and item.target != entry["symlink"]:
        return f"points to {item.target}, the manifest says {entry['symlink']}"
    if item.kind == FILE and item.size != entry["size"]:
        return f"size {item.size} bytes, the manifest says {entry['size']} bytes"
    return None


def _content_problem(root: Path, entry: Mapping[str, Any]) -> str | None:
    size, sha256 = hash_file(root / entry["path"])
    if size != entry["size"]:  # changed while it was being read
        return f"size {size} bytes, the manifest says {entry['size']} bytes"
    return None if sha256 == entry["sha256"] else f"sha256 {sha256}, the manifest says {entry['sha256']}"


def verify_tree(root: Path, document: Mapping[str, Any], checksums: bool = True) -> list[str]:
    """Every way the tree under `root` differs from the manifest, each naming the file; empty when it matches.

    Every file is stat'ed before any is hashed, so a truncated or missing file is named at once rather than
    after hours of hashing the files before it. checksums=False stops there (a quick look).
    """
    files = checked_entries(document.get("files"))
    real_root = Path(root).resolve(strict=True)
    on_disk = {item.path: item for item in tree_items(real_root)}
    problems: dict[str, str] = {}
    to_hash = []
    for entry in files:
        problem = _shape_problem(entry, on_disk.pop(entry["path"], None))
        if problem:
            problems[entry["path"]] = problem
        elif "sha256" in entry:
            to_hash.append(entry)
    for item in on_disk.values():
        problems[item.path] = item.reason if item.kind == REFUSED else f"is not in the manifest (an extra {item.kind})"
    for entry in to_hash if checksums else []:
        problem = _content_problem(real_root, entry)
        if problem:
            problems[entry["path"]] = problem
    return [f"{path}: {problem}" for path, problem in sorted(problems.items())]
