"""The apt sources preflight reads on a node (kimi_apt_sources): what apt reads, no more and no less.

The distributions' own layouts (tests/fixtures/apt_sources) and the cases a site makes by hand (options in [...],
disabled stanzas, several URIs, files apt skips) are each parsed, and where apt-get exists apt itself reads the
same trees (`apt-get indextargets`, nothing fetched) and must name the same file and URI for every source.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_apt_sources import (
    parse_deb822,
    parse_one_line,
    read_apt_sources,
    source_files,
)

from tests.paths import FIXTURES, REPO_ROOT

LAYOUTS = FIXTURES / "apt_sources"

SITE_LIST = """\
# The site's old internal mirror, signed by its own key.
deb [signed-by=/usr/share/keyrings/corp-archive.gpg arch=amd64] http://apt.corp.example/debian bookworm main
deb-src [ signed-by=/usr/share/keyrings/corp-archive.gpg ] http://apt.corp.example/debian bookworm main # sources
   deb	https://apt.corp.example/extra   bookworm   main
#deb http://commented.example/debian bookworm main
  # deb http://indented-comment.example/debian bookworm main

deb [signed-by=/etc/apt/keyrings/k#1.gpg] http://hash-in-option.example/debian bookworm main
deb cdrom:[Debian GNU/Linux 12.5.0 _Bookworm_ - Official amd64 DVD Binary-1 20240210-11:28]/ bookworm main
"""

SITE_SOURCES = """\
# Two mirrors for the same suites, the second URI on a continuation line.
Types: deb deb-src
URIs: http://a.corp.example/debian
 http://b.corp.example/debian
Suites: bookworm bookworm-updates
Components: main

Enabled: no
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main

# A line of blanks does not end a stanza in apt: Enabled: false below disables the stanza above it too.
Types: deb
URIs: http://folded-into-the-next.example/debian
Suites: bookworm
Components: main
\t
Types: deb
URIs: http://also-disabled.example/debian
Suites: bookworm
Components: main
Enabled: false

Types: deb
URIs: file:/srv/kimi-bundle/apt
Suites: ./
Enabled: yes
"""


def site_tree(root: Path) -> Path:
    """/etc/apt of a node a site set up by hand, with the files apt skips beside the ones it reads."""
    parts = root / "sources.list.d"
    parts.mkdir(parents=True)
    (root / "sources.list").write_text("# empty but for this comment\n")
    (parts / "corp.list").write_text(SITE_LIST)
    (parts / "corp.sources").write_text(SITE_SOURCES)
    (parts / "vendor:repo.list").write_text("deb http://colon-in-name.example/debian bookworm main\n")
    skipped = {
        "corp.list.save": "deb http://save.example/debian bookworm main\n",
        "google-cloud-sdk.list.disabled-by-farm": "deb http://renamed.example/debian bookworm main\n",
        ".hidden.list": "deb http://hidden.example/debian bookworm main\n",
        "with space.list": "deb http://space.example/debian bookworm main\n",
        "README": "deb http://readme.example/debian bookworm main\n",
    }
    for name, text in skipped.items():
        (parts / name).write_text(text)
    (parts / "a-directory.list").mkdir()
    return root


def uris(sources: list[dict]) -> list[tuple[str, str]]:
    return [(Path(s["file"]).name, s["uri"]) for s in sources]


def test_debian_12_container_image_two_stanzas_with_comments_inside():
    sources = read_apt_sources(LAYOUTS / "debian-12")
    file = str(LAYOUTS / "debian-12" / "sources.list.d" / "debian.sources")
    assert sources == [
        {"file": file, "line": 3, "uri": "http://deb.debian.org/debian"},
        {"file": file, "line": 10, "uri": "http://deb.debian.org/debian-security"},
    ]


def test_debian_12_installer_one_line_entries_and_its_disabled_cdrom():
    sources = read_apt_sources(LAYOUTS / "debian-12-installer")
    assert [(s["line"], s["uri"]) for s in sources] == [
        (3, "http://deb.debian.org/debian/"),
        (4, "http://deb.debian.org/debian/"),
        (6, "http://security.debian.org/debian-security"),
        (7, "http://security.debian.org/debian-security"),
        (11, "http://deb.debian.org/debian/"),
        (12, "http://deb.debian.org/debian/"),
    ]


def test_ubuntu_24_04_commented_sources_list_and_deb822_ubuntu_sources():
    sources = read_apt_sources(LAYOUTS / "ubuntu-24.04")
    assert [(Path(s["file"]).name, s["line"], s["uri"]) for s in sources] == [
        ("ubuntu.sources", 15, "http://archive.ubuntu.com/ubuntu/"),
        ("ubuntu.sources", 23, "http://security.ubuntu.com/ubuntu/"),
    ]


def test_one_line_options_comments_and_a_cdrom_uri_with_spaces():
    found = [(s.line, s.uri) for s in parse_one_line(SITE_LIST, "corp.list")]
    assert found == [
        (2, "http://apt.corp.example/debian"),
        (3, "http://apt.corp.example/debian"),
        (4, "https://apt.corp.example/extra"),
        (8, "http://hash-in-option.example/debian"),
        (9, "cdrom:[Debian GNU/Linux 12.5.0 _Bookworm_ - Official amd64 DVD Binary-1 20240210-11:28]/"),
    ]


def test_deb822_every_uri_of_every_enabled_stanza_and_no_disabled_one():
    found = [(s.line, s.uri) for s in parse_deb822(SITE_SOURCES, "corp.sources")]
    assert found == [
        (3, "http://a.corp.example/debian"),
        (3, "http://b.corp.example/debian"),
        (27, "file:/srv/kimi-bundle/apt"),
    ]


def test_lines_apt_would_refuse_yield_nothing():
    assert parse_one_line("rpm http://x.example/ a b\ndeb\ndeb [arch=amd64]\n", "f.list") == []
    assert parse_deb822("Types: deb\nSuites: x\n\nURIs: http://no-types.example\n", "f.sources") == []


def test_only_the_files_apt_reads_in_sources_list_d(tmp_path):
    root = site_tree(tmp_path / "apt")
    assert [p.name for p in source_files(root)] == ["sources.list", "corp.list", "corp.sources", "vendor:repo.list"]
    assert "http://colon-in-name.example/debian" in [s["uri"] for s in read_apt_sources(root)]


def test_a_node_without_sources_has_none(tmp_path):
    assert read_apt_sources(tmp_path / "absent") == []
    (tmp_path / "empty" / "sources.list.d").mkdir(parents=True)
    assert read_apt_sources(tmp_path / "empty") == []


def apt_reads(root: Path, state: Path) -> set[tuple[str, str]]:
    """(file, URI without trailing '/') of every source apt-get itself reads from the tree `root` as its /etc/apt."""
    state.mkdir(parents=True, exist_ok=True)
    options = {
        "Dir::Etc": root,
        "Dir::Etc::sourcelist": "sources.list",
        "Dir::Etc::sourceparts": "sources.list.d",
        "Dir::State::Lists": state,
        "Dir::Cache": state,
    }
    command = ["apt-get", *(f"-o{name}={value}" for name, value in options.items()), "indextargets"]
    command += ["--no-release-info", "--format", "$(SOURCESENTRY) $(REPO_URI)"]
    listed = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout
    found = set()
    for line in listed.splitlines():
        entry, _, uri = line.partition(" ")
        found.add((entry.rpartition(":")[0], uri.rstrip("/")))
    return found


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="no apt-get (not a Debian or Ubuntu machine)")
@pytest.mark.parametrize("layout", ["debian-12", "debian-12-installer", "ubuntu-24.04", "site"])
def test_apt_itself_reads_the_same_files_and_uris(tmp_path, layout):
    root = site_tree(tmp_path / "apt") if layout == "site" else LAYOUTS / layout
    # apt prints a URI with a trailing '/', and a cdrom: one as cdrom://[...]: the same source either way.
    ours = {(s["file"], str(s["uri"]).replace("cdrom:[", "cdrom://[", 1).rstrip("/")) for s in read_apt_sources(root)}
    assert ours == apt_reads(root, tmp_path / "state")


@pytest.mark.parametrize("name", ["kimi_apt_sources", "kimi_node"])
def test_what_kimi_node_info_runs_on_a_node_is_stdlib_only(name):
    """A node's bare python3 runs these: only the standard library, and siblings that are stdlib-only too."""
    tree = ast.parse((REPO_ROOT / "plugins" / "module_utils" / f"{name}.py").read_text())
    absolute, siblings = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            absolute |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            absolute.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            siblings.add(node.module)
    assert absolute <= set(sys.stdlib_module_names) | {"__future__"}, absolute
    assert siblings <= {"kimi_apt_sources"}, siblings
