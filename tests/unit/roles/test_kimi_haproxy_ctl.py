"""roles/router/files/kimi-haproxy-ctl (installed on the router hosts): haproxy 2.6's `show stat` and `show
servers state` answers (recorded from Debian 12's haproxy 2.6.12 with one server in maintenance and one drained
and failing its check) parsed into the view drain.yml and ready.yml read, the administrative-state decisions, and
main() end to end against a fake admin socket: show, state (dry run, change, no change, refused), save-state."""

from __future__ import annotations

import csv
import io
import json
import socket
import threading
from pathlib import Path

import pytest

from tests.node_programs import haproxy_ctl

# roles/router/files/kimi-haproxy-ctl, imported as `kimi_haproxy_ctl` (the file has no .py name).
kimi_router = haproxy_ctl()
from kimi_haproxy_ctl import (  # noqa: E402
    ADMIN_CMAINT,
    ADMIN_FDRAIN,
    ADMIN_FMAINT,
    ADMIN_IDRAIN,
    RuntimeApiError,
    admin_name,
    needs_change,
    parse_servers_state,
    parse_stat_csv,
    server_view,
    set_state,
)

STAT_HEADER = (
    "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight,"
    "act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,type,rate,rate_lim,rate_max,"
    "check_status,check_code,check_duration,hrsp_1xx,hrsp_2xx,hrsp_3xx,hrsp_4xx,hrsp_5xx,hrsp_other,hanafail,req_rate,"
    "req_rate_max,req_tot,cli_abrt,srv_abrt,comp_in,comp_out,comp_byp,comp_rsp,lastsess,last_chk,last_agt,qtime,ctime,"
    "rtime,ttime,agent_status,agent_code,agent_duration,check_desc,agent_desc,check_rise,check_fall,check_health,"
    "agent_rise,agent_fall,agent_health,addr,cookie,mode,algo,conn_rate,conn_rate_max,conn_tot,intercepted,dcon,dses,"
    "wrew,connect,reuse,cache_lookups,cache_hits,srv_icur,src_ilim,qtime_max,ctime_max,rtime_max,ttime_max,eint,"
    "idle_conn_cur,safe_conn_cur,used_conn_cur,need_conn_est,uweight,agg_server_status,agg_server_check_status,"
    "agg_check_status,-,ssl_sess,ssl_reused_sess,ssl_failed_handshake,h2_headers_rcvd,h2_data_rcvd,h2_settings_rcvd,"
    "h2_rst_stream_rcvd,h2_goaway_rcvd,h2_detected_conn_protocol_errors,h2_detected_strm_protocol_errors,"
    "h2_rst_stream_resp,h2_goaway_resp,h2_open_connections,h2_backend_open_streams,h2_total_connections,"
    "h2_backend_total_streams,h1_open_connections,h1_open_streams,h1_total_connections,h1_total_streams,h1_bytes_in,"
    "h1_bytes_out,h1_spliced_bytes_in,h1_spliced_bytes_out,\n"
)
STAT_R1_MAINT = (
    "kimi_replicas,r1,0,0,0,0,,0,0,0,,0,,0,0,0,0,MAINT,1,1,0,0,1,257,257,,1,3,1,,0,,2,0,,0,,,,0,0,0,0,0,0,,,,0,0,0,"
    ",,,,-1,,,0,0,0,0,,,,,,,,,,,,127.0.0.1:18001,,http,,,,,,,,0,0,0,,,0,,0,0,0,0,0,0,0,0,0,1,,,,-,0,0,0,,,,,,,,,,,,,"
    ",,,,,,,,,\n"
)
STAT_R2_DOWN = (
    "kimi_replicas,r2,0,0,3,0,,0,0,0,,0,,0,0,0,0,DOWN,1,1,0,0,1,256,256,,1,3,2,,0,,2,0,,0,L7STS,500,1,0,0,0,0,0,0,,,,"
    "0,0,0,,,,,-1,Internal Server Error,,0,0,0,0,,,,Layer7 wrong status,,1,2,0,,,,127.0.0.1:18002,,http,,,,,,,,0,0,0,"
    ",,0,,0,0,0,0,0,0,0,0,1,1,,,,-,0,0,0,,,,,,,,,,,,,,,,,,,,,,\n"
)
SHOW_STAT = STAT_HEADER + STAT_R1_MAINT + STAT_R2_DOWN + "\n"
STATE_HEADER = (
    "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
    "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state "
    "bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr "
    "srv_agent_addr srv_agent_port\n"
)
SHOW_SERVERS_STATE = (
    STATE_HEADER
    + "3 kimi_replicas 1 r1 127.0.0.1 0 1 1 1 257 15 3 0 14 0 0 0 - 18001 - 0 0 - - 0\n"
    + "3 kimi_replicas 2 r2 127.0.0.1 0 8 1 1 256 17 2 0 6 0 0 0 - 18002 - 0 0 - - 0\n\n"
)


