"""The pure parts of the bundle's checkpoint step: the layout's paths, reading and narrowing the tree listing, and
the reuse decisions.

fetch_checkpoint itself runs against a fake Hub, the lab's olah and a static Hub stand-in in
tests/local/test_bundle_hf.py.
"""

from __future__ import annotations

import hashlib
import re

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint import RepoFile
from kimi_tools import kimi_bundle_hf as kbh
from kimi_tools.kimi_bundle_hf import CheckpointFetchError, Digest, LayoutFile

REPO = "moonshotai/Kimi-K2-Instruct"
SHA = "60877af7bde655c71406a1843bcc395afa52fb57"
SHA256 = "9be78edb5b928eba33aa88f431551348f7466ba9f5ef3daf1d552398722a5436"
OID = "2f9618c3a19b9a61add74f70bfb121335aeef666"
SHARD = {
    "type": "file",
    "path": "model-00001-of-00061.safetensors",
    "size": 135,
    "oid": "64eaa9c526867e404b68f2c5d66fd78e27026523",
    "lfs": {"oid": SHA256, "size": 4_998_000_000, "pointerSize": 135},
    "xetHash": "a" * 64,
}
CONFIG = {"type": "file", "path": "config.json", "size": 8, "oid": OID}
DOCS = {"type": "directory", "path": "docs", "size": 0, "oid": "aa536c4ea18073388b5b0bc791057a7296a00398"}
DEPLOY = {"type": "file", "path": "docs/deploy.md", "size": 5, "oid": "226b0752cac7789c48f0cb3ec53eda48b7be36cc"}
FIGURES = {"type": "directory", "path": "figures", "size": 0, "oid": "bb536c4ea18073388b5b0bc791057a7296a00398"}
FIGURE = {"type": "file", "path": "figures/bench.png", "size": 7, "oid": "336b0752cac7789c48f0cb3ec53eda48b7be36cc"}
ENTRIES = [CONFIG, DOCS, FIGURES, SHARD, DEPLOY, FIGURE]


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


# ---------------------------------------------------------------------------------------------- the layout


def test_the_layout_is_the_paths_the_clients_ask_for():
    assert kbh.revision_path(REPO, SHA) == f"api/models/{REPO}/revision/{SHA}"
    assert kbh.tree_path(REPO, SHA) == f"api/models/{REPO}/tree/{SHA}"
    assert kbh.resolve_path(REPO, SHA, "sub/a b.json") == f"{REPO}/resolve/{SHA}/sub/a b.json"
    # As hf_hub_url quotes it: the path percent-encoded, its slashes kept.
    assert kbh.resolve_url("http://m:8090", REPO, SHA, "sub/a b.json") == (
        f"http://m:8090/{REPO}/resolve/{SHA}/sub/a%20b.json"
    )
    # As kimi_hf_repo_files and HfApi.list_repo_tree ask it.
    assert kbh.tree_url("http://m", REPO, SHA) == f"http://m/api/models/{REPO}/tree/{SHA}?recursive=true&expand=false"
    assert kbh.revision_url("http://m/hf", REPO, SHA) == f"http://m/hf/api/models/{REPO}/revision/{SHA}"


# ------------------------------------------------------------------------------------------------ the tree


def test_pages_merge_into_one_listing_in_order():
    assert kbh.merge_pages([[CONFIG, DOCS], [SHARD], []]) == [CONFIG, DOCS, SHARD]


@pytest.mark.parametrize(
    ("pages", "message"),
    [
        ([{"path": "x"}], "tree page 1 is not a JSON array"),
        ([[CONFIG], [{"type": "file"}]], "tree page 2 has an entry without a path"),
        ([[CONFIG], [CONFIG]], "tree page 2 lists config.json again (overlapping pages)"),
    ],
)
def test_pages_that_cannot_be_one_listing_are_refused(pages, message):
    with pytest.raises(CheckpointFetchError, match=re.escape(message)):
        kbh.merge_pages(pages)


def test_files_are_selected_as_the_role_selects_them():
    files = kbh.checked_files(ENTRIES, [], ["figures/*"])
    assert [f.path for f in files] == ["config.json", "docs/deploy.md", "model-00001-of-00061.safetensors"]
    shard = files[2]
    # The LFS content's size and sha256, not the pointer's; its git oid is the pointer's, so not kept.
    assert (shard.size, shard.sha256, shard.git_oid) == (4_998_000_000, SHA256, None)
    assert files[0] == RepoFile("config.json", 8, None, OID)


