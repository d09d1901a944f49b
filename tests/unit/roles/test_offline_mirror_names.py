"""The offline_mirror role names the bundle's files the way the code that writes and checks them does."""

from __future__ import annotations

import yaml
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_signature as ks
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_tree as kbt

from tests import paths

ROLE = paths.REPO_ROOT / "roles" / "offline_mirror"


def test_the_role_names_the_manifest_and_the_keyring_as_the_bundle_has_them():
    kimi_vars = yaml.safe_load((paths.REPO_ROOT / "roles" / "kimi" / "vars" / "main.yml").read_text())
    assert kimi_vars["kimi_bundle_manifest_name"] == kbt.MANIFEST_NAME
    assert kimi_vars["kimi_bundle_keyring_path"] == ks.BUNDLE_KEYRING


def test_the_site_serves_the_current_release_read_only_without_listings():
    site = (ROLE / "templates" / "kimi-bundle.conf.j2").read_text()
    for directive in ("root {{ offline_mirror_current }};", "autoindex off;", "sendfile on;", "limit_except GET {"):
        assert directive in site
