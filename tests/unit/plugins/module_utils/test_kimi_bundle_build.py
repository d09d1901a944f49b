"""The bundle build's orchestration without apt, pip or gpg: where a build works, what it refuses before it
touches anything, how the staging area is tidied and seeded, how the new bundle replaces the old one (the
manifest last), the figures it reports, and the checks verify() adds on top of the mirror host's.

The real steps (apt, pip, gpg) run in tests/local/test_bundle_build.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from module_utils import kimi_bundle as kb
from module_utils import kimi_bundle_build as kbb
from module_utils.kimi_bundle_build import BuildLayout, BuildSummary, StepReport

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
UNSUPPORTED = (
    "kimi_bundle_checkpoint is true, but the checkpoint is not supported yet by bin/kimi-bundle: set it to false "
    "and bring the checkpoint to the site another way"
)


def write(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def names(directory: Path) -> list[str]:
    return sorted(path.relative_to(directory).as_posix() for path in directory.rglob("*") if not path.is_dir())


# ------------------------------------------------------------------------------------------- inputs


@pytest.mark.parametrize("value", [True, "yes", "true"])
def test_an_inventory_asking_for_the_checkpoint_is_refused_before_its_pin_is_judged(value):
    variables = {**VARIABLES, "kimi_bundle_checkpoint": value, "kimi_checkpoint_revision": "main"}
    assert kbb.unsupported_problems(variables) == [("kimi_bundle_checkpoint", UNSUPPORTED.split(" ", 1)[1])]
    assert str(kb.BundleInputError(kbb.unsupported_problems(variables))) == UNSUPPORTED


@pytest.mark.parametrize("value", [False, None, "no"])
def test_an_inventory_without_the_checkpoint_is_supported(value):
    assert kbb.unsupported_problems({**VARIABLES, "kimi_bundle_checkpoint": value}) == []


def test_inputs_with_a_checkpoint_are_refused_by_build_itself(tmp_path):
    inputs = kb.inputs_from_variables(
        {
            **VARIABLES,
            "kimi_bundle_checkpoint": True,
            "kimi_checkpoint_repo_id": "moonshotai/Kimi-K2-Instruct",
            "kimi_checkpoint_revision": "0" * 40,
        }
    )
    sources = kbb.BuildSources((), kbb.PipSources(find_links=(str(tmp_path),)))
    with pytest.raises(kb.BundleInputError) as caught:
        kbb.build(inputs, sources, tmp_path / "out", tmp_path / "gnupg")
    assert str(caught.value) == UNSUPPORTED
    assert not (tmp_path / "out").exists() and not (tmp_path / "gnupg").exists()


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
    for name in ("apt/x.deb", "wheels/y.whl", kb.MANIFEST_NAME, kb.SIGNATURE_NAME):
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
    inputs = kb.inputs_from_variables(VARIABLES)
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
        kb.MANIFEST_NAME,
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
    kbb.tidy_staging(staging)
    assert names(staging) == keep


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
    for name in ("apt/a.deb", "wheels/w.whl", kb.MANIFEST_NAME, kb.SIGNATURE_NAME):
        write(layout.staging / name, label)


def test_the_new_bundle_replaces_the_old_one_whole(tmp_path):
    layout = kbb.layout_for(tmp_path / "out")
    for name in ("apt/a.deb", "apt/old.deb", "wheels/w.whl", kb.MANIFEST_NAME, kb.SIGNATURE_NAME):
        write(layout.out / name, b"old")
    staged_bundle(layout, b"new")
    kbb.commit(layout)
    assert names(layout.out) == ["apt/a.deb", "kimi-bundle.json", "kimi-bundle.json.asc", "wheels/w.whl"]
    assert {path.read_bytes() for path in layout.out.rglob("*") if path.is_file()} == {b"new"}
    assert (layout.replaced / "apt/old.deb").read_bytes() == b"old"


def test_a_commit_cut_short_leaves_no_manifest_rather_than_the_old_one_over_new_files(tmp_path, monkeypatch):
    layout = kbb.layout_for(tmp_path / "out")
    for name in ("apt/a.deb", "wheels/w.whl", kb.MANIFEST_NAME, kb.SIGNATURE_NAME):
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
    assert not (layout.out / kb.MANIFEST_NAME).exists() and not (layout.out / kb.SIGNATURE_NAME).exists()
    assert kbb.verify(layout.out, "A" * 40) == [
        f"{layout.out}: no {kb.MANIFEST_NAME} here: not a bundle (bin/kimi-bundle build writes one) ({layout.partial} "
        "holds an interrupted build: run the build again)"
    ]
    # The next build seeds from what OUT and the staging area hold, so the new debs are not fetched again.
    monkeypatch.setattr(kbb, "_move", real_move)
    kbb.tidy_staging(layout.staging)
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
        f"{tmp_path / 'empty'}: no {kb.MANIFEST_NAME} here: not a bundle (bin/kimi-bundle build writes one)"
    ]


def test_an_unsigned_bundle_is_refused_naming_the_signature(tmp_path):
    inputs = kb.inputs_from_variables(VARIABLES)
    document = kb.manifest_document(inputs, [], datetime(2026, 3, 1, tzinfo=UTC))
    write(tmp_path / kb.MANIFEST_NAME, kb.manifest_text(document).encode())
    (problem,) = kbb.verify(tmp_path, "A" * 40)
    assert problem.startswith(f"{tmp_path}: {kb.SIGNATURE_NAME} is missing")


def bundle_document(tmp_path: Path, packages: str, wheels: list[str]) -> dict:
    write(tmp_path / "apt/Packages", packages.encode())
    for wheel in wheels:
        write(tmp_path / wheel)
    inputs = kb.inputs_from_variables(VARIABLES)
    return kb.manifest_document(inputs, kb.manifest_entries(tmp_path), datetime(2026, 3, 1, tzinfo=UTC))


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
