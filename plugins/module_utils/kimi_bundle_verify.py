"""The mirror host's check of a bundle before it is served (plugins/modules/kimi_bundle_verify.py): the
manifest's signature by the pinned key, then the manifest itself, then every file's size, then every file's
sha256. Each step runs only when the one before it passed: a tree is never judged against a manifest nobody
vouched for.

Stdlib only, free of Ansible imports (it runs on the mirror host). Imported as
``ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_verify`` everywhere, the tests included.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .kimi_bundle_signature import BUNDLE_KEYRING, Runner, verify_signature
from .kimi_bundle_tree import MANIFEST_NAME, SIGNATURE_NAME, BundleError, read_document, totals, verify_tree


@dataclass(frozen=True)
class BundleVerdict:
    """What the check found: who signed, the manifest's sha256 and document, and every problem of the tree."""

    signer: str
    manifest_sha256: str
    document: dict[str, Any]
    problems: list[str] = field(default_factory=list)

    def result(self) -> dict[str, Any]:
        """The module's return values."""
        counted = totals(self.document["files"])
        return {
            "signer": self.signer,
            "manifest_sha256": self.manifest_sha256,
            "created_at": self.document["created_at"],
            "built_for": self.document["built_for"],
            "files": counted["files"],
            "symlinks": counted["symlinks"],
            "bytes": counted["bytes"],
            "problems": list(self.problems),
        }


def default_keyring(root: Path) -> Path:
    return Path(root) / BUNDLE_KEYRING


def _read_optional(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def read_manifest_bytes(root: Path) -> bytes:
    """The manifest's bytes; BundleError (worded to follow the directory's name) when there is none."""
    if not Path(root).is_dir():
        raise BundleError("not a directory")
    manifest = _read_optional(Path(root) / MANIFEST_NAME)
    if manifest is None:
        raise BundleError(f"no {MANIFEST_NAME} here: not a bundle (bin/kimi-bundle build writes one)")
    return manifest


def verify_bundle(
    root: Path, pinned: str, run: Runner, keyring: Path | None = None, checksums: bool = True, gpgv: str = "gpgv"
) -> BundleVerdict:
    """Signature, manifest, sizes, then (checksums) sha256 of the bundle at `root`. BundleError (its
    SignatureError and ManifestError included) when the manifest cannot be trusted or read; otherwise the
    verdict, whose problems name each file that differs (empty: the bundle may be served)."""
    root = Path(root)
    manifest = read_manifest_bytes(root)
    signature = _read_optional(root / SIGNATURE_NAME)
    signer = verify_signature(manifest, signature, keyring or default_keyring(root), pinned, run, gpgv)
    try:
        text = manifest.decode("ascii")
    except UnicodeDecodeError:
        raise BundleError(f"{MANIFEST_NAME} is not ASCII JSON (manifest_text writes it so)") from None
    document = read_document(text)
    problems = verify_tree(root, document, checksums)
    return BundleVerdict(signer, hashlib.sha256(manifest).hexdigest(), document, problems)


def failure_message(root: Path, problems: list[str], shown: int = 20) -> str:
    """One message naming each file that differs (the first `shown` of them, and how many more)."""
    listed = problems[:shown]
    more = f"; and {len(problems) - shown} more" if len(problems) > shown else ""
    count = f"{len(problems)} file{'s differ' if len(problems) != 1 else ' differs'}"
    return f"{root}: {count} from the signed manifest: " + "; ".join(listed) + more
