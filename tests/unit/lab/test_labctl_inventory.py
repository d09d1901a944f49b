"""inventories/lab/ as lab/lab up writes it: what Ansible and the roles read."""

from __future__ import annotations

from pathlib import Path

import yaml
from labctl import inventory

URLS = {
    "apt_nvidia": "http://198.18.0.1:8080/apt/nvidia",
    "apt_debian": "http://198.18.0.1:8080/apt/debian",
    "pip_find_links": "http://198.18.0.1:8080/wheels/",
    "hf_endpoint": "http://198.18.0.1:8090",
}
CHECKPOINT = {"repo_id": "kimi-lab/tiny-kimi-k2", "revision": "a" * 40, "total_bytes": 9_000_000}


def test_hosts_are_kimi_nodes_in_order_with_strict_host_keys():
    text = inventory.render_hosts(3, Path("/state/ssh/id_ed25519"), Path("/state/ssh/known_hosts"))
    group = yaml.safe_load(text)["kimi_nodes"]
    assert list(group["hosts"]) == ["node1", "node2", "node3"]
    assert [h["ansible_host"] for h in group["hosts"].values()] == ["198.18.0.11", "198.18.0.12", "198.18.0.13"]
    assert group["vars"]["ansible_user"] == "root"
    assert group["vars"]["ansible_ssh_private_key_file"] == "/state/ssh/id_ed25519"
    args = group["vars"]["ansible_ssh_common_args"]
    assert "UserKnownHostsFile=/state/ssh/known_hosts" in args
    assert "StrictHostKeyChecking=yes" in args


def test_generated_vars_carry_the_mirrors_and_the_checkpoint():
    values = yaml.safe_load(
        inventory.render_generated_vars(2, 4 * 1024**3, URLS, CHECKPOINT, cpuinfo="flags: sse", host_cpus=[0, 1])
    )
    assert values == {
        "lab_node_count": 2,
        "lab_data_size_bytes": 4 * 1024**3,
        "lab_apt_nvidia_url": URLS["apt_nvidia"],
        "lab_apt_debian_url": URLS["apt_debian"],
        "lab_pip_find_links": URLS["pip_find_links"],
        "lab_hf_endpoint": URLS["hf_endpoint"],
        "lab_checkpoint_repo_id": "kimi-lab/tiny-kimi-k2",
        "lab_checkpoint_revision": "a" * 40,
        "lab_checkpoint_total_bytes": 9_000_000,
        "lab_kv_block_size": 16,
        "lab_host_cpus": [0, 1],
    }


def test_a_revision_that_looks_like_a_number_stays_a_string():
    values = yaml.safe_load(inventory.render_generated_vars(1, 1, URLS, {**CHECKPOINT, "revision": "1234"}))
    assert values["lab_checkpoint_revision"] == "1234"


def test_write_and_remove_touch_only_the_two_generated_files(tmp_path):
    keep = tmp_path / "inventories" / "lab" / "group_vars" / "all" / "lab.yml"
    keep.parent.mkdir(parents=True)
    keep.write_text("kimi_model: lab-mini\n")
    inventory.write("hosts\n", "vars\n", repo_root=tmp_path)
    assert inventory.hosts_path(tmp_path).read_text() == "hosts\n"
    assert inventory.generated_vars_path(tmp_path).read_text() == "vars\n"
    inventory.remove(repo_root=tmp_path)
    assert not inventory.hosts_path(tmp_path).exists()
    assert not inventory.generated_vars_path(tmp_path).exists()
    assert keep.read_text() == "kimi_model: lab-mini\n"


def test_kv_block_size_follows_the_cpu_backend_vllm_picks():
    assert inventory.cpu_kv_block_size("flags\t: fpu sse avx512f amx_bf16 amx_tile amx_int8\n") == 128
    assert inventory.cpu_kv_block_size("flags\t: fpu sse avx512f avx512_bf16\n") == 16
    values = yaml.safe_load(inventory.render_generated_vars(2, 1, URLS, CHECKPOINT, cpuinfo="flags: amx_tile amx_bf16"))
    assert values["lab_kv_block_size"] == 128
