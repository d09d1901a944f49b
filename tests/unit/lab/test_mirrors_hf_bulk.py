"""labctl.mirrors_hf_bulk and `lab/lab bulk-checkpoint`: --gib validation, repository names, the shard plan, the
safetensors headers and index, and a real (1 MiB) build committed with git."""

from __future__ import annotations

import json
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from labctl import _cache, cli, mirrors_hf, mirrors_hf_bulk
from labctl.mirrors_hf_bulk import HEADER_BYTES, MIB, SHARD_MAX_BYTES

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.mark.parametrize(
    ("text", "gib"), [("2", Decimal(2)), ("0.5", Decimal("0.5")), ("2.000", Decimal(2)), ("0.001", Decimal("0.001"))]
)
def test_parse_gib_accepts_positive_numbers_with_up_to_3_decimals(text, gib):
    assert mirrors_hf_bulk.parse_gib(text) == gib


@pytest.mark.parametrize("text", ["0", "-1", "0.0004", "0.1234", "65", "two", "", "nan", "inf", "1/2", "0x10"])
def test_parse_gib_rejects_everything_else_saying_what_it_wants(text):
    with pytest.raises(ValueError, match=r"--gib must be a number of GiB from 0\.001 to 64") as raised:
        mirrors_hf_bulk.parse_gib(text)
    assert repr(text) in str(raised.value)


@pytest.mark.parametrize(
    ("text", "name", "total"),
    [
        ("2", "Kimi-K2-bulk-2GiB", 2 << 30),
        ("2.0", "Kimi-K2-bulk-2GiB", 2 << 30),
        ("0.5", "Kimi-K2-bulk-0.5GiB", 512 * MIB),
        ("20", "Kimi-K2-bulk-20GiB", 20 << 30),  # not "2E+1GiB"
        ("0.001", "Kimi-K2-bulk-0.001GiB", 1073742),  # rounded to a whole byte
    ],
)
def test_one_name_and_size_per_amount(text, name, total):
    gib = mirrors_hf_bulk.parse_gib(text)
    assert mirrors_hf_bulk.repo_name(gib) == name
    assert mirrors_hf_bulk.repo_id(gib) == f"kimi-lab/{name}"
    assert mirrors_hf_bulk.shard_bytes_total(gib) == total


def test_shard_plan_splits_into_equal_shards_of_at_most_the_maximum():
    plan = mirrors_hf_bulk.shard_plan(2 << 30)
    assert len(plan) == (2 << 30) // SHARD_MAX_BYTES
    assert plan[0] == (f"model-00001-of-{len(plan):05d}.safetensors", SHARD_MAX_BYTES)
    assert plan[-1][0] == f"model-{len(plan):05d}-of-{len(plan):05d}.safetensors"
    assert {size for _, size in plan} == {SHARD_MAX_BYTES}


def test_shard_plan_spreads_a_remainder_over_the_first_shards():
    plan = mirrors_hf_bulk.shard_plan(10_003, max_shard=5_000)
    assert [size for _, size in plan] == [3335, 3334, 3334]
    assert [name for name, _ in plan] == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]


def test_shard_plan_of_less_than_the_maximum_is_one_shard():
    assert mirrors_hf_bulk.shard_plan(MIB) == [("model-00001-of-00001.safetensors", MIB)]


def test_shard_plan_refuses_a_size_without_room_for_the_header():
    with pytest.raises(ValueError, match="at least"):
        mirrors_hf_bulk.shard_plan(8 + HEADER_BYTES - 1)


def test_shard_header_is_a_safetensors_header_for_the_rest_of_the_file(tmp_path):
    path = tmp_path / "shard.safetensors"
    path.write_bytes(mirrors_hf_bulk.shard_header(3, 8 + HEADER_BYTES + 100) + bytes(100))
    header = mirrors_hf.read_safetensors_header(path)
    assert header == {"bulk.shard_00003.data": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]}}
    assert len(mirrors_hf_bulk.shard_header(1, 64 << 30)) == 8 + HEADER_BYTES  # fixed, whatever the size