def test_a_listing_with_a_path_leaving_the_repository_or_nothing_selected_is_refused():
    escaping = [{**CONFIG, "path": "../../etc/passwd"}, {**CONFIG, "path": "/abs"}]
    with pytest.raises(CheckpointFetchError, match=r"outside the repository: \.\./\.\./etc/passwd, /abs"):
        kbh.checked_files(escaping, [], [])
    with pytest.raises(CheckpointFetchError, match="no file of the tree listing matches"):
        kbh.checked_files(ENTRIES, ["*.bin"], [])
    with pytest.raises(CheckpointFetchError, match="malformed file entry"):
        kbh.checked_files([{"type": "file", "path": "x", "size": "big"}], [], [])


def test_the_served_tree_holds_the_selection_and_its_folders_without_xet_hashes():
    files = kbh.checked_files(ENTRIES, [], ["figures/*"])
    served = kbh.servable_tree(ENTRIES, files)
    paths = [entry["path"] for entry in served]
    assert paths == ["config.json", "docs", "model-00001-of-00061.safetensors", "docs/deploy.md"]
    shard = served[2]
    assert "xetHash" not in shard
    assert shard == {key: value for key, value in SHARD.items() if key != "xetHash"}
    assert "xetHash" in SHARD  # the source's entry is left as it was


def test_a_folder_deep_in_the_tree_is_kept_for_a_selected_file_below_it():
    entries = [
        {"type": "directory", "path": "a", "oid": "1" * 40},
        {"type": "directory", "path": "a/b", "oid": "2" * 40},
        {"type": "directory", "path": "c", "oid": "3" * 40},
        {"type": "file", "path": "a/b/w.bin", "size": 1, "oid": "4" * 40},
    ]
    served = kbh.servable_tree(entries, kbh.checked_files(entries, [], []))
    assert [entry["path"] for entry in served] == ["a", "a/b", "a/b/w.bin"]


def test_the_served_revision_keeps_the_answer_and_narrows_siblings():
    info = {"id": REPO, "sha": SHA, "siblings": [{"rfilename": "config.json"}, {"rfilename": "figures/bench.png"}]}
    served = kbh.servable_revision(info, kbh.checked_files(ENTRIES, [], ["figures/*"]))
    assert served == {"id": REPO, "sha": SHA, "siblings": [{"rfilename": "config.json"}]}
    assert len(info["siblings"]) == 2
    assert kbh.servable_revision({"sha": SHA}, []) == {"sha": SHA}


def test_a_served_document_is_compact_json_in_the_sources_key_order():
    assert kbh.json_document({"sha": SHA, "b": "é", "a": 1}) == f'{{"sha":"{SHA}","b":"é","a":1}}\n'.encode()


# ------------------------------------------------------------------------------------------------- reuse


LFS_FILE = RepoFile("model.safetensors", 10, sha256="f" * 64)
GIT_FILE = RepoFile("config.json", 10, git_oid="a" * 40)


def test_a_local_copy_matches_on_size_and_the_hubs_checksum_only():
    assert kbh.content_matches(LFS_FILE, Digest(10, "f" * 64))
    assert not kbh.content_matches(LFS_FILE, Digest(11, "f" * 64))
    assert not kbh.content_matches(LFS_FILE, Digest(10, "e" * 64, git_oid="a" * 40))
    assert kbh.content_matches(GIT_FILE, Digest(10, "0" * 64, git_oid="a" * 40))
    # Hashed without the git id (an LFS candidate): it cannot vouch for a plain file.
    assert not kbh.content_matches(GIT_FILE, Digest(10, "0" * 64))
    assert not kbh.content_matches(RepoFile("x", 10), Digest(10, "0" * 64, git_oid="a" * 40))
    assert not kbh.content_matches(LFS_FILE, None)


def test_downloaded_bytes_are_judged_by_size_then_checksum():
    assert kbh.content_problem(LFS_FILE, Digest(9, "f" * 64)) == "9 bytes, the tree lists 10"
    assert kbh.content_problem(LFS_FILE, Digest(10, "e" * 64)) == f"sha256 {'e' * 64}, the tree lists {'f' * 64}"
    assert kbh.content_problem(GIT_FILE, Digest(10, "e" * 64, "b" * 40)) == (
        f"git blob id {'b' * 40}, the tree lists {'a' * 40}"
    )
    assert kbh.content_problem(GIT_FILE, Digest(10, "e" * 64, "a" * 40)) is None
    # Nothing to check but the size: the size decides.
    assert kbh.content_problem(RepoFile("x", 10), Digest(10, "e" * 64)) is None


