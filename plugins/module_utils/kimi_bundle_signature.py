"""The detached signature over a bundle's manifest (kimi-bundle.json.asc), judged against the fingerprint the
operator pinned.

gpgv checks the signature with a keyring alone (the bundle's own exported apt keyring by default) in a scratch
GnuPG home, so nothing of the host's GnuPG state is read or written. A keyring inside the bundle proves nothing
by itself, since whoever made the bundle made it too: the signature counts only when gpgv reports VALIDSIG for
the fingerprint the operator pinned out of band. gpgv's status lines (``--status-fd``, doc/DETAILS in GnuPG)
are read here, not its human messages, which are translated and reworded between releases.

gpgv, not gpg: Debian's apt depends on gpgv, so every Debian or Ubuntu host has it, while gnupg is optional.

Stdlib only, free of Ansible imports (it runs on the mirror host); commands run through a caller's runner
(AnsibleModule.run_command on a host, subprocess in tests). Imported as
``ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_signature`` everywhere, the tests included.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .kimi_bundle_tree import MANIFEST_NAME, SIGNATURE_NAME, BundleError

# (argv) -> (exit status, stdout, stderr)
Runner = Callable[[list[str]], tuple[int, str, str]]

FINGERPRINT = re.compile(r"[0-9A-F]{40}")
STATUS_PREFIX = "[GNUPG:] "
# The armor of a detached signature; a clear-signed file ("SIGNED MESSAGE") carries its own text, which is not
# the manifest beside it.
ARMOR_HEADER = "-----BEGIN PGP SIGNATURE-----"
# The bundle's keyring, as kimi_bundle_apt writes it (APT_DIR/KEYRING_NAME there; a unit test keeps them equal:
# that module needs `packaging`, which the mirror host lacks).
BUNDLE_KEYRING = "apt/kimi-bundle-archive.gpg"
# Status keywords for a signature gpgv read but does not accept, and why.
REFUSED_STATUS = {
    "BADSIG": "does not match {manifest} (changed after it was signed)",
    "EXPSIG": "has expired",
    "EXPKEYSIG": "is by a key that has expired",
    "REVKEYSIG": "is by a key that was revoked",
}
STDERR_LINES_SHOWN = 10


class SignatureError(BundleError):
    """The manifest's signature is missing, unreadable, bad, or not by the pinned key; the message says which,
    naming the fingerprints involved."""


def normalise_fingerprint(value: str) -> str:
    """40 upper-case hex digits from a fingerprint as people copy it (gpg --fingerprint's groups of four, lower
    case, a 0x prefix); ValueError when it is not one."""
    text = "".join(str(value).split()).upper()
    text = text.removeprefix("0X")
    if not FINGERPRINT.fullmatch(text):
        raise ValueError(f"{value!r} is not an OpenPGP v4 fingerprint (40 hex digits)")
    return text


@dataclass
class SignatureStatus:
    """What gpgv's status lines say about each signature in the file."""

    # (signing key's fingerprint, its primary key's fingerprint) per VALIDSIG
    valid: list[tuple[str, str]] = field(default_factory=list)
    # keyword -> key ids (or fingerprints) of signatures gpgv read but refused
    refused: dict[str, list[str]] = field(default_factory=dict)
    # issuer fingerprint (else key id) of signatures gpgv could not check: no such key in the keyring
    unknown: list[str] = field(default_factory=list)

    def valid_fingerprints(self) -> list[str]:
        return sorted({primary for _, primary in self.valid})


def _validsig(arguments: Sequence[str]) -> tuple[str, str]:
    """VALIDSIG <signing fpr> <date> <time> <expire> <version> <reserved> <algo> <hash> <class> [<primary fpr>]."""
    signing = arguments[0].upper()
    primary = arguments[9].upper() if len(arguments) > 9 else signing
    return signing, primary


def _errsig_issuer(arguments: Sequence[str]) -> str:
    """ERRSIG <keyid> <algo> <hash> <class> <time> <rc> [<fpr>]: the fingerprint when the signature names it."""
    if len(arguments) > 6 and FINGERPRINT.fullmatch(arguments[6].upper()):
        return arguments[6].upper()
    return arguments[0].upper() if arguments else "an unknown key"


def parse_status(text: str) -> SignatureStatus:
    """gpgv --status-fd output (other lines ignored)."""
    status = SignatureStatus()
    for line in text.splitlines():
        if not line.startswith(STATUS_PREFIX):
            continue
        keyword, *arguments = line[len(STATUS_PREFIX) :].split()
        if keyword == "VALIDSIG" and arguments:
            status.valid.append(_validsig(arguments))
        elif keyword in REFUSED_STATUS:
            status.refused.setdefault(keyword, []).append(arguments[0].upper() if arguments else "?")
        elif keyword == "ERRSIG":
            status.unknown.append(_errsig_issuer(arguments))
    return status


