"""`kimi.k2.hf_mirror_headers` (plugins/filter/kimi_bundle.py): the rows the offline mirror's nginx maps are
rendered from, one per file of the bundled tree listing, with kimi_hf_headers.file_headers' values."""

from __future__ import annotations

import importlib.util

from tests.paths import REPO_ROOT

spec = importlib.util.spec_from_file_location("kimi_bundle_filter", REPO_ROOT / "plugins" / "filter" / "kimi_bundle.py")
assert spec is not None and spec.loader is not None
bundle_filter = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bundle_filter)

REPO, SHA = "moonshotai/Kimi-K2-Instruct", "a" * 40
SHARD_SHA256 = "b" * 64
TREE = [
    {"type": "directory", "path": "sub", "oid": "0" * 40},
    {"type": "file", "path": "config.json", "size": 10, "oid": "1" * 40},
    {"type": "file", "path": "model.safetensors", "size": 7, "oid": "2" * 40, "lfs": {"oid": SHARD_SHA256, "size": 99}},
    {"type": "file", "path": "sub/odd name.txt", "size": 3, "oid": "3" * 40},
    {"type": "file", "path": 'bad"quote.txt', "size": 3, "oid": "4" * 40},
    {"type": "file", "path": "bad\\slash.txt", "size": 3, "oid": "5" * 40},
]


def test_one_row_per_file_the_lfs_sha256_before_the_blob_id_and_the_lfs_size():
    rows = bundle_filter.FilterModule().filters()["hf_mirror_headers"](TREE, REPO, SHA)
    base = f"/hf/{REPO}/resolve/{SHA}"
    assert rows == [
        {"uri": f"{base}/config.json", "etag": f'"{"1" * 40}"', "size": "10"},
        {"uri": f"{base}/model.safetensors", "etag": f'"{SHARD_SHA256}"', "size": "99"},
        # $uri is percent-decoded: the key is the path as it is.
        {"uri": f"{base}/sub/odd name.txt", "etag": f'"{"3" * 40}"', "size": "3"},
    ]


def test_the_prefix_is_where_the_mirror_serves_the_layout():
    rows = bundle_filter.hf_mirror_headers(TREE[:2], REPO, SHA, "")
    assert [row["uri"] for row in rows] == [f"/{REPO}/resolve/{SHA}/config.json"]


def test_a_path_too_long_for_the_roles_map_buckets_gets_no_row():
    from ansible_collections.kimi.k2.plugins.module_utils import kimi_hf_headers as kbh

    fits = "a" * (kbh.NGINX_MAP_KEY_LIMIT - len(f"/hf/{REPO}/resolve/{SHA}/"))
    tree = [{"type": "file", "path": name, "size": 1, "oid": "1" * 40} for name in (fits, fits + "b")]
    rows = bundle_filter.hf_mirror_headers(tree, REPO, SHA)
    assert [len(row["uri"]) for row in rows] == [kbh.NGINX_MAP_KEY_LIMIT]
    template = (REPO_ROOT / "roles/offline_mirror/templates/kimi-bundle.conf.j2").read_text()
    assert f"map_hash_bucket_size {kbh.NGINX_MAP_BUCKET};" in template
