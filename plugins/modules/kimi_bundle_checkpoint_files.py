#!/usr/bin/python
"""Ansible module: the checkpoint files an air-gapped bundle carries, listed from the manifest the mirror serves."""

from __future__ import annotations

DOCUMENTATION = r"""
module: kimi_bundle_checkpoint_files
short_description: List the checkpoint files an air-gapped bundle carries, each with its URL on the offline mirror
description:
  - GETs the bundle's manifest (C(kimi-bundle.json)) from the offline mirror at I(mirror_url) and lists the files
    of the checkpoint it carries (under C(hf/ORG/NAME/resolve/SHA/) in the bundle), in the shape
    C(kimi_hf_repo_files) gives for the Hub (C(path), C(size), C(sha256)), selected by I(include) and I(exclude),
    each with the plain URL the mirror serves it at.
  - The checkpoint role downloads exactly these files with plain GETs and checks every size and sha256 against
    this list; nothing imitates the Hub's API, so an hf client upgrade never touches an air-gapped converge
    (docs/air-gapped.md). The mirror host verified the manifest's signature against the pinned key before serving
    it (C(kimi_bundle_verify)); this module checks its shape, and that it carries I(repo_id) at I(revision).
  - Fails naming what is wrong when the mirror does not answer, the manifest is not one this collection reads, the
    bundle carries no checkpoint or another one, or the patterns select no file.
  - Written by hand because the manifest is this collection's own format. Standard library only (plus
    ansible-core's C(fetch_url)), as it runs on a node. Logic in plugins/module_utils/kimi_bundle_checkpoint.py.
  - Read-only; supports check mode.
options:
  mirror_url:
    description: The offline mirror's root URL, ending with a slash (C(kimi_offline_mirror_url)).
    type: str
    required: true
  manifest_name:
    description: The manifest's file name at the mirror's root.
    type: str
    default: kimi-bundle.json
  repo_id: {description: The checkpoint's repository id (org/name) the inventory pins., type: str, required: true}
  revision: {description: The 40-hex commit the inventory pins., type: str, required: true}
  include: {description: Glob patterns to keep (all when empty)., type: list, elements: str, default: []}
  exclude: {description: Glob patterns to drop., type: list, elements: str, default: []}
  timeout: {description: Seconds for the manifest's GET., type: int, default: 60}
author: Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: List the checkpoint's files from the offline mirror's manifest
  kimi.k2.kimi_bundle_checkpoint_files:
    mirror_url: http://198.18.0.11:8081/
    repo_id: moonshotai/Kimi-K2-Instruct
    revision: 0123456789abcdef0123456789abcdef01234567
"""

RETURN = r"""
revision: {description: The commit the files are listed at (I(revision))., type: str, returned: success}
resolved_from:
  description: Always null (a bundle pins a commit); kept for the Hub listing's shape.
  type: str
  returned: success
files:
  description: The selected files, each with its path, size, sha256 and the URL the mirror serves it at.
  type: list
  elements: dict
  returned: success
file_count: {description: Number of selected files., type: int, returned: success}
total_bytes: {description: Sum of the selected files' sizes., type: int, returned: success}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_checkpoint import (
    BundleCheckpointError,
    bundle_listing,
    file_url,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_tree import ManifestError

ARGUMENT_SPEC = {
    "mirror_url": {"type": "str", "required": True},
    "manifest_name": {"type": "str", "default": "kimi-bundle.json"},
    "repo_id": {"type": "str", "required": True},
    "revision": {"type": "str", "required": True},
    "include": {"type": "list", "elements": "str", "default": []},
    "exclude": {"type": "list", "elements": "str", "default": []},
    "timeout": {"type": "int", "default": 60},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    mirror = params["mirror_url"] if params["mirror_url"].endswith("/") else params["mirror_url"] + "/"
    url = mirror + params["manifest_name"]
    response, info = fetch_url(module, url, timeout=params["timeout"])
    if response is None or int(info.get("status", -1)) != 200:
        module.fail_json(
            msg=f"{url} did not answer with the bundle's manifest ({info.get('msg', 'no answer')}): the offline "
            "mirror serves no bundle this node can read, so the checkpoint cannot be fetched from it"
        )
    try:
        listing = bundle_listing(
            response.read().decode("utf-8"),
            params["repo_id"],
            params["revision"],
            params["include"],
            params["exclude"],
        )
    except (ManifestError, BundleCheckpointError, UnicodeDecodeError) as error:
        module.fail_json(msg=f"{url}: {error}")
    for item in listing["files"]:
        item["url"] = file_url(mirror, params["repo_id"], params["revision"], item["path"])
    module.exit_json(changed=False, **listing)


if __name__ == "__main__":
    main()