def test_random_blocks_are_deterministic_and_differ_between_blocks_and_shards():
    block = mirrors_hf_bulk.random_block(1, 0, 4096)
    assert block == mirrors_hf_bulk.random_block(1, 0, 4096)
    assert block[:100] == mirrors_hf_bulk.random_block(1, 0, 100)  # a short last block is the block's prefix
    assert block not in (mirrors_hf_bulk.random_block(1, 1, 4096), mirrors_hf_bulk.random_block(2, 0, 4096))


def test_weight_index_maps_each_tensor_to_its_shard():
    plan = [("model-00001-of-00002.safetensors", 1000), ("model-00002-of-00002.safetensors", 900)]
    index = mirrors_hf_bulk.weight_index(plan)
    assert index["metadata"]["total_size"] == 1900 - 2 * (8 + HEADER_BYTES)
    assert index["weight_map"] == {
        "bulk.shard_00001.data": "model-00001-of-00002.safetensors",
        "bulk.shard_00002.data": "model-00002-of-00002.safetensors",
    }


def test_bad_gib_is_one_line_and_exit_2_before_anything_is_touched(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("KIMI_LAB_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("KIMI_LAB_CACHE", str(tmp_path / "cache"))
    assert cli.main(["bulk-checkpoint", "--gib", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gib must be a number of GiB" in err
    with pytest.raises(SystemExit) as exited:
        cli.main(["bulk-checkpoint"])
    assert exited.value.code == 2
    assert "--gib" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------------------------------ a real build


@pytest.fixture
def built(tmp_path) -> dict:
    return mirrors_hf_bulk.build(tmp_path / "cache", Decimal("0.001"))


@needs_git
def test_build_commits_config_index_and_shards(built, tmp_path):
    assert built["repo_id"] == "kimi-lab/Kimi-K2-bulk-0.001GiB"
    shard = "model-00001-of-00001.safetensors"
    assert set(built["files"]) == {"config.json", "model.safetensors.index.json", shard}
    assert built["files"][shard] == 1073742
    assert built["total_bytes"] == sum(built["files"].values())
    repo = tmp_path / "cache" / "hf-bulk" / "mirrors" / "models" / "kimi-lab" / "Kimi-K2-bulk-0.001GiB"
    assert repo.is_symlink() and repo.resolve().parent.parent.parent == Path(built["mirrors_path"])
    git = ["git", "-C", str(repo)]
    tree = subprocess.run([*git, "ls-tree", "-r", "--name-only", built["revision"]], capture_output=True, text=True)
    assert sorted(tree.stdout.split()) == sorted(built["files"])
    assert mirrors_hf.read_safetensors_header(repo / shard)["bulk.shard_00001.data"]["data_offsets"] == [
        0,
        1073742 - 8 - HEADER_BYTES,
    ]
    index = json.loads((repo / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"bulk.shard_00001.data": shard}
    config = subprocess.run([*git, "config", "core.bigFileThreshold"], capture_output=True, text=True)
    assert config.stdout.strip() == "1m"  # olah's git cat-file streams the shards


@needs_git
def test_build_is_reproducible_and_reused(built, tmp_path):
    again = mirrors_hf_bulk.build(tmp_path / "other-cache", Decimal("0.001"))
    assert again["revision"] == built["revision"]  # same sha on another machine (fixed identity and dates)
    warm = mirrors_hf_bulk.build(tmp_path / "cache", Decimal("0.0010"))
    assert warm == built


@needs_git
def test_publish_replaces_the_link_and_drops_links_of_pruned_entries(built, tmp_path):
    cache = tmp_path / "cache"
    links = mirrors_hf_bulk.served_root(cache) / "models" / "kimi-lab"
    (links / "Kimi-K2-bulk-9GiB").symlink_to(tmp_path / "pruned", target_is_directory=True)
    entry = Path(built["mirrors_path"]).parent
    link = mirrors_hf_bulk.publish(cache, entry, "Kimi-K2-bulk-0.001GiB")
    assert link.resolve() == (entry / "mirrors" / "models" / "kimi-lab" / "Kimi-K2-bulk-0.001GiB").resolve()
    assert sorted(p.name for p in links.iterdir()) == ["Kimi-K2-bulk-0.001GiB"]
    assert _cache.complete_entries(cache / "hf-bulk") == [entry]  # the served directory is not an entry
