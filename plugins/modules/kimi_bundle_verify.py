#!/usr/bin/python
"""Ansible module: check an air-gapped bundle on the host (signature by the pinned key, manifest, sizes, sha256)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_bundle_verify
short_description: Check a kimi.k2 bundle's signed manifest and every file of it before it is served
description:
  - Checks the bundle directory I(path), as C(bin/kimi-bundle build) wrote it, in this order, each step only
    after the one before it passed. The detached signature C(kimi-bundle.json.asc) over C(kimi-bundle.json),
    with C(gpgv) and I(keyring) alone in a scratch GnuPG home; it counts only when gpgv reports a valid
    signature by the key I(fingerprint) names. A keyring inside the bundle proves nothing by itself, which is
    why the fingerprint is required. Then the manifest (schema, files, totals). Then every file's size
    against the manifest, every file stat'ed before any is read, so a truncated file is named at once. Then,
    with I(checksums), every file's sha256.
  - Fails naming each file that differs (missing, truncated, changed, extra, a symlink leaving the bundle), or
    why the signature was refused, naming the pinned fingerprint and every fingerprint that did sign.
  - The manifest bytes gpgv checks are the bytes the manifest is read from (copied once into the scratch
    directory), so a manifest replaced during the check is never trusted.
  - The logic is plugins/module_utils/kimi_bundle_verify.py, kimi_bundle_signature.py and kimi_bundle_tree.py,
    standard library only, so the host's python3 needs nothing else. C(gpgv) comes with apt on every Debian
    and Ubuntu host.
  - Reads only; never reports a change.
options:
  path:
    description: The bundle's directory on the host (the one holding C(kimi-bundle.json)).
    type: path
    required: true
  fingerprint:
    description:
      - The signing key's fingerprint, 40 hex digits (spaces and case as C(gpg --fingerprint) prints them are
        fine), known to the operator from outside the bundle (C(bin/kimi-bundle fingerprint)).
      - A signature by a subkey of this key counts too.
    type: str
    required: true
  keyring:
    description:
      - The binary keyring (as C(gpg --export) writes it) gpgv checks the signature with.
      - Default, the bundle's own exported apt keyring, C(<path>/apt/kimi-bundle-archive.gpg).
    type: path
  checksums:
    description: Check every file's sha256 after its size; false stops at sizes (seconds instead of a full read).
    type: bool
    default: true
notes:
  - Needs C(gpgv) (Debian's gpgv package, which apt depends on).
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Check the staged bundle before it is served
  kimi_bundle_verify:
    path: /srv/kimi-bundle/releases/{{ manifest_sha256 }}
    fingerprint: "{{ offline_mirror_fingerprint }}"
  register: bundle

- name: Check the served bundle's sizes and signature only
  kimi_bundle_verify:
    path: /srv/kimi-bundle/current
    fingerprint: 2EF5 B607 163A 85FE C8C8  F7BD 01E2 C050 E168 3E6D
    checksums: false
"""

RETURN = r"""
signer:
  description: The pinned fingerprint, normalised, that signed the manifest.
  returned: success
  type: str
  sample: 2EF5B607163A85FEC8C8F7BD01E2C050E1683E6D
manifest_sha256:
  description: The sha256 of C(kimi-bundle.json) as checked.
  returned: success
  type: str
created_at:
  description: When the bundle was built (UTC, from the manifest).
  returned: success
  type: str
  sample: "2026-12-02T10:00:00Z"
built_for:
  description: What the bundle was built for, as the manifest records it (distribution, Python, pins, ...).
  returned: success
  type: dict
files:
  description: Regular files the manifest lists.
  returned: success
  type: int
symlinks:
  description: Symlinks the manifest lists.
  returned: success
  type: int
bytes:
  description: Bytes of the listed files, together.
  returned: success
  type: int
checksums:
  description: Whether every file's sha256 was checked (else sizes only).
  returned: always
  type: bool
problems:
  description: One line per file that differs from the manifest (empty on success).
  returned: always
  type: list
  elements: str
  sample: ["wheels/vllm-0.23.0-py3-none-any.whl: size 1234 bytes, the manifest says 3000 bytes"]
"""

from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_signature import normalise_fingerprint
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_tree import BundleError
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_verify import failure_message, verify_bundle


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "fingerprint": {"type": "str", "required": True},
            "keyring": {"type": "path"},
            "checksums": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    root = Path(params["path"])
    result: dict[str, Any] = {"changed": False, "checksums": params["checksums"], "problems": []}
    try:
        normalise_fingerprint(params["fingerprint"])
    except ValueError as error:
        module.fail_json(msg=f"fingerprint {error}", **result)
    gpgv = module.get_bin_path("gpgv", opt_dirs=["/usr/bin", "/bin"])
    if gpgv is None:
        module.fail_json(msg="gpgv is not installed (Debian's gpgv package, which apt depends on)", **result)

    def run(argv: list[str]) -> tuple[int, str, str]:
        # English status and messages whatever the host's locale: the verdict reads them.
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    keyring = Path(params["keyring"]) if params["keyring"] else None
    try:
        verdict = verify_bundle(root, params["fingerprint"], run, keyring, params["checksums"], gpgv)
    except (BundleError, OSError) as error:
        module.fail_json(msg=f"{root}: {error}", **result)
    result.update(verdict.result())
    if verdict.problems:
        module.fail_json(msg=failure_message(root, verdict.problems), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
