#!/usr/bin/python
"""Ansible module: a Hugging Face repository's files, sizes and checksums at a pinned revision."""

from __future__ import annotations

DOCUMENTATION = r"""
module: kimi_hf_repo_files
short_description: List a Hugging Face repository's files, sizes and checksums at a pinned revision
description:
  - Asks the Hub API (or a mirror such as olah, through its endpoint) for the repository's file tree at a
    revision, recursively, following pagination.
  - A revision must be a 40-hex commit sha unless I(allow_branch) is true; then a branch or tag is resolved to
    the commit it points at now, and that sha is returned, so everything after uses the commit.
  - Read-only; supports check mode. The token is sent as a header only and never returned or printed.
options:
  repo_id: {description: Repository id (org/name)., type: str, required: true}
  revision: {description: Commit sha (or a branch/tag with allow_branch)., type: str, required: true}
  endpoint: {description: Hub or mirror base URL., type: str, default: https://huggingface.co}
  token: {description: Access token (from Vault)., type: str}
  allow_branch: {description: Accept a branch or tag and resolve it to a sha., type: bool, default: false}
  include: {description: Glob patterns to keep (all when empty)., type: list, elements: str, default: []}
  exclude: {description: Glob patterns to drop., type: list, elements: str, default: []}
  timeout: {description: Seconds per HTTP request., type: int, default: 60}
author: Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Resolve the checkpoint's files
  kimi_hf_repo_files:
    repo_id: moonshotai/Kimi-K2-Instruct
    revision: 0123456789abcdef0123456789abcdef01234567
    token: "{{ vault_hf_token }}"
  no_log: true
"""

RETURN = r"""
revision: {description: The commit sha the files are listed at., type: str, returned: success}
resolved_from: {description: The branch or tag given, when one was resolved; else null., type: str, returned: success}
files: {description: "Selected files: path, size, sha256 (LFS) and git_oid.", type: list, returned: success}
file_count: {description: Number of selected files., type: int, returned: success}
total_bytes: {description: Sum of the selected files' sizes., type: int, returned: success}
"""

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict

from ansible.module_utils.basic import AnsibleModule

try:  # a checkout (ansible.cfg: module_utils = plugins/module_utils): its code, never an installed copy's
    from ansible.module_utils.kimi_checkpoint import files_from_tree, is_commit_sha, select_files
except ImportError:  # installed as the kimi.k2 collection
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint import (
        files_from_tree,
        is_commit_sha,
        select_files,
    )

NEXT_LINK = re.compile(r'<([^>]+)>;\s*rel="next"')


class HubError(Exception):
    pass


def _get(url: str, token: str | None, timeout: int) -> tuple[object, str | None]:
    request = urllib.request.Request(url, headers={"User-Agent": "kimi-checkpoint"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response), response.headers.get("Link")


def _explain(error: urllib.error.HTTPError, what: str, has_token: bool) -> str:
    token_state = "a token was sent" if has_token else "no token was sent"
    if error.code in (401, 403, 404):
        return (
            f"{what}: HTTP {error.code}: the repository or revision does not exist, or it is private/gated and "
            f"the token is missing or wrong ({token_state})"
        )
    return f"{what}: HTTP {error.code} {error.reason}"


def resolve_sha(endpoint: str, repo_id: str, revision: str, token: str | None, timeout: int) -> str:
    url = f"{endpoint}/api/models/{repo_id}/revision/{urllib.parse.quote(revision, safe='')}"
    try:
        info, _ = _get(url, token, timeout)
    except urllib.error.HTTPError as error:
        raise HubError(_explain(error, f"resolving revision {revision!r} of {repo_id}", bool(token))) from None
    sha = info.get("sha") if isinstance(info, dict) else None
    if not is_commit_sha(sha or ""):
        raise HubError(f"resolving revision {revision!r} of {repo_id}: the Hub returned no commit sha")
    return sha


def list_tree(endpoint: str, repo_id: str, sha: str, token: str | None, timeout: int) -> list[dict]:
    url = f"{endpoint}/api/models/{repo_id}/tree/{sha}?recursive=true&expand=false"
    entries: list[dict] = []
    while url:
        try:
            page, link = _get(url, token, timeout)
        except urllib.error.HTTPError as error:
            raise HubError(_explain(error, f"listing {repo_id} at revision {sha}", bool(token))) from None
        if not isinstance(page, list):
            raise HubError(f"listing {repo_id} at revision {sha}: unexpected answer from {endpoint}")
        entries.extend(page)
        found = NEXT_LINK.search(link or "")
        url = found.group(1) if found else ""
    return entries


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "repo_id": {"type": "str", "required": True},
            "revision": {"type": "str", "required": True},
            "endpoint": {"type": "str", "default": "https://huggingface.co"},
            "token": {"type": "str", "no_log": True},
            "allow_branch": {"type": "bool", "default": False},
            "include": {"type": "list", "elements": "str", "default": []},
            "exclude": {"type": "list", "elements": "str", "default": []},
            "timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    params = module.params
    endpoint = params["endpoint"].rstrip("/")
    revision, token = params["revision"], params["token"] or None
    resolved_from = None
    try:
        if not is_commit_sha(revision):
            if not params["allow_branch"]:
                module.fail_json(
                    msg=f"checkpoint revision {revision!r} is not a 40-hex commit sha: pin a commit, or set "
                    "checkpoint_allow_branch: true to resolve a branch or tag (the sha it resolves to is recorded)"
                )
            resolved_from = revision
            revision = resolve_sha(endpoint, params["repo_id"], revision, token, params["timeout"])
        entries = list_tree(endpoint, params["repo_id"], revision, token, params["timeout"])
    except HubError as error:
        module.fail_json(msg=str(error))
    except (urllib.error.URLError, OSError, ValueError) as error:
        module.fail_json(msg=f"cannot reach the Hub at {endpoint}: {error}")
    files = select_files(files_from_tree(entries), params["include"], params["exclude"])
    if not files:
        module.fail_json(msg=f"{params['repo_id']} at {revision}: no file matches the include/exclude patterns")
    module.exit_json(
        changed=False,
        revision=revision,
        resolved_from=resolved_from,
        files=[asdict(f) for f in files],
        file_count=len(files),
        total_bytes=sum(f.size for f in files),
    )


if __name__ == "__main__":
    main()
