"""`lab/lab up N` with a lab already up: the same healthy lab is kept (exit 0), another size or an unhealthy or
half-made lab is refused with one line naming what is wrong and the fix (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from labctl import cli, inventory, net, nodes, serve
from labctl.settings import load_settings
from labctl.state import LabRecord, StatePaths
from labctl.system import LabError

GIB = 1024**3
REVISION = "a" * 40


def record(count: int = 2, ready: bool = True) -> LabRecord:
    return LabRecord(
        node_count=count,
        data_size_bytes=4 * GIB,
        http_port=8080,
        hf_port=8090,
        base_rootfs="/cache/base/x/rootfs",
        mirror_urls={"apt_debian": "http://198.18.0.1:8080/apt/debian", "hf_endpoint": "http://198.18.0.1:8090"},
        checkpoint={"repo_id": "kimi-lab/Kimi-K2-mini", "revision": REVISION, "total_bytes": 1, "files": {}},
        data_sizes={f"node{i}": 4 * GIB for i in range(1, count + 1)},
        ready=ready,
    )


def mirrors(tmp_path: Path, revision: str = REVISION) -> dict[str, dict]:
    return {
        "apt": {"nvidia": tmp_path / "apt/nvidia", "debian": tmp_path / "apt/debian"},
        "wheels": {"wheelhouse": tmp_path / "wheels"},
        "hf": {"repo_id": "kimi-lab/Kimi-K2-mini", "revision": revision},
    }


@pytest.fixture
def healthy(monkeypatch, tmp_path):
    """A stand-in for a healthy lab on the host: every probe answers yes; tests break one thing at a time."""
    state = {"bridge": True, "local": True, "nodes": {}, "ssh": set(), "pids": {"http": 11, "hf": 12}, "down": set()}
    monkeypatch.setattr(net, "link_exists", lambda name: state["bridge"])
    monkeypatch.setattr(net, "link_is_up", lambda name: state["bridge"])
    monkeypatch.setattr(net, "is_local_address", lambda address: state["local"])
    monkeypatch.setattr(nodes, "state_of", lambda paths, name: state["nodes"].get(name, "running"))
    monkeypatch.setattr(nodes, "accepts_ssh", lambda paths, name: name not in state["ssh"])
    monkeypatch.setattr(serve, "server_pids", lambda paths: state["pids"])
    monkeypatch.setattr(cli, "_http_ok", lambda url: not any(f":{port}/" in url for port in state["down"]))
    monkeypatch.setattr(serve, "docroot_targets", lambda paths: serve.docroot_targets_for(*state["served"]))
    built = mirrors(tmp_path)
    state["served"] = (built["apt"], built["wheels"])
    state["mirrors"] = built
    hosts, generated = tmp_path / "inventory/hosts.yml", tmp_path / "inventory/group_vars/all/generated.yml"
    for path in (hosts, generated):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("---\n")
    monkeypatch.setattr(inventory, "hosts_path", lambda: hosts)
    monkeypatch.setattr(inventory, "generated_vars_path", lambda: generated)
    monkeypatch.setattr(cli, "REPO_ROOT", tmp_path)
    state["paths"] = StatePaths(tmp_path / "state")
    return state


def problems(state, lab: LabRecord | None = None) -> list[tuple[str, str]]:
    return cli.health_problems(state["paths"], lab or record(), state["mirrors"])


def test_a_healthy_lab_has_no_problems(healthy):
    assert problems(healthy) == []


def test_crashed_and_cut_nodes_are_named_with_their_fix(healthy):
    healthy["nodes"] = {"node1": "cut", "node2": "crashed"}
    assert problems(healthy) == [
        ("node1 is cut off the network", "`lab/lab heal node1`"),
        ("node2 is not running (crashed)", "`lab/lab start node2`"),
    ]


def test_a_node_without_ssh_and_a_dead_server_are_named(healthy):
    healthy["ssh"] = {"node2"}
    healthy["pids"] = {"http": 11, "hf": None}
    again = "`lab/lab down`, then `lab/lab up 2`"
    assert problems(healthy) == [
        ("node2 is running but does not accept SSH", again),
        ("the olah Hugging Face mirror is not running", again),
    ]


def test_a_server_that_does_not_answer_is_named_with_the_url(healthy):
    healthy["down"] = {8080}
    [(what, _)] = problems(healthy)
    assert what == "the static HTTP mirror does not answer http://198.18.0.1:8080/apt/debian/Packages"


def test_without_the_bridge_nothing_is_probed(healthy, monkeypatch):
    healthy["bridge"] = False

    def no_probe(*args):
        raise AssertionError("probed a lab address without br-lab")

    monkeypatch.setattr(nodes, "accepts_ssh", no_probe)
    monkeypatch.setattr(cli, "_http_ok", no_probe)
    assert problems(healthy) == [("the bridge br-lab is missing or down", "`lab/lab down`, then `lab/lab up 2`")]


def test_stale_mirrors_and_a_missing_inventory_are_named(healthy, tmp_path):
    healthy["mirrors"] = mirrors(tmp_path, revision="b" * 40)
    healthy["served"] = ({"nvidia": tmp_path / "old/nvidia", "debian": tmp_path / "old/debian"}, {"wheelhouse": "w"})
    (tmp_path / "inventory/hosts.yml").unlink()
    whats = [what for what, _ in problems(healthy)]
    assert whats == [
        f"the lab serves checkpoint {REVISION}, but its recipe now builds {'b' * 40}",
        "the lab serves older apt/wheel mirrors than their recipes now build",
        "inventory/hosts.yml is missing",
    ]


def test_other_size_names_both_sizes_and_the_fix():
    settings = load_settings({})
    message = cli.other_shape_error(record(2), 4, 4 * GIB, settings)
    assert message.startswith("a lab with 2 nodes is already up, and 4 were asked for")
    assert "`lab/lab down` first" in message
    assert "`make demo NODES=2`" in message
    assert cli.other_shape_error(record(2), 2, 4 * GIB, settings) is None
    assert "--data-size" in cli.other_shape_error(record(2), 2, 8 * GIB, settings)
    other_ports = load_settings({"KIMI_LAB_HTTP_PORT": "9080"})
    assert "ports 8080/8090" in cli.other_shape_error(record(2), 2, 4 * GIB, other_ports)


def test_unhealthy_error_is_one_line_with_each_fix_once():
    again = "`lab/lab down`, then `lab/lab up 3`"
    message = cli.unhealthy_error(
        record(3),
        [("node2 is not running (crashed)", "`lab/lab start node2`"), ("a", again), ("b", again)],
    )
    assert "\n" not in message
    assert message == (
        "a lab with 3 nodes is up but not healthy: node2 is not running (crashed); a; b "
        "(fix: `lab/lab start node2`; `lab/lab down`, then `lab/lab up 3`)"
    )


# --- through cmd_up --------------------------------------------------------------------------------------------


@pytest.fixture
def up(monkeypatch, tmp_path, healthy):
    """cmd_up against a recorded lab in tmp_path, with the host checks and mirror builds stood in for."""
    monkeypatch.setattr(cli, "require_root", lambda: None)
    monkeypatch.setattr(cli, "require_host_ready", lambda: None)
    monkeypatch.setattr(serve, "build_mirrors", lambda cache: healthy["mirrors"])
    monkeypatch.setattr(cli, "print_status", lambda paths: None)

    def bring_up_must_not_run(*args):
        raise AssertionError("up created a lab while one was up")

    monkeypatch.setattr(cli, "bring_up", bring_up_must_not_run)
    monkeypatch.setenv("KIMI_LAB_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("KIMI_LAB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "state").mkdir()
    settings = load_settings()

    def run(argv: list[str], lab: LabRecord) -> int:
        lab.save(StatePaths(settings.state))
        return cli.cmd_up(cli.build_parser().parse_args(argv), settings)

    return run


def test_up_again_with_a_healthy_lab_of_that_size_is_a_no_op(up, capsys):
    assert up(["up", "2"], record(2)) == 0
    assert "a healthy lab with 2 node(s) is already up" in capsys.readouterr().out


def test_up_with_another_size_is_refused_with_exit_2(up):
    with pytest.raises(LabError) as raised:
        up(["up", "3"], record(2))
    assert raised.value.exit_code == 2
    assert "a lab with 2 nodes is already up, and 3 were asked for" in str(raised.value)


def test_up_again_with_an_unhealthy_lab_is_refused_with_exit_2(up, healthy):
    healthy["nodes"] = {"node2": "crashed"}
    with pytest.raises(LabError) as raised:
        up(["up", "2"], record(2))
    assert raised.value.exit_code == 2
    assert "not healthy: node2 is not running (crashed) (fix: `lab/lab start node2`)" in str(raised.value)


def test_a_half_made_lab_is_still_refused(up):
    with pytest.raises(LabError) as raised:
        up(["up", "2"], record(2, ready=False))
    assert raised.value.exit_code == 2
    assert "half made by an interrupted up" in str(raised.value)
