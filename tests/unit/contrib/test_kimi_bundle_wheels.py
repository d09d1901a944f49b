"""The pure parts of the bundle's wheelhouse step: pip's target and source options, what the nodes install
(the pin set, the overrides, the hf CLI), reading pip's report, log and failures into named messages, the
reuse bookkeeping on files, and the indexes.

pip itself runs in tests/local/test_bundle_wheels.py; the report, log and error samples here are copied from
pip 26.3 runs against the lab's wheelhouse.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_fetch as kbf
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from kimi_tools import kimi_bundle_wheels as kbw
from kimi_tools.kimi_bundle_wheels import (
    PipSet,
    PipSources,
    ResolvedWheel,
    WheelBundleError,
)

LAB = "/var/cache/kimi-lab/wheels/4d80adc551115ea8"
VARIABLES = {
    "kimi_bundle_inventory_name": "site-a",
    "kimi_bundle_distribution": "debian-12",
    "kimi_bundle_codename": "bookworm",
    "vllm_python_version": "3.11",
    "vllm_platforms": ["manylinux_2_36_x86_64"],
    "kimi_deb_pins": {},
    "kimi_vllm_pip_pins": {"vllm": "0.23.0", "torch": "2.11.0", "nvidia-nccl-cu13": "2.28.9"},
}
JINJA_SHA = "85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67"
MARKUPSAFE_SHA = "6da83a088f8ef93b2d483a8232a4dbf4d69d3d8496b568a03c56becac43e1808"
MARKUPSAFE = "markupsafe-3.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl"
# Trimmed from `pip install --dry-run --report` (pip 26.3): a requested wheel and a dependency, local files.
REPORT = {
    "version": "1",
    "pip_version": "26.3",
    "install": [
        {
            "download_info": {
                "url": f"file://{LAB}/jinja2-3.1.6-py3-none-any.whl",
                "archive_info": {"hashes": {"sha256": JINJA_SHA}, "hash": f"sha256={JINJA_SHA}"},
            },
            "is_direct": False,
            "requested": True,
            "metadata": {"name": "Jinja2", "version": "3.1.6"},
        },
        {
            "download_info": {
                "url": f"file://{LAB}/{MARKUPSAFE}",
                "archive_info": {"hashes": {"sha256": MARKUPSAFE_SHA}, "hash": f"sha256={MARKUPSAFE_SHA}"},
            },
            "is_direct": False,
            "requested": False,
            "metadata": {"name": "MarkupSafe", "version": "3.0.4"},
        },
    ],
}


def inputs(**changes) -> kbi.BuildInputs:
    return kbi.inputs_from_variables({**VARIABLES, **changes})


def wheel(filename: str, sha256: str | None = "a" * 64, requested: bool = False, url: str = "") -> ResolvedWheel:
    name, version = filename.split("-")[:2]
    return ResolvedWheel(
        name.replace("_", "-"), version, filename, url or f"file://{LAB}/{filename}", sha256, requested
    )


def request(**changes) -> kbw.WheelRequest:
    return kbw.WheelRequest.from_inputs(inputs(**changes))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(directory: Path, name: str, version: str, extra_dist_info: bool = False) -> Path:
    """A minimal wheel: a .dist-info with METADATA (what the index page and the .metadata files read)."""
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\n")
        archive.writestr(f"{name}/__init__.py", "")
        if extra_dist_info:
            archive.writestr(f"other-{version}.dist-info/METADATA", "Name: other\n")
    return path


# ------------------------------------------------------------------------------------ pip's options


def test_target_options_are_the_nodes_python_and_every_tag_their_glibc_accepts():
    options = kbw.target_options("3.11", ["manylinux_2_36_x86_64"])
    assert options[:7] == [
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--abi",
        "cp311",
        "--only-binary=:all:",
    ]
    platforms = options[8::2]
    assert platforms[0] == "manylinux_2_36_x86_64"
    # pip does not expand PEP 600 tags: markupsafe's manylinux2014 wheel needs these named.
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(platforms)
    assert set(options[7::2]) == {"--platform"}


@pytest.mark.parametrize(("python", "platforms"), [("3.1x", ["manylinux_2_36_x86_64"]), ("3.11", [])])
def test_target_options_refuse_what_pip_cannot_target(python, platforms):
    with pytest.raises(WheelBundleError):
        kbw.target_options(python, platforms)


def test_find_links_alone_mean_no_index_and_an_index_is_passed_as_given(tmp_path):
    # A wheelhouse that exists on every host (LAB's hash names one build of the lab's wheelhouse, not this one's).
    wheelhouse = str(tmp_path)
    assert PipSources(find_links=(wheelhouse,)).options() == ["--no-index", "--find-links", wheelhouse]
    index = PipSources("https://mirror.example/simple", trusted_hosts=("mirror.example",), cert="/etc/ca.pem")
    assert index.options() == [
        "--index-url",
        "https://mirror.example/simple",
        "--trusted-host",
        "mirror.example",
        "--cert",
        "/etc/ca.pem",
    ]


@pytest.mark.parametrize(
    ("sources", "problem"),
    [
        (PipSources(), "no pip source given"),
        (PipSources(find_links=("/nonexistent/wheels",)), "--find-links /nonexistent/wheels: does not answer"),
        (PipSources(find_links=("wheels",)), "--find-links wheels: give an http(s):// or file:// URL"),
        (PipSources(find_links=("--pre",)), "--find-links --pre: give a URL or an absolute path"),
        (PipSources("/srv/simple"), "--index-url /srv/simple: an index is a URL"),
        (PipSources(None, ("https://x/simple",), (LAB,)), "extra index URLs need an index URL"),
    ],
)
def test_sources_pip_cannot_use_are_named(sources, problem, tmp_path):
    if LAB in sources.find_links:
        sources = PipSources(None, sources.extra_index_urls, (str(tmp_path),))
    assert any(problem in line for line in kbw.source_problems(sources))
    with pytest.raises(WheelBundleError, match=r"pip source|no pip source|extra index"):
        sources.options()


def test_dry_run_arguments_put_the_requirements_last_and_no_deps_only_on_the_overrides(tmp_path):
    wanted = request(kimi_vllm_pip_overrides={"nvidia-nccl-cu13": "2.30.4"})
    run = kbw.PipRun(tmp_path)
    tool = kbw.PipTool(retries=0)
    resolved_set, overrides = wanted.sets[0], wanted.sets[1]
    arguments = kbw.dry_run_arguments(wanted, resolved_set, ["--no-index"], run, tool)
    assert arguments[:3] == ["install", "--dry-run", "--ignore-installed"]
    assert arguments[-2:] == ["torch==2.11.0", "vllm==0.23.0"] and "--no-deps" not in arguments
    assert arguments[arguments.index("--retries") + 1] == "0"
    assert arguments[arguments.index("--log") + 1] == str(run.log)
    assert kbw.dry_run_arguments(wanted, overrides, [], run, tool)[-2:] == ["--no-deps", "nvidia-nccl-cu13==2.30.4"]


def test_a_missing_interpreter_is_named(tmp_path):
    with pytest.raises(WheelBundleError, match=r"cannot run .*/no-python -m pip"):
        kbw.run_pip(kbw.PipTool(python=str(tmp_path / "no-python")), ["--version"], "pip --version")


# --------------------------------------------------------------------------------- what to install


def test_the_pin_set_is_resolved_without_the_names_an_override_replaces():
    sets = request(kimi_vllm_pip_overrides={"nvidia-nccl-cu13": "2.30.4"}).sets
    assert [(s.label, [r.text for r in s.requirements], s.no_deps) for s in sets] == [
        ("the vLLM pin set", ["torch==2.11.0", "vllm==0.23.0"], False),
        ("the overrides (--no-deps)", ["nvidia-nccl-cu13==2.30.4"], True),
        ("the pins an override replaces (--no-deps)", ["nvidia-nccl-cu13==2.28.9"], True),
    ]
    assert sets[1].requirements[0].label() == "pip package nvidia-nccl-cu13 2.30.4 (kimi_vllm_pip_overrides)"


def test_the_hf_cli_is_its_own_set_named_by_its_variable():
    sets = kbw.pip_sets(inputs(), hf_version="2.4.0")
    assert sets[-1].requirements == (kbw.PipRequirement("huggingface-hub", "2.4.0", "checkpoint_hf_version"),)
    assert len(sets) == 2 and not sets[-1].no_deps


@pytest.mark.parametrize("value", [2.4, "latest", "", ">=2.4"])
def test_an_hf_version_that_is_not_one_exact_version_is_refused_naming_the_variable(value):
    with pytest.raises(WheelBundleError, match="checkpoint_hf_version must be one exact version"):
        kbw.pip_sets(inputs(), hf_version=value)


# ------------------------------------------------------------------------------------- pip's report


def test_the_report_gives_each_wheel_its_file_url_and_sha256():
    wheels = kbw.parse_resolution_report(REPORT, "resolve")
    assert wheels == [
        ResolvedWheel(
            "jinja2",
            "3.1.6",
            "jinja2-3.1.6-py3-none-any.whl",
            REPORT["install"][0]["download_info"]["url"],
            JINJA_SHA,
            True,
        ),
        ResolvedWheel("markupsafe", "3.0.4", MARKUPSAFE, f"file://{LAB}/{MARKUPSAFE}", MARKUPSAFE_SHA, False),
    ]
    assert wheels[1].artifact() == kbf.Artifact(f"wheels/{MARKUPSAFE}", None, MARKUPSAFE_SHA)


def test_a_quoted_file_name_is_read_back_and_a_hash_given_only_as_hash_is_used():
    entry = {
        "download_info": {
            "url": f"file://{LAB}/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl",
            "archive_info": {"hash": "sha256=" + "b" * 64},
        },
        "metadata": {"name": "torch", "version": "2.13.0+cpu"},
    }
    (torch,) = kbw.parse_resolution_report({"install": [entry]}, "resolve")
    assert torch.filename == "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert (torch.version, torch.sha256) == ("2.13.0+cpu", "b" * 64)
    # An index page without hashes and with PEP 658 metadata: pip resolved without the file, so no sha256.
    entry["download_info"] = {"url": "https://files.example/torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"}
    entry["metadata"]["version"] = "2.13.0"
    assert kbw.parse_resolution_report({"install": [entry]}, "resolve")[0].sha256 is None


@pytest.mark.parametrize(
    ("url", "metadata", "message"),
    [
        ("https://files.example/jinja2-3.1.6.tar.gz", {"name": "jinja2", "version": "3.1.6"}, "not a wheel"),
        (f"file://{LAB}/jinja2-3.1.6-py3-none-any.whl", {"name": "jinja2", "version": "3.1.5"}, "holds jinja2 3.1.5"),
    ],
)
def test_a_report_entry_that_is_not_the_wheel_it_says_is_refused(url, metadata, message):
    entry = {"download_info": {"url": url}, "metadata": metadata}
    with pytest.raises(WheelBundleError, match=message):
        kbw.parse_resolution_report({"install": [entry]}, "resolve")
    with pytest.raises(WheelBundleError, match="no install list"):
        kbw.parse_resolution_report({"pip_version": "21.0"}, "resolve")


def test_sets_merge_by_file_name_and_two_files_under_one_name_are_refused():
    shared = wheel("tqdm-4.70.1-py3-none-any.whl", None)
    merged = kbw.merge_resolutions({"a": [shared, wheel("b-1-py3-none-any.whl")], "b": [wheel(shared.filename)]})
    assert [(w.filename, w.sha256) for w in merged] == [("b-1-py3-none-any.whl", "a" * 64), (shared.filename, "a" * 64)]
    with pytest.raises(WheelBundleError, match=r"tqdm-4.70.1-py3-none-any.whl: the sources offer two different files"):
        kbw.merge_resolutions({"a": [wheel(shared.filename)], "b": [wheel(shared.filename, "c" * 64)]})


# ------------------------------------------------------------------------------------ pip's failures


def test_a_pinned_version_the_sources_lack_names_the_pin_its_variable_and_what_they_have():
    output = (
        "ERROR: Could not find a version that satisfies the requirement jinja2==9.9 (from versions: 3.1.6)\n"
        "ERROR: No matching distribution found for jinja2==9.9\n"
    )
    pin_set = request(kimi_vllm_pip_pins={"jinja2": "9.9"}).sets[0]
    message = kbw.resolve_failure_message(output, pin_set, "Python 3.11 on manylinux_2_36_x86_64", "resolve")
    assert message.startswith(
        "resolve failed: pip package jinja2 9.9 (kimi_vllm_pip_pins): no wheel of this version for Python 3.11 on "
        "manylinux_2_36_x86_64 in the sources (they have 3.1.6)\npip said:\nERROR: Could not find a version"
    )


def test_a_dependency_without_a_wheel_names_what_requires_it():
    output = (
        "ERROR: Could not find a version that satisfies the requirement MarkupSafe>=2.0 (from jinja2) "
        "(from versions: none)\nERROR: No matching distribution found for MarkupSafe>=2.0 (from jinja2)\n"
    )
    pin_set = request(kimi_vllm_pip_pins={"jinja2": "3.1.6"}).sets[0]
    message = kbw.resolve_failure_message(output, pin_set, "Python 3.12 on manylinux_2_36_x86_64", "check")
    assert (
        "pip package MarkupSafe>=2.0, required by jinja2 (the vLLM pin set: kimi_vllm_pip_pins): no wheel for "
        "Python 3.12 on manylinux_2_36_x86_64 (they have no version of it for this Python and platform)"
    ) in message


def test_a_conflict_is_told_as_the_chain_of_requirements():
    output = (
        "Collecting vllm==0.23.0\nCollecting torch==2.11.0 (from vllm==0.23.0)\n"
        "ERROR: Cannot install nvidia-nccl-cu13==2.30.4 and vllm==0.23.0 because these package versions have "
        "conflicting dependencies.\n\nThe conflict is caused by:\n    The user requested nvidia-nccl-cu13==2.30.4\n"
        '    torch 2.11.0 depends on nvidia-nccl-cu13==2.28.9; platform_system == "Linux"\n\n'
    )
    pin_set = request(kimi_vllm_pip_pins={"vllm": "0.23.0", "nvidia-nccl-cu13": "2.30.4"}).sets[0]
    message = kbw.resolve_failure_message(output, pin_set, "Python 3.12", "resolve")
    assert (
        "the pins of the vLLM pin set (kimi_vllm_pip_pins) cannot be one environment: vllm 0.23.0 requires "
        "torch==2.11.0; torch 2.11.0 requires nvidia-nccl-cu13==2.28.9; you pinned nvidia-nccl-cu13==2.30.4"
    ) in message


def test_a_file_changed_since_the_resolve_is_named():
    output = (
        "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated ...\n"
        f"    jinja2==3.1.6 from file://{LAB}/jinja2-3.1.6-py3-none-any.whl#sha256={JINJA_SHA} (from -r r.txt "
        "(line 1)):\n        Expected sha256 0000\n             Got        1111\n"
    )
    message = kbw.download_failure_message(output, "pip download")
    assert message.startswith("pip download failed: jinja2-3.1.6-py3-none-any.whl (jinja2 3.1.6): its content differs")


def test_sources_pip_skipped_are_named_but_an_index_without_the_project_is_not():
    sources = PipSources("http://mirror:8080/simple", find_links=("http://mirror:8080/wheels/", "/srv/wheels"))
    log = (
        "2026-12-02T20:59:33,714 Could not fetch URL http://mirror:8080/wheels/: connection error: [Errno 111] "
        "Connection refused - skipping\n"
        "2026-12-02T20:59:33,739 Could not fetch URL http://mirror:8080/wheels/: connection error: [Errno 111] "
        "Connection refused - skipping\n"
        "2026-12-02T20:59:34,001 Could not fetch URL http://mirror:8080/simple/jinja2/: 404 Client Error: Not Found "
        "for url: http://mirror:8080/simple/jinja2/ - skipping\n"
    )
    output = (
        "WARNING: Location '/srv/wheels' is ignored: it is either a non-existing path or lacks a specific scheme.\n"
    )
    assert kbw.unanswered_sources(log, output, sources) == [
        "pip source --find-links http://mirror:8080/wheels/ does not answer: http://mirror:8080/wheels/: connection "
        "error: [Errno 111] Connection refused",
        "pip source --find-links /srv/wheels does not answer: it is either a non-existing path or lacks a specific "
        "scheme.",
    ]
    timeout = "Could not fetch URL http://mirror:8080/simple/jinja2/: timed out - skipping\n"
    assert kbw.unanswered_sources(timeout, "", sources) == [
        "pip source --index-url http://mirror:8080/simple does not answer: http://mirror:8080/simple/jinja2/: timed out"
    ]


# ------------------------------------------------------------------------------------- fetching


def test_downloads_are_batched_so_no_run_holds_a_name_twice_or_mixes_hashed_and_unhashed():
    wheels = [
        wheel("nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_17_x86_64.whl"),
        wheel("nvidia_nccl_cu13-2.30.4-py3-none-manylinux_2_17_x86_64.whl"),
        wheel("jinja2-3.1.6-py3-none-any.whl"),
        wheel("six-1.17.0-py2.py3-none-any.whl", None),
    ]
    batches = kbw.download_batches(wheels)
    assert [[w.filename.split("-")[1] for w in batch] for batch in batches] == [
        ["2.28.9", "3.1.6"],
        ["2.30.4"],
        ["1.17.0"],
    ]
    assert kbw.download_requirements_text(batches[0] + batches[2]) == (
        f"nvidia-nccl-cu13==2.28.9 --hash=sha256:{'a' * 64}\njinja2==3.1.6 --hash=sha256:{'a' * 64}\nsix==1.17.0\n"
    )


def test_only_whole_wheels_are_candidates_for_reuse(tmp_path):
    good = make_wheel(tmp_path, "good", "1.0")
    (tmp_path / ".good-1.0-py3-none-any.whl.part").write_bytes(b"half")
    (tmp_path / "good-1.0-py3-none-any.whl.kimi-seed").write_bytes(b"half")
    (tmp_path / "link-1.0-py3-none-any.whl").symlink_to(good.name)
    entries = kbw.wheel_entries(tmp_path, "cache")
    assert entries == [{"path": f"cache/{good.name}", "size": good.stat().st_size, "sha256": sha(good.read_bytes())}]
    assert kbw.wheel_entries(tmp_path / "absent", "cache") == []


def test_an_interrupted_runs_whole_download_is_moved_in_and_a_truncated_one_is_fetched(tmp_path):
    bundle, downloads = tmp_path / "wheels", tmp_path / "downloads"
    bundle.mkdir()
    downloads.mkdir()
    whole = make_wheel(downloads, "whole", "1.0")
    whole_sha = sha(whole.read_bytes())
    cut = make_wheel(downloads, "cut", "1.0")
    cut_sha = sha(cut.read_bytes())
    cut.write_bytes(cut.read_bytes()[:20])  # what an interrupted copy leaves under the final name
    wanted = [wheel(whole.name, whole_sha), wheel(cut.name, cut_sha)]
    have = kbw.wheel_entries(bundle, "wheels") + kbw.wheel_entries(downloads, kbw.CACHE_POOL)
    plan = kbf.plan_fetches(sorted(have, key=lambda e: e["path"]), [w.artifact() for w in wanted])
    assert [artifact.path for artifact, _ in plan.fetch] == [f"wheels/{cut.name}"]
    kbw.apply_reuse(plan, {"wheels": bundle, kbw.CACHE_POOL: downloads}, bundle)
    assert sha((bundle / whole.name).read_bytes()) == whole_sha and not whole.exists()
    assert not (bundle / cut.name).exists()
    assert kbw.staged_digests(downloads, wanted[1:])[1] == [
        f"{cut.name}: sha256 {sha(cut.read_bytes())}, the resolve said {cut_sha}"
    ]
    kbw.clear_directory(downloads)
    assert list(downloads.iterdir()) == []
    assert kbw.staged_digests(downloads, wanted[1:])[1] == [
        f"{cut.name}: pip download reported success but did not save it"
    ]


def test_dropping_keeps_the_wanted_wheels_their_metadata_and_the_indexes(tmp_path):
    names = ["a-1-py3-none-any.whl", "a-2-py3-none-any.whl", "b-1-py3-none-any.whl"]
    others = [f"{names[0]}.metadata", f"{names[1]}.metadata", ".a-2-py3-none-any.whl.part", *kbw.GENERATED_NAMES]
    for name in names + others:
        (tmp_path / name).write_text(name)
    assert kbw.drop_unwanted(tmp_path, [names[1], names[2]]) == [names[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*names[1:], f"{names[1]}.metadata", *kbw.GENERATED_NAMES]
    )


def test_fetch_counts_bytes_per_file():
    fetch = kbw.WheelFetch((), ("a.whl",), ("b.whl", "c.whl"), {"a.whl": 10, "b.whl": 5, "c.whl": 1})
    assert (fetch.reused_bytes, fetch.fetched_bytes) == (10, 6)
    assert fetch.summary() == "0 wheels: fetched 2 (6 bytes), reused 1 (10 bytes)"


# --------------------------------------------------------------------------------------- indexes


def test_the_lock_has_one_line_per_distribution_version_with_every_files_hash():
    wheels = [
        wheel("nvidia_nccl_cu13-2.30.4-py3-none-manylinux_2_17_x86_64.whl", "b" * 64),
        wheel("nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_17_x86_64.whl", "c" * 64),
        wheel("jinja2-3.1.6-py3-none-any.whl", JINJA_SHA),
    ]
    text = kbw.lock_text(wheels, request())
    assert text.splitlines() == [
        "# The bundle's wheels for Python 3.11 on manylinux_2_36_x86_64: one line per distribution version.",
        f"jinja2==3.1.6 --hash=sha256:{JINJA_SHA}",
        f"nvidia-nccl-cu13==2.28.9 --hash=sha256:{'c' * 64}",
        f"nvidia-nccl-cu13==2.30.4 --hash=sha256:{'b' * 64}",
    ]
    assert kbw.sums_text(wheels).splitlines()[0] == f"{JINJA_SHA}  jinja2-3.1.6-py3-none-any.whl"


def test_the_page_names_each_wheel_with_its_hash_and_its_metadatas():
    anchor = kbw.page_anchor("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "a" * 64, "b" * 64)
    assert anchor == (
        f'<a href="torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl#sha256={"a" * 64}" '
        f'data-core-metadata="sha256={"b" * 64}">torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl</a>'
    )
    assert kbw.index_page_text([anchor]).count("<br>\n") == 1


def test_write_indexes_writes_each_wheels_metadata_then_the_page_and_leaves_unchanged_files_alone(tmp_path):
    path = make_wheel(tmp_path, "tiny", "1.0")
    wheels = [wheel(path.name, sha(path.read_bytes()))]
    kbw.write_indexes(tmp_path, wheels, request())
    metadata = (tmp_path / f"{path.name}.metadata").read_bytes()
    assert metadata == b"Metadata-Version: 2.1\nName: tiny\n"
    assert f'data-core-metadata="sha256={sha(metadata)}"' in (tmp_path / "index.html").read_text()
    assert (tmp_path / "SHA256SUMS").read_text() == f"{wheels[0].sha256}  {path.name}\n"
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    kbw.write_indexes(tmp_path, wheels, request())
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    assert not list(tmp_path.glob(".*.part"))
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_wheel_with_two_dist_info_directories_is_refused(tmp_path):
    with pytest.raises(WheelBundleError, match=r"two-1.0-py3-none-any.whl: expected one .dist-info/METADATA, found 2"):
        kbw.wheel_metadata(make_wheel(tmp_path, "two", "1.0", extra_dist_info=True))


# ---------------------------------------------------------------------------------------- checking


def test_a_pin_pip_would_not_install_at_its_version_is_named_with_its_variable():
    pin_set = PipSet(
        "the vLLM pin set",
        (
            kbw.PipRequirement("torch", "2.13.0+cpu", "kimi_vllm_pip_pins"),
            kbw.PipRequirement("jinja2", "3.1", "kimi_vllm_pip_pins"),
        ),
    )
    chosen = [
        wheel("torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", requested=True),
        wheel("jinja2-3.1.0-py3-none-any.whl", requested=True),
    ]
    assert kbw.pins_not_resolved(chosen, pin_set, "the bundle") == [
        "pip package torch 2.13.0+cpu (kimi_vllm_pip_pins): pip would install version 2.13.0 from the bundle"
    ]
    assert kbw.pins_not_resolved([], pin_set, "the bundle")[1] == (
        "pip package jinja2 3.1 (kimi_vllm_pip_pins): pip would install nothing from the bundle"
    )