def _pinned_signed(status: SignatureStatus, pinned: str) -> bool:
    """A VALIDSIG by the pinned key itself, or by a subkey of it (the pin names the primary key)."""
    return any(pinned in (signing, primary) for signing, primary in status.valid)


def _refusals(status: SignatureStatus) -> list[str]:
    lines = []
    for keyword, keys in sorted(status.refused.items()):
        reason = REFUSED_STATUS[keyword].format(manifest=MANIFEST_NAME)
        lines += [f"the signature by key {key} {reason} ({keyword})" for key in keys]
    return lines


def _tail(text: str) -> str:
    return " | ".join(text.strip().splitlines()[-STDERR_LINES_SHOWN:])


def judge_status(status_text: str, returncode: int, pinned: str, keyring: str, stderr: str = "") -> str:
    """The fingerprint that vouches for the manifest (the pinned one), or SignatureError saying why not: every
    signature must be good and one of them by the pinned key. Messages name the pinned fingerprint and every
    fingerprint that did sign."""
    status = parse_status(status_text)
    pin = f"the pinned key {pinned}"
    refusals = _refusals(status)
    if refusals:
        raise SignatureError(f"{SIGNATURE_NAME}: " + "; ".join(refusals) + f"; {pin} is required")
    if _pinned_signed(status, pinned):
        if returncode == 0:
            return pinned
        # gpgv fails the file when any signature in it fails: one by the pinned key does not excuse the others.
        unchecked = ", ".join(status.unknown) or f"exit {returncode}: {_tail(stderr)}"
        raise SignatureError(
            f"{SIGNATURE_NAME} holds a good signature by {pin} and others gpgv could not check ({unchecked}): "
            "every signature in it must be good"
        )
    others = [fingerprint for fingerprint in status.valid_fingerprints() if fingerprint != pinned]
    if others:
        raise SignatureError(
            f"{MANIFEST_NAME} is signed by {', '.join(others)}, not by {pin}: a bundle signed by another key is "
            "refused (pin that key only if you trust whoever holds it)"
        )
    if status.unknown:
        raise SignatureError(
            f"{MANIFEST_NAME} is signed by {', '.join(status.unknown)}, which {keyring} does not hold, not by {pin}"
        )
    # No signature gpgv could read at all (NODATA, a keyring it cannot open, ...): its own words say why.
    said = f": {_tail(stderr)}" if stderr.strip() else f" (gpgv exit {returncode})"
    raise SignatureError(f"{SIGNATURE_NAME} holds no signature gpgv can read{said}")


def armor_problem(signature: bytes) -> str | None:
    """Why the file is not an armored detached signature, or None."""
    text = signature.decode("ascii", errors="replace").strip()
    if not text:
        return f"{SIGNATURE_NAME} is empty: the manifest is unsigned"
    first = text.splitlines()[0].strip()
    if first != ARMOR_HEADER:
        return f"{SIGNATURE_NAME} is not an armored detached signature (it starts with {first[:40]!r})"
    return None


def gpgv_command(gpgv: str, home: Path, keyring: Path, signature: Path, data: Path) -> list[str]:
    # gpgv reads a relative --keyring inside --homedir: the keyring is passed absolute.
    return [
        gpgv,
        "--homedir",
        str(home),
        "--keyring",
        str(Path(keyring).resolve()),
        "--status-fd",
        "1",
        str(signature),
        str(data),
    ]


def verify_signature(
    manifest: bytes, signature: bytes | None, keyring: Path, pinned: str, run: Runner, gpgv: str = "gpgv"
) -> str:
    """The pinned fingerprint when `signature` is a good detached signature of exactly these manifest bytes by
    the pinned key (checked with `keyring` alone); SignatureError otherwise. The bytes are copied into a scratch
    directory first, so what gpgv checks is what the caller goes on to read."""
    pinned = normalise_fingerprint(pinned)
    if signature is None:
        raise SignatureError(
            f"{SIGNATURE_NAME} is missing: the manifest is unsigned, and an unsigned bundle is refused"
        )
    problem = armor_problem(signature)
    if problem:
        raise SignatureError(problem)
    if not Path(keyring).is_file():
        raise SignatureError(f"the keyring {keyring} does not exist (a binary keyring, as gpg --export writes it)")
    with tempfile.TemporaryDirectory(prefix="kimi-bundle-gpgv-") as scratch:
        home = Path(scratch) / "gnupg"
        home.mkdir(mode=0o700)
        data, detached = Path(scratch) / MANIFEST_NAME, Path(scratch) / SIGNATURE_NAME
        data.write_bytes(manifest)
        detached.write_bytes(signature)
        returncode, stdout, stderr = run(gpgv_command(gpgv, home, keyring, detached, data))
    return judge_status(stdout, returncode, pinned, str(keyring), stderr)
