"""The manifest's signature, judged from gpgv's status lines: only a good signature by the pinned key vouches for a
bundle, and every refusal names the pinned fingerprint and whatever did sign.

The status texts are gpgv 2.2.40's own (Debian 12), recorded on this project's host with two throwaway ed25519
keys: A (the pinned one) and B (another).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_signature as ks
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_signature import SignatureError
from kimi_tools import kimi_bundle_apt as kba

A = "2EF5B607163A85FEC8C8F7BD01E2C050E1683E6D"
B = "69F52664110472A6B5B17950239F8A6D456B22DB"
GOOD_A = f"""[GNUPG:] NEWSIG
[GNUPG:] KEY_CONSIDERED {A} 0
[GNUPG:] SIG_ID Ta0hfgDRqtJe0SPlPVmD9Xk+8qI 2026-12-02 1796255523
[GNUPG:] KEY_CONSIDERED {A} 0
[GNUPG:] GOODSIG 01E2C050E1683E6D A <a@x>
[GNUPG:] VALIDSIG {A} 2026-12-02 1796255523 0 4 0 22 8 00 {A}
"""
# B's signature checked with a keyring holding B (a bundle whose keyring and signature were both replaced).
GOOD_B = f"""[GNUPG:] NEWSIG
[GNUPG:] KEY_CONSIDERED {B} 0
[GNUPG:] GOODSIG 239F8A6D456B22DB B <b@x>
[GNUPG:] VALIDSIG {B} 2026-12-02 1796255523 0 4 0 22 8 00 {B}
"""
# B's signature checked with the genuine keyring (A only).
UNKNOWN_B = f"""[GNUPG:] NEWSIG
[GNUPG:] ERRSIG 239F8A6D456B22DB 22 8 00 1796255523 9 {B}
[GNUPG:] NO_PUBKEY 239F8A6D456B22DB
"""
BAD_A = f"""[GNUPG:] NEWSIG
[GNUPG:] KEY_CONSIDERED {A} 0
[GNUPG:] BADSIG 01E2C050E1683E6D A <a@x>
"""
NO_DATA = "[GNUPG:] NODATA 1\n[GNUPG:] NODATA 2\n"
SUBKEY = "0123456789ABCDEF0123456789ABCDEF01234567"
BY_SUBKEY_OF_A = f"[GNUPG:] VALIDSIG {SUBKEY} 2026-12-02 1796255523 0 4 0 22 8 00 {A}\n"
EXPIRED_A = f"[GNUPG:] EXPKEYSIG 01E2C050E1683E6D A <a@x>\n[GNUPG:] VALIDSIG {A} 2026-12-02 1 0 4 0 22 8 00 {A}\n"
ARMORED = b"-----BEGIN PGP SIGNATURE-----\n\niHUEABYKAB0WIQQu9bYHFjqF/sjI\n-----END PGP SIGNATURE-----\n"


def judge(status: str, returncode: int = 0, pinned: str = A) -> str:
    return ks.judge_status(status, returncode, pinned, "/b/apt/kimi-bundle-archive.gpg")


@pytest.mark.parametrize(
    "text",
    [A, A.lower(), "2EF5 B607 163A 85FE C8C8  F7BD 01E2 C050 E168 3E6D", "0x" + A, f"  {A}\n"],
)
def test_a_fingerprint_is_read_as_people_copy_it(text):
    assert ks.normalise_fingerprint(text) == A


@pytest.mark.parametrize("text", ["", "01E2C050E1683E6D", A[:-1], A + "0", "G" * 40, "not a key"])
def test_a_key_id_or_anything_else_is_not_a_fingerprint(text):
    with pytest.raises(ValueError, match="40 hex digits"):
        ks.normalise_fingerprint(text)


def test_a_good_signature_by_the_pinned_key_vouches_for_the_manifest():
    assert judge(GOOD_A) == A


def test_a_signature_by_a_subkey_of_the_pinned_key_counts():
    assert judge(BY_SUBKEY_OF_A) == A
    assert ks.parse_status(BY_SUBKEY_OF_A).valid == [(SUBKEY, A)]


def test_a_good_signature_by_another_key_is_refused_naming_both_fingerprints():
    with pytest.raises(SignatureError) as refused:
        judge(GOOD_B)
    assert str(refused.value).startswith(f"kimi-bundle.json is signed by {B}, not by the pinned key {A}")


def test_a_signature_by_a_key_the_keyring_lacks_names_its_fingerprint_and_the_pinned_one():
    with pytest.raises(SignatureError) as refused:
        judge(UNKNOWN_B, returncode=2)
    assert str(refused.value) == (
        f"kimi-bundle.json is signed by {B}, which /b/apt/kimi-bundle-archive.gpg does not hold, "
        f"not by the pinned key {A}"
    )


def test_an_errsig_without_fingerprint_names_the_key_id():
    status = "[GNUPG:] ERRSIG 239F8A6D456B22DB 22 8 00 1796255523 9 -\n"
    with pytest.raises(SignatureError, match="signed by 239F8A6D456B22DB, which"):
        judge(status, returncode=2)


def test_a_bad_signature_says_the_manifest_changed_after_signing():
    with pytest.raises(SignatureError) as refused:
        judge(BAD_A, returncode=1)
    assert str(refused.value) == (
        "kimi-bundle.json.asc: the signature by key 01E2C050E1683E6D does not match kimi-bundle.json (changed after "
        f"it was signed) (BADSIG); the pinned key {A} is required"
    )


def test_a_signature_by_an_expired_pinned_key_is_refused_although_gpgv_calls_it_valid():
    with pytest.raises(SignatureError, match="is by a key that has expired \\(EXPKEYSIG\\)"):
        judge(EXPIRED_A)


def test_a_second_signature_gpgv_cannot_check_fails_the_whole():
    # gpgv exits 2 when any signature cannot be checked: every signature must be good.
    with pytest.raises(SignatureError) as refused:
        judge(GOOD_A + UNKNOWN_B, returncode=2)
    assert str(refused.value) == (
        f"kimi-bundle.json.asc holds a good signature by the pinned key {A} and others gpgv could not check ({B}): "
        "every signature in it must be good"
    )


def test_a_failure_gpgv_reports_no_status_for_is_shown_with_its_words():
    with pytest.raises(SignatureError) as refused:
        ks.judge_status("", 2, A, "k", "gpgv: keyblock resource '/k': No such file or directory\n")
    assert str(refused.value) == (
        "kimi-bundle.json.asc holds no signature gpgv can read: gpgv: keyblock resource '/k': No such file or directory"
    )


def test_nothing_gpgv_can_read_is_named_with_its_words():
    with pytest.raises(SignatureError) as refused:
        ks.judge_status(NO_DATA, 2, A, "k", "gpgv: no valid OpenPGP data found.\n")
    assert (
        str(refused.value)
        == "kimi-bundle.json.asc holds no signature gpgv can read: gpgv: no valid OpenPGP data found."
    )


@pytest.mark.parametrize(
    ("signature", "words"),
    [
        (b"", "is empty: the manifest is unsigned"),
        (b"  \n", "is empty: the manifest is unsigned"),
        (b"-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512\n", "is not an armored detached signature"),
        (b"\x89\x01\x33binary", "is not an armored detached signature"),
    ],
)
def test_only_an_armored_detached_signature_is_read(signature, words):
    assert words in ks.armor_problem(signature)


def test_an_armored_detached_signature_passes_the_armor_check():
    assert ks.armor_problem(ARMORED) is None


class Recorder:
    """A runner that answers like gpgv and keeps what it was asked and what the scratch files held."""

    def __init__(self, answer: tuple[int, str, str]) -> None:
        self.answer = answer
        self.argv: list[str] = []
        self.files: dict[str, bytes] = {}

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.argv = argv
        self.files = {Path(p).name: Path(p).read_bytes() for p in argv[-2:]}
        return self.answer


def test_gpgv_checks_a_copy_of_the_very_bytes_with_the_keyring_alone(tmp_path):
    keyring = tmp_path / "bundle" / "apt" / "kimi-bundle-archive.gpg"
    keyring.parent.mkdir(parents=True)
    keyring.write_bytes(b"key")
    run = Recorder((0, GOOD_A, ""))
    assert ks.verify_signature(b'{"m": 1}\n', ARMORED, keyring, A.lower(), run, "/usr/bin/gpgv") == A
    assert run.argv[:7] == ["/usr/bin/gpgv", "--homedir", run.argv[2], "--keyring", str(keyring), "--status-fd", "1"]
    assert run.files == {"kimi-bundle.json.asc": ARMORED, "kimi-bundle.json": b'{"m": 1}\n'}
    assert not Path(run.argv[2]).exists(), "the scratch GnuPG home is removed"


def test_a_missing_signature_or_keyring_is_refused_before_gpgv_runs(tmp_path):
    run = Recorder((0, GOOD_A, ""))
    with pytest.raises(SignatureError, match=r"kimi-bundle\.json\.asc is missing: the manifest is unsigned"):
        ks.verify_signature(b"{}", None, tmp_path / "k.gpg", A, run)
    with pytest.raises(SignatureError, match=re.escape(f"the keyring {tmp_path}/k.gpg does not exist")):
        ks.verify_signature(b"{}", ARMORED, tmp_path / "k.gpg", A, run)
    assert run.argv == []


def test_the_bundle_keyring_is_where_the_apt_step_exports_it():
    assert f"{kba.APT_DIR}/{kba.KEYRING_NAME}" == ks.BUNDLE_KEYRING