def test_show_stat_rows_are_keyed_by_the_header():
    rows = parse_stat_csv(SHOW_STAT)
    assert [(r["pxname"], r["svname"], r["status"]) for r in rows] == [
        ("kimi_replicas", "r1", "MAINT"),
        ("kimi_replicas", "r2", "DOWN"),
    ]
    assert rows[1]["check_status"] == "L7STS" and rows[1]["check_code"] == "500" and rows[1]["scur"] == "3"
    assert rows[1]["check_desc"] == "Layer7 wrong status"


def test_show_servers_state_rows_are_keyed_by_the_header():
    rows = parse_servers_state(SHOW_SERVERS_STATE)
    assert [(r["srv_name"], r["srv_op_state"], r["srv_admin_state"]) for r in rows] == [
        ("r1", "0", "1"),
        ("r2", "0", "8"),
    ]


@pytest.mark.parametrize(
    ("parse", "answer"),
    [(parse_stat_csv, "Unknown command.\n"), (parse_stat_csv, ""), (parse_servers_state, "Permission denied\n")],
)
def test_an_answer_that_is_not_the_table_is_an_error(parse, answer):
    with pytest.raises(RuntimeApiError):
        parse(answer)


def test_the_view_joins_both_tables():
    stats, states = parse_stat_csv(SHOW_STAT), parse_servers_state(SHOW_SERVERS_STATE)
    r1 = server_view("kimi_replicas", "r1", stats, states)
    assert (r1.status, r1.admin, r1.up, r1.check_status) == ("MAINT", "maint", False, "")
    r2 = server_view("kimi_replicas", "r2", stats, states)
    assert r2.as_dict() == {
        "backend": "kimi_replicas",
        "server": "r2",
        "status": "DOWN",
        "scur": 3,
        "qcur": 0,
        "check_status": "L7STS",
        "check_code": "500",
        "lastchg": 256,
        "admin": "drain",
        "admin_bits": 8,
        "up": False,
        "trackers": (),
    }


def tracking_row(row: str, backend: str, scur: int, tracked: str) -> str:
    """A copy of a `show stat` row as the session-affinity backend's server that tracks it shows it."""
    header = STAT_HEADER[2:].rstrip(",\n").split(",")
    values = next(csv.reader(io.StringIO(row)))
    values[header.index("pxname")] = backend
    values[header.index("scur")] = str(scur)
    values[header.index("tracked")] = tracked
    return ",".join(values) + "\n"


def test_a_servers_sessions_include_those_of_the_servers_tracking_it():
    # The affinity backend's r2 tracks kimi_replicas/r2: a drain of r2 must wait for its 2 sessions too.
    session_twin = tracking_row(STAT_R2_DOWN, "kimi_replicas_by_session", 2, "kimi_replicas/r2")
    other = tracking_row(STAT_R1_MAINT, "kimi_replicas_by_session", 5, "kimi_replicas/r1")
    stats = parse_stat_csv(STAT_HEADER + STAT_R1_MAINT + STAT_R2_DOWN + session_twin + other)
    r2 = server_view("kimi_replicas", "r2", stats, parse_servers_state(SHOW_SERVERS_STATE))
    assert (r2.scur, r2.trackers) == (3 + 2, ("kimi_replicas_by_session/r2",))


