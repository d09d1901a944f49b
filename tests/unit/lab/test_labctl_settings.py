"""The lab's names, addresses, sizes and environment knobs."""

from __future__ import annotations

from pathlib import Path

import pytest
from labctl import settings


def test_addresses_and_links_follow_the_architecture_doc():
    assert settings.node_address(1) == "198.18.0.11"
    assert settings.node_address(8) == "198.18.0.18"
    assert settings.node_veth("node3") == "vb-node3"
    assert settings.HOST_ADDRESS == "198.18.0.1"
    assert settings.BRIDGE == "br-lab"


@pytest.mark.parametrize("name", ["node0", "node9", "node10", "nodeX", "Node1", "node1 "])
def test_node_index_rejects_non_lab_names(name):
    with pytest.raises(ValueError, match="not a lab node name"):
        settings.node_index(name)


def test_node_index_round_trips():
    assert [settings.node_index(settings.node_name(i)) for i in range(1, 9)] == list(range(1, 9))


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4G", 4 * 1024**3),
        ("512M", 512 * 1024**2),
        ("1.5GiB", 3 * 1024**3 // 2),
        ("1048576", 1024**2),
        ("2g", 2 * 1024**3),
    ],
)
def test_parse_size(text, size):
    assert settings.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "4X", "-1G", "100K", "12 apples"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        settings.parse_size(text)


def test_defaults():
    loaded = settings.load_settings({})
    assert loaded.cache == Path("/var/cache/kimi-lab")
    assert loaded.state == Path("/var/lib/kimi-lab")
    assert loaded.http_url == "http://198.18.0.1:8080"
    assert loaded.hf_url == "http://198.18.0.1:8090"


def test_environment_overrides():
    loaded = settings.load_settings(
        {"KIMI_LAB_CACHE": "/c", "KIMI_LAB_STATE": "/s", "KIMI_LAB_HTTP_PORT": "9000", "KIMI_LAB_HF_PORT": "9001"}
    )
    assert (loaded.cache, loaded.state, loaded.http_port, loaded.hf_port) == (Path("/c"), Path("/s"), 9000, 9001)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"KIMI_LAB_HTTP_PORT": "0"}, "KIMI_LAB_HTTP_PORT"),
        ({"KIMI_LAB_HF_PORT": "http"}, "KIMI_LAB_HF_PORT"),
        ({"KIMI_LAB_HTTP_PORT": "9000", "KIMI_LAB_HF_PORT": "9000"}, "both 9000"),
        ({"KIMI_LAB_BOOT_TIMEOUT": "soon"}, "KIMI_LAB_BOOT_TIMEOUT"),
    ],
)
def test_bad_environment_is_named(env, needle):
    with pytest.raises(ValueError, match=needle):
        settings.load_settings(env)