def test_candidates_are_the_same_size_files_the_target_first():
    sizes = {"/old/b": 10, "/new/target": 10, "/old/a": 10, "/old/small": 9}
    assert kbh.reuse_candidates(LFS_FILE, "/new/target", sizes) == ["/new/target", "/old/a", "/old/b"]
    assert kbh.reuse_candidates(LFS_FILE, "/elsewhere", {"/old/small": 9}) == []


def test_a_partial_download_is_named_by_its_checksum():
    assert kbh.partial_name(LFS_FILE, SHA) == f"{'f' * 64}.part"
    assert kbh.partial_name(GIT_FILE, SHA) == f"{'a' * 40}.part"
    unknown = kbh.partial_name(RepoFile("x/y", 1), SHA)
    assert unknown == f"{hashlib.sha256(f'{SHA}/x/y'.encode()).hexdigest()}.part"
    assert unknown != kbh.partial_name(RepoFile("x/y", 1), "1" * 40)


def test_files_with_the_same_bytes_are_downloaded_once():
    twin = RepoFile("sub/config.json", 10, git_oid="a" * 40)
    unknown = [RepoFile("x", 1), RepoFile("y", 1)]
    groups = kbh.download_groups([GIT_FILE, LFS_FILE, twin, *unknown], SHA)
    assert groups == [[GIT_FILE, twin], [LFS_FILE], [unknown[0]], [unknown[1]]]


def test_what_the_layout_holds_for_another_revision_is_unwanted():
    present = [f"{REPO}/resolve/{'1' * 40}/a", f"{REPO}/resolve/{SHA}/a", f"api/models/{REPO}/tree/{'1' * 40}"]
    assert kbh.unwanted_paths(present, [f"{REPO}/resolve/{SHA}/a"]) == [
        f"api/models/{REPO}/tree/{'1' * 40}",
        f"{REPO}/resolve/{'1' * 40}/a",
    ]


def test_the_content_range_gives_where_a_206_starts():
    assert kbh.content_range_start("bytes 100-199/200") == 100
    assert kbh.content_range_start("bytes 0-0/*") == 0
    assert kbh.content_range_start(None) is None
    assert kbh.content_range_start("items 1-2/3") is None


def test_one_read_gives_sha256_and_git_blob_id(tmp_path):
    data = b"hello, bundle\n" * 1000
    path = tmp_path / "f"
    path.write_bytes(data)
    assert kbh.digest_file(path, with_git_oid=True) == Digest(
        len(data), hashlib.sha256(data).hexdigest(), blob_id(data)
    )
    assert kbh.digest_file(path, with_git_oid=False) == Digest(len(data), hashlib.sha256(data).hexdigest(), None)


def test_the_manifest_entries_are_the_layouts_files_under_the_prefix_sorted():
    fetch = kbh.CheckpointFetch(
        repo_id=REPO,
        revision=SHA,
        files=(LayoutFile(f"{REPO}/resolve/{SHA}/b", 2, "b" * 64, kbh.FETCHED, "b"),),
        documents=(LayoutFile(f"api/models/{REPO}/tree/{SHA}", 3, "c" * 64, kbh.KEPT),),
        repo_files=(),
        fetched_bytes=2,
        resumed_bytes=0,
        reused_bytes=0,
        removed=(),
    )
    assert fetch.manifest_entries() == [
        {"path": f"hf/api/models/{REPO}/tree/{SHA}", "size": 3, "sha256": "c" * 64},
        {"path": f"hf/{REPO}/resolve/{SHA}/b", "size": 2, "sha256": "b" * 64},
    ]
    assert fetch.manifest_entries("")[0]["path"] == f"api/models/{REPO}/tree/{SHA}"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("http://m", "not a repo", SHA), "is not a Hub repository id"),
        (("http://m", REPO, "main"), "is not a 40-hex commit sha"),
        (("ftp://m", REPO, SHA), "is not an http(s) URL"),
    ],
)
def test_fetch_refuses_bad_arguments_before_asking_anything(tmp_path, arguments, message):
    with pytest.raises(CheckpointFetchError, match=re.escape(message)):
        kbh.fetch_checkpoint(*arguments, [], [], tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