def test_an_unknown_server_is_named_with_the_ones_there_are():
    stats, states = parse_stat_csv(SHOW_STAT), parse_servers_state(SHOW_SERVERS_STATE)
    with pytest.raises(RuntimeApiError, match=r"no server 'r7' in backend 'kimi_replicas' \(it has: r1, r2\)"):
        server_view("kimi_replicas", "r7", stats, states)


@pytest.mark.parametrize(
    ("bits", "name"),
    [
        (0, "ready"),
        (ADMIN_FDRAIN, "drain"),
        (ADMIN_IDRAIN, "drain"),
        (ADMIN_FMAINT, "maint"),
        (ADMIN_CMAINT, "maint"),
        (ADMIN_FMAINT | ADMIN_IDRAIN, "maint"),
    ],
)
def test_the_admin_state_from_its_bits(bits, name):
    assert admin_name(bits) == name


@pytest.mark.parametrize(
    ("bits", "wanted", "changes"),
    [
        (0, "ready", False),
        (0, "drain", True),
        (0, "maint", True),
        (ADMIN_FDRAIN, "ready", True),
        (ADMIN_FDRAIN, "drain", False),
        (ADMIN_FDRAIN, "maint", True),
        (ADMIN_FMAINT, "ready", True),
        (ADMIN_FMAINT, "drain", True),
        (ADMIN_FMAINT, "maint", False),
        # Inherited or configured states are not the runtime API's to change: ready is as ready as it gets.
        (ADMIN_CMAINT, "ready", False),
    ],
)
def test_only_a_different_forced_state_is_a_change(bits, wanted, changes):
    assert needs_change(bits, wanted) is changes


def test_an_unknown_wanted_state_is_refused():
    with pytest.raises(ValueError, match="ready, drain, maint"):
        needs_change(0, "up")


class FakeHaproxy:
    """The runtime API of a backend with servers r1 and r2: answers the tables from its admin bits, records every
    command, and applies `set server ... state` as haproxy does (drain and maint clear each other)."""

    def __init__(self, bits: dict[str, int], refuse: str = "") -> None:
        self.bits = dict(bits)
        self.commands: list[str] = []
        self.refuse = refuse

    def __call__(self, command: str) -> str:
        self.commands.append(command)
        if command.startswith("show stat"):
            status = {0: "UP", ADMIN_FDRAIN: "DRAIN", ADMIN_FMAINT: "MAINT"}
            rows = [f"kimi_replicas,{name},0,0,0" for name in self.bits]
            body = "".join(f"{row},{status[self.bits[row.split(',')[1]]]}\n" for row in rows)
            return "# pxname,svname,qcur,qmax,scur,status\n" + body + "\n"
        if command.startswith("show servers state"):
            header = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state\n"
            rows = (
                f"3 kimi_replicas {i} {name} 10.0.0.{i} 2 {bits}\n" for i, (name, bits) in enumerate(self.bits.items())
            )
            return header + "".join(rows)
        if command.startswith("set server "):
            if self.refuse:
                return self.refuse
            target, _, wanted = command.removeprefix("set server ").split()
            server = target.split("/")[1]
            self.bits[server] = {"ready": 0, "drain": ADMIN_FDRAIN, "maint": ADMIN_FMAINT}[wanted]
            return "\n"
        return "Unknown command.\n"


def test_set_state_changes_and_reads_back():
    fake = FakeHaproxy({"r1": 0, "r2": 0})
    result = set_state(fake, "kimi_replicas", "r1", "drain")
    assert result["changed"] is True
    assert (result["before"]["status"], result["after"]["status"], result["after"]["admin"]) == ("UP", "DRAIN", "drain")
    assert "set server kimi_replicas/r1 state drain" in fake.commands


