"""The pure parts of the bundle's apt step: the private root's configuration, the sources.list lines, reading
apt's output (--print-uris, simulation, errors) into named messages, and the reuse bookkeeping on files.

apt itself runs in tests/local/test_bundle_apt.py; the output samples here are copied from apt 2.6 runs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_fetch as kbf
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from kimi_tools import kimi_bundle_apt as kba
from kimi_tools.kimi_bundle_apt import (
    AptBundleError,
    AptDownload,
    AptRequest,
    AptSource,
)

PIN = "2.30.7-1+cuda13.3"
LAB = "/var/cache/kimi-lab/apt/01234567"
VARIABLES = {
    "kimi_bundle_inventory_name": "site-a",
    "kimi_bundle_distribution": "debian-12",
    "kimi_bundle_codename": "bookworm",
    "vllm_python_version": "3.11",
    "vllm_platforms": ["manylinux_2_36_x86_64"],
    "kimi_deb_pins": {"libnccl2": PIN, "libnccl-dev": PIN},
    "firewall_deb_pins": {"bookworm": {"nftables": "1.0.6-2+deb12u2"}},
    "kimi_bundle_apt_packages": ["acl", "nftables"],
    "kimi_vllm_pip_pins": {"vllm": "0.23.0"},
}


def request() -> AptRequest:
    return AptRequest.from_inputs(kbi.inputs_from_variables(VARIABLES))


def root(base: Path, *sources: AptSource) -> kba.AptRoot:
    return kba.AptRoot(base, "amd64", sources, copy_local_files=True)


# --------------------------------------------------------------------------------------------- sources


def test_sources_become_deb_lines_and_local_ones_are_copied_into_the_archives():
    sources = [
        AptSource(f"file:{LAB}/nvidia", trusted=True),
        AptSource("http://deb.debian.org/debian", "bookworm", ("main",), signed_by=Path("/k/debian.gpg")),
    ]
    assert kba.sources_list_text(sources, copy_local_files=True) == (
        f"deb [trusted=yes] copy:{LAB}/nvidia ./\n"
        "deb [signed-by=/k/debian.gpg] http://deb.debian.org/debian bookworm main\n"
    )
    assert kba.sources_list_text(sources[:1], copy_local_files=False) == f"deb [trusted=yes] file:{LAB}/nvidia ./\n"


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        (AptSource("file:/r"), "give exactly one of signed_by (a keyring) and trusted"),
        (AptSource("file:/r", trusted=True, signed_by=Path("/k.gpg")), "give exactly one of signed_by"),
        (AptSource("file:/r", signed_by=Path("k.gpg")), "signed_by must be an absolute path"),
        (AptSource("file:/r", "./", ("main",), trusted=True), "a flat repository (suite ./) has no components"),
        (AptSource("http://h/debian", "bookworm", trusted=True), "suite bookworm needs at least one component"),
        (AptSource("ftp://h/debian", trusted=True), "the URI must be file:, copy:, http: or https:"),
        (AptSource("file:/my repo", trusted=True), "hold no white space"),
    ],
)
def test_a_source_apt_cannot_take_is_refused_by_name(source, problem):
    problems = kba.source_problems(source)
    assert problems and problems[0].startswith(f"apt source {source.describe()}: ") and problem in problems[0]
    with pytest.raises(AptBundleError, match=f"apt source {source.describe()}"):
        kba.sources_list_text([source], copy_local_files=True)


def test_no_source_at_all_is_refused():
    with pytest.raises(AptBundleError, match="no apt source given"):
        kba.sources_list_text([], copy_local_files=True)


def test_a_line_of_apt_output_is_traced_to_its_source_through_copy_and_extra_slashes():
    nvidia, debian = (
        AptSource(f"file:///{LAB}/nvidia", trusted=True),
        AptSource("http://h/debian", "bookworm", ("main",)),
    )
    line = f"E: Failed to fetch copy:{LAB}/nvidia/./Packages  Failed to stat"
    assert kba.source_for(line, [debian, nvidia]) is nvidia
    assert kba.source_for("E: Failed to fetch http://h/debian/dists/bookworm/InRelease", [nvidia, debian]) is debian
    assert kba.source_for("E: Some index files failed to download.", [nvidia, debian]) is None


# ---------------------------------------------------------------------------------------- the apt root


def test_every_path_of_the_private_root_is_inside_it(tmp_path):
    settings = kba.apt_settings(root(tmp_path / "apt-root"))
    paths = {key: value for key, value in settings.items() if key.startswith("Dir")}
    for key in ("Dir::Etc::trusted", "Dir::Etc::trustedparts", "Dir::Etc::preferences", "Dir::Etc::preferencesparts"):
        assert key in paths
    for key in ("Dir::Etc::main", "Dir::Etc::parts", "Dir::Etc::sourcelist", "Dir::State::status", "Dir::Cache"):
        assert key in paths
    assert all(Path(value).is_absolute() for value in paths.values())
    assert kba.paths_outside(paths, tmp_path / "apt-root") == []
    assert settings["APT::Architectures"] == ("amd64",) and settings["APT::Update::Error-Mode"] == "any"


def test_the_apt_conf_text_quotes_values_and_lists():
    text = kba.apt_config_text({"Dir": "/w/root/", "APT::Architectures": ("amd64",)})
    assert text.splitlines()[1:] == ['Dir "/w/root/";', 'APT::Architectures { "amd64"; };']


@pytest.mark.parametrize("base", ['/w/a"b', "/w/a\\b", "/w/a\nb"])
def test_a_root_path_apt_conf_cannot_hold_is_refused(base):
    with pytest.raises(AptBundleError, match=r"apt setting Dir: .* holds a quote, a backslash or a control"):
        kba.apt_config_text(kba.apt_settings(root(Path(base))))


def test_apt_config_shell_output_is_read_and_a_path_outside_is_named(tmp_path):
    names = {"KIMI_PATH_0": "Dir::Etc::trusted/f", "KIMI_PATH_1": "Dir::Etc::parts/d", "KIMI_PATH_2": "Dir::X/f"}
    output = f"KIMI_PATH_0='{tmp_path}/etc/trusted.gpg'\nKIMI_PATH_1='/etc/apt/apt.conf.d/'\nKIMI_PATH_2=''\n"
    resolved = kba.parse_apt_config_shell(output, names)
    assert resolved == {
        "Dir::Etc::trusted/f": f"{tmp_path}/etc/trusted.gpg",
        "Dir::Etc::parts/d": "/etc/apt/apt.conf.d/",
        "Dir::X/f": "",
    }
    assert kba.paths_outside(resolved, tmp_path) == [f"Dir::Etc::parts/d is /etc/apt/apt.conf.d/, outside {tmp_path}"]


def test_an_architecture_that_is_no_debian_name_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(AptBundleError, match="architecture 'x86_64 all'"):
        kba.create_apt_root(tmp_path / "r", "x86_64 all", [AptSource("file:/r", trusted=True)])
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------------------------ the request


def test_the_request_pins_each_version_and_names_where_each_pin_came_from():
    wanted = request()
    # nftables is pinned (firewall_deb_pins) and listed unpinned: the pin wins, the name is not repeated.
    assert kba.install_arguments(wanted) == [
        f"libnccl-dev={PIN}",
        f"libnccl2={PIN}",
        "nftables=1.0.6-2+deb12u2",
        "acl",
    ]
    assert wanted.label("nftables") == "apt package nftables 1.0.6-2+deb12u2 (firewall_deb_pins)"
    assert wanted.label("acl") == "apt package acl (kimi_bundle_apt_packages)"


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"pins": {"-oDir=/": "1"}}, "apt package -oDir=/ 1 (kimi_deb_pins): not a Debian package name"),
        ({"pins": {"libnccl2": "2.30 -s"}}, "apt package libnccl2 2.30 -s (kimi_deb_pins): not a Debian"),
        ({"extras": ("--simulate",)}, "apt package --simulate (kimi_bundle_apt_packages): not a Debian"),
        ({}, "nothing to fetch"),
    ],
)
def test_a_name_or_version_apt_would_read_as_an_option_is_refused(changes, problem):
    with pytest.raises(AptBundleError, match="^" + problem.replace("(", r"\(").replace(")", r"\)")):
        kba.install_arguments(AptRequest("amd64", **changes))


# ------------------------------------------------------------------------------------ apt's output

COPY = f"copy:{LAB}"
PRINT_URIS = f"""Reading package lists...
Building dependency tree...
'{COPY}/debian/./libc6_2.36-9%2bdeb12u14_amd64.deb' libc6_2.36-9+deb12u14_amd64.deb 2759320 SHA256:{"ab" * 32}
'{COPY}/nvidia/./libnccl2_2.30.7-1%2bcuda13.3_amd64.deb' libnccl2_2.30.7-1+cuda13.3_amd64.deb 2920 SHA256:{"cd" * 32}
'http://h/debian/pool/main/g/git/git_2.39.5-0+deb12u3_amd64.deb' git_1%3a2.39.5-0+deb12u3_amd64.deb 7264380 MD5Sum:0f
"""


def test_print_uris_lines_become_downloads_with_apts_file_names():
    downloads = kba.parse_print_uris(PRINT_URIS)
    assert [(d.filename, d.size, d.sha256) for d in downloads] == [
        ("libc6_2.36-9+deb12u14_amd64.deb", 2759320, "ab" * 32),
        ("libnccl2_2.30.7-1+cuda13.3_amd64.deb", 2920, "cd" * 32),
        # Without a SHA256 in the index the file cannot be matched in advance: it is always fetched.
        ("git_1%3a2.39.5-0+deb12u3_amd64.deb", 7264380, None),
    ]
    assert downloads[1].uri == f"copy:{LAB}/nvidia/./libnccl2_2.30.7-1%2bcuda13.3_amd64.deb"
    assert downloads[1].artifact() == kbf.Artifact("apt/libnccl2_2.30.7-1+cuda13.3_amd64.deb", 2920, "cd" * 32)


def test_a_print_uris_file_name_that_is_no_deb_is_refused():
    with pytest.raises(AptBundleError, match=r"'\.\./x\.deb' is not a \.deb file name"):
        kba.parse_print_uris("'http://h/x.deb' ../x.deb 10 SHA256:00\n")


SIMULATION = """NOTE: This is only a simulation!
Inst libc6 (2.36-9+deb12u14 kimi.k2 bundle for site-a:bookworm [amd64]) []
Inst libnccl2 (2.30.7-1+cuda13.3 kimi-lab nvidia placeholders:lab [amd64])
Inst libnccl-dev:amd64 [2.30.5-1+cuda13.3] (2.30.7-1+cuda13.3 kimi:bookworm [amd64])
Conf libnccl2 (2.30.7-1+cuda13.3 kimi-lab nvidia placeholders:lab [amd64])
"""


def test_the_simulation_says_which_version_of_each_package_apt_would_install():
    installs = kba.parse_simulated_installs(SIMULATION)
    assert installs == {"libc6": "2.36-9+deb12u14", "libnccl2": PIN, "libnccl-dev": PIN}


def test_a_pin_or_a_package_the_simulation_lacks_is_named_with_what_apt_would_do():
    installs = {"libnccl2": PIN, "libnccl-dev": "2.30.8-1+cuda13.3", "acl": "2.3.1-3"}
    assert kba.unresolved_requests(installs, request()) == [
        f"apt package libnccl-dev {PIN} (kimi_deb_pins): apt would install version 2.30.8-1+cuda13.3 from the bundle",
        "apt package nftables 1.0.6-2+deb12u2 (firewall_deb_pins): apt would install nothing from the bundle",
    ]
    installs.update({"libnccl-dev": PIN, "nftables": "1.0.6-2+deb12u2"})
    assert kba.unresolved_requests(installs, request()) == []
    assert kba.unresolved_requests(installs, AptRequest("amd64", extras=("curl",))) == [
        "apt package curl (kimi_bundle_apt_packages): apt would not install it from the bundle"
    ]


MISSING_VERSION = """Reading package lists...
Building dependency tree...
E: Version '2.30.99-1+cuda13.3' for 'libnccl2' was not found
E: Unable to locate package acl
"""
UNMET = """Reading package lists...
Some packages could not be installed. This may mean that you have
The following information may help to resolve the situation:

