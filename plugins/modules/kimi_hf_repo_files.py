#!/usr/bin/python
"""Ansible module: a Hugging Face repository's files, sizes and checksums at a pinned revision."""

from __future__ import annotations

DOCUMENTATION = r"""
module: kimi_hf_repo_files
short_description: List a Hugging Face repository's files, sizes and checksums at a pinned revision
description:
  - Asks the Hub API (or a mirror such as olah, through its endpoint) for the repository's file tree at a
    revision, recursively, following pagination.
  - Requests go through ansible-core's C(fetch_url), on the host the task runs on (the role runs it once, on
    its first node, with that node's default interpreter), so the environment's proxies (C(https_proxy),
    C(no_proxy)) and the system CA bundle apply, certificates are validated, and refused or timed-out
    connections, HTTP 429 and 5xx are asked again (3 attempts, at most 30 s apart). The Hub's error code (e.g.
    GatedRepo, RevisionNotFound) is added to the failure message.
  - Not huggingface_hub's HfApi, because this list is needed before the role installs the pinned hf CLI venv
    (C(/opt/kimi-hf/VERSION)) on a node, and in check mode that venv is never installed; the list sizes the
    missing bytes against the free space before anything is installed or downloaded. The hf CLI then downloads
    exactly these files with huggingface_hub, and every file is verified against the sizes and checksums
    listed here.
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

import http.client
import json
import time
import urllib.parse
from dataclasses import asdict

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url
from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint import (
    explain_hub_error,
    files_from_tree,
    hub_retry_delay,
    is_commit_sha,
    next_page,
    select_files,
)


class HubError(Exception):
    """The Hub answered, with an error or with something that is not the expected JSON."""


class HubUnreachableError(Exception):
    """No HTTP answer (refused, reset, timed out, a proxy or DNS failure), after the retries."""


def _get(module: AnsibleModule, url: str, what: str, token: str | None, timeout: int) -> tuple[object, str | None]:
    """The JSON answer of a GET and its Link header, retrying what hub_retry_delay says is worth retrying."""
    headers = {"User-Agent": "kimi-checkpoint", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    attempt = 1
    while True:
        response, info = fetch_url(module, url, headers=headers, timeout=timeout)
        status = int(info.get("status", -1))
        if 200 <= status < 300 and response is not None:
            try:
                body = response.read()
            except OSError as error:  # the connection broke mid-answer: as if no answer came
                status, info = -1, {"msg": f"Connection failure: {error}"}
            else:
                try:
                    return json.loads(body), info.get("link")
                except ValueError as error:
                    raise HubError(f"{what}: unexpected answer from {url.split('?')[0]}: {error}") from None
        delay = hub_retry_delay(attempt, status, info.get("retry-after"))
        if delay is None:
            break
        time.sleep(delay)
        attempt += 1
    if status < 100:
        raise HubUnreachableError(f"{info.get('msg', 'no answer')} (after {attempt} attempt(s))")
    reason = http.client.responses.get(status, str(info.get("msg", "")))
    error_code, error_message = info.get("x-error-code"), info.get("x-error-message")
    raise HubError(explain_hub_error(what, status, reason, bool(token), error_code, error_message))


def resolve_sha(
    module: AnsibleModule, endpoint: str, repo_id: str, revision: str, token: str | None, timeout: int
) -> str:
    url = f"{endpoint}/api/models/{repo_id}/revision/{urllib.parse.quote(revision, safe='')}"
    what = f"resolving revision {revision!r} of {repo_id}"
    info, _ = _get(module, url, what, token, timeout)
    sha = info.get("sha") if isinstance(info, dict) else None
    if not is_commit_sha(sha or ""):
        raise HubError(f"{what}: the Hub returned no commit sha")
    return sha


def list_tree(
    module: AnsibleModule, endpoint: str, repo_id: str, sha: str, token: str | None, timeout: int
) -> list[dict]:
    url: str | None = f"{endpoint}/api/models/{repo_id}/tree/{sha}?recursive=true&expand=false"
    what = f"listing {repo_id} at revision {sha}"
    entries: list[dict] = []
    while url:
        page, link = _get(module, url, what, token, timeout)
        if not isinstance(page, list):
            raise HubError(f"{what}: unexpected answer from {endpoint}")
        entries.extend(page)
        url = next_page(link)
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
                    "kimi_checkpoint_allow_branch: true to resolve a branch or tag (the sha it resolves to is recorded)"
                )
            resolved_from = revision
            revision = resolve_sha(module, endpoint, params["repo_id"], revision, token, params["timeout"])
        entries = list_tree(module, endpoint, params["repo_id"], revision, token, params["timeout"])
    except HubError as error:
        module.fail_json(msg=str(error))
    except HubUnreachableError as error:
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
