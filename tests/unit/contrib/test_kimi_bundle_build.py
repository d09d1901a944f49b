"""The bundle build's orchestration without apt, pip or gpg: where a build works, what it refuses before it
touches anything, how the staging area is tidied and seeded, how the new bundle replaces the old one (the
manifest last), the figures it reports, and the checks verify() adds on top of the mirror host's.

The real steps (apt, pip, gpg) run in tests/local/test_bundle_build.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_manifest as kbm
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_tree as kbt
from kimi_tools import kimi_bundle_build as kbb
from kimi_tools.kimi_bundle_build import BuildLayout, BuildSummary, StepReport

from tests.paths import REPO_ROOT

VARIABLES = {
    "kimi_bundle_inventory_name": "site-a",
    "kimi_bundle_distribution": "debian-12",
    "kimi_bundle_codename": "bookworm",
    "vllm_python_version": "3.11",
    "vllm_platforms": ["manylinux_2_36_x86_64"],
    "kimi_deb_pins": {"libnccl2": "2.30.7-1+cuda13.3"},
    "kimi_bundle_apt_packages": ["acl"],
    "kimi_vllm_pip_pins": {"jinja2": "3.1.6"},
    "checkpoint_hf_version": "2.4.0",
}
CHECKPOINT = {
    "kimi_bundle_checkpoint": True,
    "kimi_checkpoint_repo_id": "moonshotai/Kimi-K2-Instruct",
    "kimi_checkpoint_revision": "0" * 40,
    "kimi_checkpoint_include": ["*.json", "*.safetensors"],
    "kimi_checkpoint_exclude": ["original/*"],
}
REVISION = "0" * 40
HF_BASE = f"hf/moonshotai/Kimi-K2-Instruct/resolve/{REVISION}"
TREE = f"hf/api/models/moonshotai/Kimi-K2-Instruct/tree/{REVISION}"
REVISION_DOC = f"hf/api/models/moonshotai/Kimi-K2-Instruct/revision/{REVISION}"


def write(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def names(directory: Path) -> list[str]:
    return sorted(path.relative_to(directory).as_posix() for path in directory.rglob("*") if not path.is_dir())


# ------------------------------------------------------------------------------------------- inputs


def test_a_checkpoint_without_its_source_is_refused_before_anything_is_made(tmp_path):
    inputs = kbi.inputs_from_variables({**VARIABLES, **CHECKPOINT})
    sources = kbb.BuildSources((), kbb.PipSources(find_links=(str(tmp_path),)))
    with pytest.raises(kbb.BuildError) as caught:
        kbb.build(inputs, sources, tmp_path / "out", tmp_path / "gnupg")
    assert str(caught.value) == (
        "kimi_bundle_checkpoint is true: give the Hub (or a mirror of it) the checkpoint moonshotai/Kimi-K2-Instruct "
        "comes from (--hf-endpoint)"
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "gnupg").exists()
    assert kbb.hub_problems(inputs, kbb.BuildSources((), sources.pip, kbb.HubSource("https://hf.example"))) == []
    assert kbb.hub_problems(kbi.inputs_from_variables(VARIABLES), sources) == []


def test_the_hub_token_never_shows_in_a_printed_source():
    assert "hf_secret" not in repr(kbb.HubSource("https://huggingface.co", "hf_secret"))


# ------------------------------------------------------------------------------------------- layout


def test_the_partial_area_lies_beside_the_bundle_never_inside_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    layout = kbb.layout_for(Path("bundles/../lab"))
    assert layout == BuildLayout(tmp_path / "lab")
    assert layout.partial == tmp_path / "lab.partial"
    assert (layout.staging, layout.work, layout.replaced, layout.lock) == (
        tmp_path / "lab.partial/bundle",
        tmp_path / "lab.partial/work",
        tmp_path / "lab.partial/replaced",
        tmp_path / "lab.partial/lock",
    )


def test_an_empty_missing_or_earlier_bundle_directory_is_accepted(tmp_path):
    bundle = tmp_path / "bundle"
    assert kbb.out_dir_problems(bundle) == []
    for name in ("apt/x.deb", "wheels/y.whl", kbt.MANIFEST_NAME, kbt.SIGNATURE_NAME):
        write(bundle / name)
    assert kbb.out_dir_problems(bundle) == []


def test_a_directory_holding_anything_else_is_refused_naming_what(tmp_path):
    write(tmp_path / "home/.bashrc")
    write(tmp_path / "home/notes.txt")
    (tmp_path / "home/apt").mkdir()
    assert kbb.out_dir_problems(tmp_path / "home") == [
        f"{tmp_path / 'home'}: holds .bashrc, notes.txt, which a bundle build never writes: give an empty "
        "directory or an earlier bundle"
    ]
    write(tmp_path / "file")
    assert kbb.out_dir_problems(tmp_path / "file") == [f"{tmp_path / 'file'}: not a directory"]


def test_build_refuses_a_foreign_out_and_a_missing_reuse_bundle_before_anything_runs(tmp_path):
    write(tmp_path / "out/precious.txt")
    inputs = kbi.inputs_from_variables(VARIABLES)
    sources = kbb.BuildSources((), kbb.PipSources(find_links=(str(tmp_path),)))
    with pytest.raises(kbb.BuildError) as caught:
        kbb.build(inputs, sources, tmp_path / "out", tmp_path / "gnupg", reuse_from=[tmp_path / "nowhere"])
    assert "precious.txt, which a bundle build never writes" in str(caught.value)
    assert f"{tmp_path / 'nowhere'}: not a directory (--reuse-from takes an earlier bundle)" in str(caught.value)
    assert not (tmp_path / "out.partial").exists() and not (tmp_path / "gnupg").exists()


def test_one_build_at_a_time_per_bundle(tmp_path):
    layout = kbb.layout_for(tmp_path / "out")
    with kbb.build_lock(layout), pytest.raises(kbb.BuildError) as caught, kbb.build_lock(layout):
        pass
    assert str(caught.value) == f"{layout.out}: another build is running into it ({layout.lock} is locked)"
    with kbb.build_lock(layout):  # released
        pass


# ------------------------------------------------------------------------------------------ staging


def test_an_interrupted_runs_leftovers_are_tidied_but_its_debs_and_wheels_kept(tmp_path):
    staging = tmp_path / "staging"
    keep = ["apt/libc6_2.36_amd64.deb", "wheels/jinja2-3.1.6-py3-none-any.whl"]
    junk = [
        kbt.MANIFEST_NAME,
        ".kimi-bundle.json.abc.tmp",
        "apt/Packages",
        "apt/libc6_2.36_amd64.deb.kimi-seed",
        "apt/sub/x.deb",
        "wheels/jinja2-3.1.6-py3-none-any.whl.metadata",
        "wheels/index.html",
        "hf/config.json",
    ]
    for name in keep + junk:
        write(staging / name)
    (staging / "wheels/linked.whl").symlink_to(staging / keep[1])
    kbb.tidy_staging(staging, with_checkpoint=False)
    assert names(staging) == keep


def test_with_the_checkpoint_the_staged_hf_directory_is_left_to_its_step(tmp_path):
    staging = tmp_path / "staging"
    kept = ["hf/.partial/abc.part", "hf/org/name/resolve/sha/config.json"]
    for name in [*kept, "hf-stray.json"]:
        write(staging / name)
    kbb.tidy_staging(staging, with_checkpoint=True)
    assert names(staging) == kept


def test_seeding_links_every_deb_and_wheel_of_the_earlier_bundles_it_lacks(tmp_path):
    old, other, staging = tmp_path / "old", tmp_path / "other", tmp_path / "staging"
    write(old / "apt/a.deb", b"old a")
    write(old / "apt/Packages")
    write(old / "wheels/w-1.0-py3-none-any.whl", b"old w")
    write(other / "apt/a.deb", b"other a")
    write(other / "apt/b.deb", b"other b")
    write(staging / "wheels/w-1.0-py3-none-any.whl", b"interrupted run's w")
    (old / "apt/link.deb").symlink_to(old / "apt/a.deb")
    assert kbb.seed_staging(staging, [old, other, tmp_path / "missing"]) == 2
    assert names(staging) == ["apt/a.deb", "apt/b.deb", "wheels/w-1.0-py3-none-any.whl"]
    # The earlier bundle's file, not a copy of it (nothing is copied on one file system), and first come first served.
    assert (staging / "apt/a.deb").samefile(old / "apt/a.deb")
    assert (staging / "wheels/w-1.0-py3-none-any.whl").read_bytes() == b"interrupted run's w"


# ------------------------------------------------------------------------------------------- commit


def staged_bundle(layout: BuildLayout, label: bytes) -> None:
    for name in ("apt/a.deb", "wheels/w.whl", kbt.MANIFEST_NAME, kbt.SIGNATURE_NAME):
        write(layout.staging / name, label)


def test_the_new_bundle_replaces_the_old_one_whole(tmp_path):
    layout = kbb.layout_for(tmp_path / "out")
    for name in ("apt/a.deb", "apt/old.deb", "wheels/w.whl", kbt.MANIFEST_NAME, kbt.SIGNATURE_NAME):
        write(layout.out / name, b"old")
    staged_bundle(layout, b"new")
    kbb.commit(layout)
    assert names(layout.out) == ["apt/a.deb", "kimi-bundle.json", "kimi-bundle.json.asc", "wheels/w.whl"]
    assert {path.read_bytes() for path in layout.out.rglob("*") if path.is_file()} == {b"new"}
    assert (layout.replaced / "apt/old.deb").read_bytes() == b"old"


def test_the_checkpoint_is_swapped_with_the_rest_and_dropped_when_the_new_bundle_has_none(tmp_path):
    layout = kbb.layout_for(tmp_path / "out")
    write(layout.out / "hf/old.json", b"old")
    staged_bundle(layout, b"new")
    write(layout.staging / "hf/new.json", b"new")
    kbb.commit(layout)
    assert "hf/new.json" in names(layout.out) and "hf/old.json" not in names(layout.out)
    shutil.rmtree(layout.partial)
    staged_bundle(layout, b"newer")
    kbb.commit(layout)
    assert not (layout.out / "hf").exists()
    assert (layout.replaced / "hf/new.json").read_bytes() == b"new"


def test_a_commit_cut_short_leaves_no_manifest_rather_than_the_old_one_over_new_files(tmp_path, monkeypatch):
    layout = kbb.layout_for(tmp_path / "out")
    for name in ("apt/a.deb", "wheels/w.whl", kbt.MANIFEST_NAME, kbt.SIGNATURE_NAME):
        write(layout.out / name, b"old")
    staged_bundle(layout, b"new")
    real_move = kbb._move

    def cut_at_the_wheels(source: Path, target: Path) -> None:
        if source == layout.staging / "wheels":
            raise KeyboardInterrupt
        real_move(source, target)

    monkeypatch.setattr(kbb, "_move", cut_at_the_wheels)
    with pytest.raises(KeyboardInterrupt):
        kbb.commit(layout)
    assert not (layout.out / kbt.MANIFEST_NAME).exists() and not (layout.out / kbt.SIGNATURE_NAME).exists()
    assert kbb.verify(layout.out, "A" * 40) == [
        f"{layout.out}: no {kbt.MANIFEST_NAME} here: not a bundle (bin/kimi-bundle build writes one) ({layout.partial} "
        "holds an interrupted build: run the build again)"
    ]
    # The next build seeds from what OUT and the staging area hold, so the new debs are not fetched again.
    monkeypatch.setattr(kbb, "_move", real_move)
    kbb.tidy_staging(layout.staging, with_checkpoint=False)
    assert kbb.seed_staging(layout.staging, [layout.out]) == 1
    assert (layout.staging / "apt/a.deb").read_bytes() == b"new"


# ------------------------------------------------------------------------------------------ figures


def report(step: str, fetched: int, reused: int) -> StepReport:
    return StepReport(step, "files", fetched + reused, fetched, fetched * 100, reused, reused * 10, 1, 2.345)


def test_the_summary_adds_up_the_steps_and_reads_as_json():
    summary = BuildSummary(
        bundle="/b",
        inventory="lab",
        fingerprint="F" * 40,
        files=20,
        bytes=4000,
        steps=(report("apt", 3, 4), report("wheels", 0, 6)),
        seconds={"apt": 2.345, "wheels": 1.0, "total": 3.5},
        seeded=10,
    )
    assert (summary.fetched, summary.fetched_bytes, summary.reused, summary.reused_bytes) == (3, 300, 10, 100)
    data = summary.to_dict()
    assert data["steps"]["apt"] == {
        "files": 7,
        "fetched": 3,
        "fetched_bytes": 300,
        "reused": 4,
        "reused_bytes": 40,
        "dropped": 1,
        "seconds": 2.35,
    }
    assert data["seconds"] == {"apt": 2.35, "wheels": 1.0, "total": 3.5}
    assert (data["fetched_bytes"], data["fingerprint"], data["warnings"]) == (300, "F" * 40, [])


def test_the_clock_times_each_phase_and_the_whole(monkeypatch):
    ticks = iter([0.0, 1.0, 3.5, 4.0, 4.25, 10.0])
    monkeypatch.setattr(kbb.time, "monotonic", lambda: next(ticks))
    clock = kbb._Clock()
    with clock.phase("apt"):
        pass
    with clock.phase("wheels"):
        pass
    assert clock.totals() == {"apt": 2.5, "wheels": 0.25, "total": 10.0}


# ----------------------------------------------------------------------------------------- verification


def test_verify_names_a_directory_that_is_no_bundle(tmp_path):
    assert kbb.verify(tmp_path / "nowhere", "A" * 40) == [f"{tmp_path / 'nowhere'}: not a directory"]
    (tmp_path / "empty").mkdir()
    assert kbb.verify(tmp_path / "empty", "A" * 40) == [
        f"{tmp_path / 'empty'}: no {kbt.MANIFEST_NAME} here: not a bundle (bin/kimi-bundle build writes one)"
    ]


def test_an_unsigned_bundle_is_refused_naming_the_signature(tmp_path):
    inputs = kbi.inputs_from_variables(VARIABLES)
    document = kbm.manifest_document(inputs, [], datetime(2026, 3, 1, tzinfo=UTC))
    write(tmp_path / kbt.MANIFEST_NAME, kbt.manifest_text(document).encode())
    (problem,) = kbb.verify(tmp_path, "A" * 40)
    assert problem.startswith(f"{tmp_path}: {kbt.SIGNATURE_NAME} is missing")


def bundle_document(tmp_path: Path, packages: str, wheels: list[str]) -> dict:
    write(tmp_path / "apt/Packages", packages.encode())
    for wheel in wheels:
        write(tmp_path / wheel)
    inputs = kbi.inputs_from_variables(VARIABLES)
    return kbm.manifest_document(inputs, kbt.manifest_entries(tmp_path), datetime(2026, 3, 1, tzinfo=UTC))


def test_a_bundle_lacking_what_its_own_manifest_says_it_was_built_for_is_named(tmp_path):
    packages = "Package: acl\nVersion: 2.3.1-3\nArchitecture: amd64\n"
    document = bundle_document(tmp_path, packages, ["wheels/jinja2-3.1.6-py3-none-any.whl"])
    assert kbb.content_problems(tmp_path, document) == [
        "apt package libnccl2 2.30.7-1+cuda13.3 (built_for.apt_pins): not in the bundle's apt/Packages",
        "pip package huggingface-hub 2.4.0 (checkpoint_hf_version): no wheel for Python 3.11 on "
        "manylinux_2_36_x86_64 in the bundle",
    ]


def test_a_bundle_holding_what_it_was_built_for_has_no_content_problem(tmp_path):
    packages = (
        "Package: acl\nVersion: 2.3.1-3\nArchitecture: amd64\n\n"
        "Package: libnccl2\nVersion: 2.30.7-1+cuda13.3\nArchitecture: amd64\n"
    )
    wheels = ["wheels/jinja2-3.1.6-py3-none-any.whl", "wheels/huggingface_hub-2.4.0-py3-none-any.whl"]
    assert kbb.content_problems(tmp_path, bundle_document(tmp_path, packages, wheels)) == []


def test_absolute_keeps_a_symlink_named_as_out(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    assert kbb.absolute("link") == tmp_path / "link"
    assert kbb.out_dir_problems(kbb.absolute("link")) == [f"{tmp_path / 'link'}: not a directory"]
    assert kbb.absolute("~") == Path.home()


# ---------------------------------------------------------------------------------------- the checkpoint

CONFIG = b'{"model_type": "kimi_k2"}'
SHARD = b"weights" * 100


def checkpoint_bundle(tmp_path: Path, tree: list[dict] | None = None, skip: tuple[str, ...] = ()) -> dict:
    """A bundle with the checkpoint: config.json (a git file), one LFS shard, and original/ the patterns leave out."""
    write(tmp_path / "apt/Packages", b"")
    listing = (
        tree
        if tree is not None
        else [
            {"type": "file", "path": "config.json", "size": len(CONFIG), "oid": "1" * 40},
            {
                "type": "file",
                "path": "model-00001.safetensors",
                "size": 123,
                "oid": "2" * 40,
                "lfs": {"oid": hashlib.sha256(SHARD).hexdigest(), "size": len(SHARD)},
            },
            {"type": "directory", "path": "original", "oid": "3" * 40},
            {"type": "file", "path": "original/x.pt", "size": 5, "oid": "4" * 40},
        ]
    )
    write(tmp_path / TREE, json.dumps(listing).encode())
    write(tmp_path / REVISION_DOC, b"{}")
    for name, data in (("config.json", CONFIG), ("model-00001.safetensors", SHARD)):
        if name not in skip:
            write(tmp_path / HF_BASE / name, data)
    inputs = kbi.inputs_from_variables({**VARIABLES, **CHECKPOINT})
    return kbm.manifest_document(inputs, kbt.manifest_entries(tmp_path), datetime(2026, 3, 1, tzinfo=UTC))


def test_a_checkpoint_bundle_holding_every_selected_file_at_the_hubs_checksum_has_no_problem(tmp_path):
    assert kbb.checkpoint_problems(tmp_path, checkpoint_bundle(tmp_path)) == []


def test_a_missing_shard_and_one_of_another_size_or_checksum_are_named(tmp_path):
    document = checkpoint_bundle(tmp_path, skip=("model-00001.safetensors",))
    assert kbb.checkpoint_problems(tmp_path, document) == [
        f"{HF_BASE}/model-00001.safetensors: model-00001.safetensors of the checkpoint moonshotai/Kimi-K2-Instruct "
        f"at {REVISION} is not in the bundle"
    ]
    write(tmp_path / HF_BASE / "model-00001.safetensors", b"x" * len(SHARD))
    document = kbm.manifest_document(document_inputs(), kbt.manifest_entries(tmp_path), datetime.now(UTC))
    [problem] = kbb.checkpoint_problems(tmp_path, document)
    assert problem.startswith(f"{HF_BASE}/model-00001.safetensors: sha256 ")
    assert problem.endswith(f", the Hub lists {hashlib.sha256(SHARD).hexdigest()}")
    write(tmp_path / HF_BASE / "model-00001.safetensors", b"short")
    document = kbm.manifest_document(document_inputs(), kbt.manifest_entries(tmp_path), datetime.now(UTC))
    assert kbb.checkpoint_problems(tmp_path, document) == [
        f"{HF_BASE}/model-00001.safetensors: 5 bytes, the Hub lists {len(SHARD)}"
    ]


def document_inputs() -> kbi.BuildInputs:
    return kbi.inputs_from_variables({**VARIABLES, **CHECKPOINT})


def test_a_checkpoint_bundle_without_its_listing_or_with_a_bad_one_is_named(tmp_path):
    document = checkpoint_bundle(tmp_path)
    document["files"] = [entry for entry in document["files"] if entry["path"] != TREE]
    assert kbb.checkpoint_problems(tmp_path, document) == [
        f"{TREE}: not in the bundle, which claims the checkpoint moonshotai/Kimi-K2-Instruct at {REVISION}"
    ]
    document = checkpoint_bundle(tmp_path, tree=[{"type": "file", "path": "README.md", "size": 1}])
    assert kbb.checkpoint_problems(tmp_path, document) == [
        f"{TREE}: no file of the checkpoint moonshotai/Kimi-K2-Instruct at {REVISION} matches its include/exclude "
        "patterns"
    ]
    write(tmp_path / TREE, b"not json")
    [problem] = kbb.checkpoint_problems(tmp_path, document)
    assert problem.startswith(f"{TREE}: not the tree listing of the checkpoint moonshotai/Kimi-K2-Instruct")


def test_hf_files_in_a_bundle_built_without_the_checkpoint_are_named(tmp_path):
    write(tmp_path / "hf/stray.json")
    inputs = kbi.inputs_from_variables(VARIABLES)
    document = kbm.manifest_document(inputs, kbt.manifest_entries(tmp_path), datetime.now(UTC))
    assert kbb.checkpoint_problems(tmp_path, document) == [
        "hf/stray.json: the bundle was built without the checkpoint (kimi_bundle_checkpoint)"
    ]


def test_the_manifest_takes_a_steps_own_checksum_only_for_a_file_of_that_size(tmp_path):
    write(tmp_path / "hf/a.bin", b"12345")
    write(tmp_path / "hf/b.bin", b"12345")
    known = {"hf/a.bin": {"size": 5, "sha256": "a" * 64}, "hf/b.bin": {"size": 4, "sha256": "b" * 64}}
    entries = {entry["path"]: entry["sha256"] for entry in kbt.manifest_entries(tmp_path, known)}
    assert entries == {"hf/a.bin": "a" * 64, "hf/b.bin": hashlib.sha256(b"12345").hexdigest()}


def test_the_checkpoint_steps_figures_count_files_not_the_api_answers():
    from kimi_tools import kimi_bundle_hf as kbh

    files = (
        kbh.LayoutFile("x/a", 10, "a" * 64, kbh.FETCHED, "a"),
        kbh.LayoutFile("x/b", 20, "b" * 64, kbh.LINKED, "b"),
        kbh.LayoutFile("x/c", 30, "c" * 64, kbh.KEPT, "c"),
    )
    documents = (kbh.LayoutFile("api/tree", 2, "d" * 64, kbh.FETCHED),)
    fetched = kbh.CheckpointFetch("o/n", REVISION, files, documents, (), 10, 0, 50, ("x/old",))
    report = kbb.hf_report(fetched, 1.5)
    assert report.to_dict() == {
        "files": 3,
        "fetched": 1,
        "fetched_bytes": 10,
        "reused": 2,
        "reused_bytes": 50,
        "dropped": 1,
        "seconds": 1.5,
    }
    assert report.step == "hf"


# ------------------------------------------------------------------------------------ the advisory snapshot

SNAPSHOT = kbb.ADVISORIES_DIR + "/" + kbb.ADVISORIES_NAME
SHIPPED_ADVISORIES = REPO_ROOT / "roles" / "kimi" / "files" / "advisories.json"


def test_the_snapshot_is_staged_and_listed_in_the_manifest_with_its_checksum(tmp_path):
    staging = tmp_path / "staging"
    write(staging / SNAPSHOT, b"an interrupted run's copy")
    kbb.stage_advisories(staging, SHIPPED_ADVISORIES)
    content = SHIPPED_ADVISORIES.read_bytes()
    assert (staging / SNAPSHOT).read_bytes() == content
    assert kbt.manifest_entries(staging) == [
        {"path": SNAPSHOT, "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    ]
    kbb.stage_advisories(staging, None)
    assert not (staging / kbb.ADVISORIES_DIR).exists()


def test_a_snapshot_the_input_check_would_refuse_is_not_put_in_a_bundle(tmp_path):
    broken = write(tmp_path / "advisories.json", b'{"format": 1}')
    with pytest.raises(kbb.BuildError) as caught:
        kbb.stage_advisories(tmp_path / "staging", broken)
    assert str(caught.value) == (
        f"the advisory snapshot cannot go into the bundle: {broken}: snapshot must be an object with its date"
    )
    assert not (tmp_path / "staging").exists()


def test_the_snapshot_is_swapped_with_the_rest_of_the_bundle(tmp_path):
    layout = kbb.layout_for(tmp_path / "out")
    write(layout.out / SNAPSHOT, b"old")
    assert kbb.out_dir_problems(layout.out) == []
    staged_bundle(layout, b"new")
    write(layout.staging / SNAPSHOT, b"new")
    kbb.commit(layout)
    assert (layout.out / SNAPSHOT).read_bytes() == b"new"
    assert (layout.replaced / SNAPSHOT).read_bytes() == b"old"