The following packages have unmet dependencies:
 libnccl-dev : Depends: libnccl2 (= 2.30.7-1+cuda13.3) but 2.30.8-1+cuda13.3 is to be installed
E: Unable to correct problems, you have held broken packages.
"""


def test_a_version_or_package_no_source_has_is_named_with_its_variable_and_apts_words():
    message = kba.install_failure_message(MISSING_VERSION, request(), "apt-get install")
    first, *rest = message.splitlines()
    assert first == (
        "apt-get install failed: apt package libnccl2 2.30.99-1+cuda13.3 (kimi_deb_pins): no apt source has this "
        "version; apt package acl (kimi_bundle_apt_packages): no apt source has this package"
    )
    assert rest == [
        "apt said:",
        "E: Version '2.30.99-1+cuda13.3' for 'libnccl2' was not found",
        "E: Unable to locate package acl",
    ]


def test_unmet_dependencies_are_quoted_from_apt():
    message = kba.install_failure_message(UNMET, request(), "apt-get install")
    assert message.splitlines() == [
        "apt-get install failed: the pinned versions' dependencies cannot all be met from the sources",
        "apt said:",
        "The following packages have unmet dependencies:",
        " libnccl-dev : Depends: libnccl2 (= 2.30.7-1+cuda13.3) but 2.30.8-1+cuda13.3 is to be installed",
        "E: Unable to correct problems, you have held broken packages.",
    ]


def test_a_deb_whose_hash_does_not_match_the_index_is_named_by_file():
    output = (
        "Get:1 file:/b/apt ./ libnccl2 2.30.7-1+cuda13.3 [2920 B]\n"
        "E: Failed to fetch file:/b/apt/./libnccl2_2.30.7-1%2bcuda13.3_amd64.deb  Hash Sum mismatch\n"
        "   Hashes of expected file:\n"
        "E: Some files failed to download\n"
    )
    message = kba.install_failure_message(output, request(), "apt-get install --download-only")
    assert message.splitlines()[0] == (
        "apt-get install --download-only failed: libnccl2_2.30.7-1+cuda13.3_amd64.deb: its content does not match "
        "the signed index (apt: Hash Sum mismatch)"
    )
    assert kba.install_failure_message("E: odd\n", request(), "apt-get x").splitlines() == [
        "apt-get x failed",
        "apt said:",
        "E: odd",
    ]


def test_update_failures_name_the_source_that_does_not_answer_or_fails_its_signature():
    bundle = AptSource("file:/b/apt", signed_by=Path("/b/apt/kimi-bundle-archive.gpg"))
    mirror = AptSource(f"file:{LAB}/debian", trusted=True)
    output = (
        "Reading package lists...\n"
        f"E: Failed to fetch copy:{LAB}/debian/./Packages  File not found\n"
        "W: GPG error: file:/b/apt ./ InRelease: The following signatures were invalid: BADSIG 3E2DFF297A8853E8\n"
        "E: Some index files failed to download. They have been ignored, or old ones used instead.\n"
    )
    assert kba.update_failure_message(output, [bundle, mirror], "apt-get update").splitlines() == [
        "apt-get update failed:",
        f"apt source file:{LAB}/debian ./ does not answer: E: Failed to fetch copy:{LAB}/debian/./Packages  "
        "File not found",
        "apt source file:/b/apt ./: W: GPG error: file:/b/apt ./ InRelease: The following signatures were invalid: "
        "BADSIG 3E2DFF297A8853E8",
        "E: Some index files failed to download. They have been ignored, or old ones used instead.",
    ]


COLONS = """sec:u:255:22:3E2DFF297A8853E8:1764707978:::u:::scSC:::+:::ed25519:::0:
fpr:::::::::DF716D536871D32F786860723E2DFF297A8853E8:
grp:::::::::0123456789ABCDEF0123456789ABCDEF01234567:
uid:u::::1764707978::ABC::kimi-bundle build key <kimi-bundle@localhost>::::::::::0:
ssb:u:255:22:1111111111111111:1764707978::::::s:::+:::ed25519::
fpr:::::::::AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA:
sec:u:255:22:2222222222222222:1764707978:::u:::scSC:::+:::ed25519:::0:
fpr:::::::::BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB:
"""


def test_the_primary_keys_fingerprints_are_read_and_subkeys_skipped():
    assert kba.secret_key_fingerprints(COLONS) == [
        "DF716D536871D32F786860723E2DFF297A8853E8",
        "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB",
    ]


def test_the_release_fields_come_from_the_inputs_and_must_be_one_line():
    fields = kba.ReleaseFields.for_inputs(kbi.inputs_from_variables(VARIABLES))
    assert kba.release_options(fields) == [
        "-o", "APT::FTPArchive::Release::Origin=kimi-bundle",
        "-o", "APT::FTPArchive::Release::Label=kimi.k2 bundle for site-a",
        "-o", "APT::FTPArchive::Release::Suite=bookworm",
        "-o", "APT::FTPArchive::Release::Codename=bookworm",
        "-o", "APT::FTPArchive::Release::Architectures=amd64",
    ]  # fmt: skip
    with pytest.raises(AptBundleError, match="Release field Label"):
        kba.release_options(kba.ReleaseFields("o", "two\nlines", "s", "c", ("amd64",)))


def test_a_key_id_gpg_would_read_as_an_option_is_refused():
    with pytest.raises(AptBundleError, match="signing key id '--export-secret-keys'"):
        kba.gpg_command(kba.SigningKey(Path("/g"), "--export-secret-keys"), "--export")


def test_a_missing_program_is_named_with_the_debian_package_that_ships_it(tmp_path, monkeypatch):
    monkeypatch.setattr(kba, "GPG", str(tmp_path / "bin" / "gpg"))
    with pytest.raises(AptBundleError, match=r"gpg .*/bin/gpg is not installed \(install the Debian package gnupg\)"):
        kba.export_keyring(tmp_path, kba.SigningKey(tmp_path / "gnupg", "ABCDEF0123456789"))
    monkeypatch.setattr(kba, "APT_FTPARCHIVE", "/nonexistent/apt-ftparchive")
    fake_root = root(tmp_path / "r")
    with pytest.raises(AptBundleError, match=r"is not installed \(install the Debian package apt-utils\)"):
        kba.write_indexes(fake_root, tmp_path)


# -------------------------------------------------------------------------------- reuse bookkeeping


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def deb(directory: Path, name: str, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(data)
    return path


def test_only_debs_with_the_indexes_sha256_are_seeded_and_everything_else_leaves_the_archives(tmp_path):
    bundle, archives = tmp_path / "bundle" / "apt", tmp_path / "root" / "archives"
    good = deb(bundle, "a_1_amd64.deb", b"a" * 100)
    deb(bundle, "b_1_amd64.deb", b"X" * 100)  # corrupt, same size: apt alone would keep it
    deb(archives, "c_1_amd64.deb", b"c" * 50)  # an interrupted run's download, still good
    deb(archives, "d_1_amd64.deb", b"d" * 10)  # not in the closure any more
    wanted = [
        AptDownload("copy:/s/a.deb", "a_1_amd64.deb", 100, sha(b"a" * 100)),
        AptDownload("copy:/s/b.deb", "b_1_amd64.deb", 100, sha(b"b" * 100)),
        AptDownload("copy:/s/c.deb", "c_1_amd64.deb", 50, sha(b"c" * 50)),
    ]
    have = sorted(kba.deb_entries(bundle, "apt") + kba.deb_entries(archives, kba.CACHE_POOL), key=lambda e: e["path"])
    plan = kbf.plan_fetches(have, [download.artifact() for download in wanted])
    assert [artifact.path for artifact, _ in plan.fetch] == ["apt/b_1_amd64.deb"]
    kba.seed_archives(plan, {"apt": bundle, kba.CACHE_POOL: archives}, archives)
    assert sorted(path.name for path in archives.glob("*.deb")) == ["a_1_amd64.deb", "c_1_amd64.deb"]
    assert (archives / "a_1_amd64.deb").samefile(good), "a reused deb is linked, not copied"
    assert not list(archives.glob("*.kimi-seed"))


def test_laying_out_moves_the_closure_in_and_drops_old_debs_and_old_signatures(tmp_path):
    apt_root = root(tmp_path / "r")
    apt_dir = tmp_path / "bundle" / "apt"
    kept = deb(apt_dir, "a_1_amd64.deb", b"a")
    apt_root.archives.mkdir(parents=True)
    (apt_root.archives / "a_1_amd64.deb").hardlink_to(kept)
    deb(apt_root.archives, "b_2_amd64.deb", b"b")
    deb(apt_dir, "b_1_amd64.deb", b"old b")
    for name in kba.GENERATED_NAMES:
        deb(apt_dir, name, b"stale")
    downloads = (AptDownload("u", "a_1_amd64.deb", 1, None), AptDownload("u", "b_2_amd64.deb", 1, None))
    fetch = kba.AptFetch(downloads, reused=("a_1_amd64.deb",), fetched=("b_2_amd64.deb",))
    assert kba.lay_out_repository(apt_root, fetch, apt_dir) == ["b_1_amd64.deb"]
    assert sorted(path.name for path in apt_dir.iterdir()) == ["a_1_amd64.deb", "b_2_amd64.deb"]
    assert list(apt_root.archives.glob("*.deb")) == [], "the archives directory is left empty"


def test_the_fetch_report_counts_bytes_fetched_and_reused():
    downloads = (AptDownload("u", "a.deb", 100, None), AptDownload("u", "b.deb", 30, None))
    fetch = kba.AptFetch(downloads, reused=("a.deb",), fetched=("b.deb",))
    assert (fetch.fetched_bytes, fetch.reused_bytes) == (30, 100)
    assert fetch.summary() == "2 debs: fetched 1 (30 bytes), reused 1 (100 bytes)"


def test_a_download_apt_did_not_store_or_stored_short_is_named(tmp_path):
    deb(tmp_path, "a.deb", b"12345")
    downloads = [AptDownload("u", "a.deb", 6, None), AptDownload("u", "b.deb", 1, None)]
    assert kba.missing_downloads(tmp_path, downloads) == [
        "a.deb: 5 bytes, the index says 6",
        "b.deb: apt reported success but did not store it",
    ]
