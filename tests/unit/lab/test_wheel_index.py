"""The wheelhouse's find-links page with PEP 658 metadata: what it names, and that pip reads only metadata."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import zipfile
from functools import partial
from pathlib import Path
from typing import ClassVar

import pytest
from labctl import wheel_index


def make_wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = (), padding: int = 0) -> Path:
    stem = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{stem}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    record = f"{stem}.dist-info/METADATA,,\n{stem}.dist-info/WHEEL,,\n{stem}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{stem}.dist-info/METADATA", metadata)
        archive.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{stem}.dist-info/RECORD", record)
        if padding:
            archive.writestr(f"{name.replace('-', '_')}/blob.bin", os.urandom(padding))
    return path


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_page_names_each_wheel_with_its_hash_and_its_metadata_hash(tmp_path):
    wheel = make_wheel(tmp_path, "foo-bar", "1.0", requires=("baz>=2",))
    make_wheel(tmp_path, "baz", "2.1")

    assert wheel_index.ensure(tmp_path) is True

    metadata = (tmp_path / f"{wheel.name}.metadata").read_bytes()
    assert b"Requires-Dist: baz>=2" in metadata
    page = (tmp_path / "index.html").read_text()
    wanted = (
        f'<a href="{wheel.name}#sha256={sha256(wheel.read_bytes())}" data-core-metadata="sha256={sha256(metadata)}">'
    )
    assert wanted in page
    # The pre-PEP 714 name makes Debian 12's pip 23.0.1 refuse PyYAML-style names (see anchor()).
    assert "data-dist-info-metadata" not in page
    assert len(re.findall(r"<a ", page)) == 2


def test_a_second_run_changes_nothing_and_a_new_wheel_is_added(tmp_path):
    make_wheel(tmp_path, "foo", "1.0")
    wheel_index.ensure(tmp_path)
    page = tmp_path / "index.html"
    before = page.stat().st_mtime_ns

    assert wheel_index.ensure(tmp_path) is False
    assert page.stat().st_mtime_ns == before

    make_wheel(tmp_path, "bar", "0.1")
    assert wheel_index.ensure(tmp_path) is True
    assert "bar-0.1-py3-none-any.whl" in page.read_text()
    assert not list(tmp_path.glob(".*.partial"))


def test_the_hash_from_sha256sums_is_used_when_the_build_wrote_one(tmp_path):
    wheel = make_wheel(tmp_path, "foo", "1.0")
    (tmp_path / "SHA256SUMS").write_text(f"{'a' * 64}  {wheel.name}\n")
    wheel_index.ensure(tmp_path)
    assert f"#sha256={'a' * 64}" in (tmp_path / "index.html").read_text()


def test_a_wheel_without_one_metadata_file_is_named(tmp_path):
    broken = tmp_path / "broken-1.0-py3-none-any.whl"
    with zipfile.ZipFile(broken, "w") as archive:
        archive.writestr("broken/__init__.py", "")
    with pytest.raises(
        ValueError, match=re.escape("broken-1.0-py3-none-any.whl: expected one .dist-info/METADATA, found 0")
    ):
        wheel_index.ensure(tmp_path)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Records each path asked for instead of logging it."""

    requested: ClassVar[list[str]] = []

    def log_message(self, format, *args):
        QuietHandler.requested.append(self.path)


def test_pip_resolves_from_the_metadata_and_downloads_no_wheel(tmp_path):
    """A dry run through the page (loopback only) fetches the page and the .metadata files, no .whl."""
    house = tmp_path / "wheels"
    house.mkdir()
    make_wheel(house, "foo", "1.0", requires=("bar==0.1",), padding=1 << 20)
    make_wheel(house, "bar", "0.1", padding=1 << 20)
    wheel_index.ensure(house)
    QuietHandler.requested = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(house)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    report = tmp_path / "report.json"
    try:
        command = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "install", "--dry-run"]
        command += ["--ignore-installed", "--report", str(report), "--no-index", "--find-links"]
        command += [f"http://127.0.0.1:{server.server_port}/", "foo==1.0"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    installed = {
        entry["metadata"]["name"]: entry["metadata"]["version"] for entry in json.loads(report.read_text())["install"]
    }
    assert installed == {"foo": "1.0", "bar": "0.1"}
    assert {"/foo-1.0-py3-none-any.whl.metadata", "/bar-0.1-py3-none-any.whl.metadata"} <= set(QuietHandler.requested)
    assert not [path for path in QuietHandler.requested if path.endswith(".whl")], QuietHandler.requested