def test_set_state_to_the_state_it_has_sends_nothing():
    fake = FakeHaproxy({"r1": ADMIN_FMAINT, "r2": 0})
    assert set_state(fake, "kimi_replicas", "r1", "maint")["changed"] is False
    assert not [c for c in fake.commands if c.startswith("set ")]


def test_a_dry_run_reports_the_change_and_sends_nothing():
    fake = FakeHaproxy({"r1": ADMIN_FMAINT, "r2": 0})
    result = set_state(fake, "kimi_replicas", "r1", "ready", dry_run=True)
    assert (result["changed"], result["dry_run"], result["after"]["admin"]) == (True, True, "maint")
    assert not [c for c in fake.commands if c.startswith("set ")]


def test_a_refused_command_is_an_error_with_haproxys_words():
    fake = FakeHaproxy({"r1": 0}, refuse="No such server.\n\n")
    with pytest.raises(RuntimeApiError, match=r"refused `set server kimi_replicas/r1 state maint`: No such server."):
        set_state(fake, "kimi_replicas", "r1", "maint")


def test_main_prints_json_and_exits_by_outcome(capsys):
    fake = FakeHaproxy({"r1": ADMIN_FDRAIN, "r2": 0})
    assert kimi_router.main(["show", "r1"], ask=fake) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["status"], shown["host"]) == ("DRAIN", socket.gethostname())
    assert kimi_router.main(["state", "r1", "ready"], ask=fake) == 0
    assert json.loads(capsys.readouterr().out)["after"]["admin"] == "ready"
    assert kimi_router.main(["show", "r9"], ask=fake) == 1
    assert "no server 'r9'" in capsys.readouterr().err


def test_main_without_a_socket_says_so(tmp_path, capsys):
    missing = str(tmp_path / "admin.sock")
    assert kimi_router.main(["--socket", missing, "show", "r1"]) == 2
    assert f"no admin socket {missing}" in capsys.readouterr().err
    assert kimi_router.main(["--socket", missing, "save-state", str(tmp_path / "state"), "--missing-ok"]) == 0
    assert not (tmp_path / "state").exists()


def test_save_state_writes_the_whole_table(tmp_path):
    target = tmp_path / "lib" / "server-state"
    fake = FakeHaproxy({"r1": ADMIN_FMAINT, "r2": 0})
    assert kimi_router.save_state(fake, target) == 2
    assert parse_servers_state(target.read_text())[0]["srv_admin_state"] == str(ADMIN_FMAINT)
    assert fake.commands == ["show servers state"]
    assert target.stat().st_mode & 0o777 == 0o644


def test_the_socket_speaks_one_command_and_reads_to_the_end(tmp_path):
    path = str(tmp_path / "admin.sock")
    received: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)

        def serve() -> None:
            connection, _ = server.accept()
            with connection:
                received.append(connection.recv(1024))
                connection.sendall(SHOW_SERVERS_STATE.encode())

        thread = threading.Thread(target=serve)
        thread.start()
        answer = kimi_router.runtime_api(path, "show servers state", timeout=5)
        thread.join(5)
    assert received == [b"show servers state\n"]
    assert answer == SHOW_SERVERS_STATE


def test_the_pem_check_config_binds_the_file_and_nothing_else():
    config = kimi_router.pem_check_config("/etc/haproxy/kimi-router.pem")
    assert "bind 127.0.0.1:1 ssl crt /etc/haproxy/kimi-router.pem\n" in config
    assert config.count("bind ") == 1


def test_the_script_has_the_nodes_interpreter_and_only_the_standard_library():
    source = Path(kimi_router.__file__).read_text()
    assert source.startswith("#!/usr/bin/python3\n")
    imports = {line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {
        "__future__",
        "argparse",
        "collections",
        "csv",
        "dataclasses",
        "io",
        "json",
        "os",
        "pathlib",
        "shutil",
        "socket",
        "subprocess",
        "sys",
        "tempfile",
    }
