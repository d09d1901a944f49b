"""The air-gapped bundle (bin/kimi-bundle): the lab inventory's whole bundle built from the lab's cached mirrors,
then built again unchanged, then after a pin bump, then interrupted after its apt step and resumed.

The pin bump is one the lab's mirrors can serve: libnccl2/libnccl-dev to another placeholder version in the
lab's NVIDIA mirror and the nvidia-nccl-cu13 wheel to its other placeholder version (lab/mirrors/*.toml), so
the second build must fetch exactly those three files and reuse the rest by sha256. The interruption is
simulated at the end of the apt step (what a Ctrl-C there leaves: the staged apt repository in <OUT>.partial);
tests/local/test_bundle_build.py interrupts the real command with SIGINT.

The inventory is read once, by playbooks/bundle_inputs.yml as bin/kimi-bundle reads it (with a stand-in node
when the lab is not running), then the builds run through kimi_bundle_build in a temporary directory with a
throwaway signing key. Prints the figures only (no target is asserted); skips, saying why, without the lab's
mirrors (make lab-build), apt-ftparchive or gpg.

Run: .venv/bin/python bench/bench_bundle.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The collection's code through the checkout's collections/, the builder from contrib/kimi_tools (as under pytest).
sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(REPO / "contrib" / "kimi_tools"))
sys.path.insert(0, str(REPO / "lab"))

from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi  # noqa: E402
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_manifest as kbm  # noqa: E402
from kimi_tools import kimi_bundle_build as kbb  # noqa: E402
from kimi_tools import kimi_bundle_cli as cli  # noqa: E402
from kimi_tools.kimi_bundle_apt import AptSource  # noqa: E402
from kimi_tools.kimi_bundle_cli import format_bytes  # noqa: E402
from kimi_tools.kimi_bundle_wheels import PipSources  # noqa: E402
from labctl import mirrors_apt, mirrors_wheels, settings  # noqa: E402
from packaging.utils import canonicalize_name, parse_wheel_filename  # noqa: E402
from packaging.version import Version  # noqa: E402

NCCL_WHEEL = "nvidia-nccl-cu13"
NCCL_DEBS = ("libnccl2", "libnccl-dev")
STANDIN = "kimi_nodes:\n  hosts:\n    node1:\n      ansible_host: 127.0.0.1\n      ansible_port: 9\n"


def skip(reason: str) -> None:
    print(f"bench_bundle: skipped: {reason}")
    sys.exit(0)


class StopAfterAptError(Exception):
    """Raised at the end of the apt step: the build stops there as a Ctrl-C would."""


@dataclass(frozen=True)
class LabMirrors:
    nvidia: Path
    debian: Path
    wheelhouse: Path

    def sources(self) -> kbb.BuildSources:
        apt = tuple(AptSource(f"file:{path}", trusted=True) for path in (self.nvidia, self.debian))
        return kbb.BuildSources(apt, PipSources(find_links=(str(self.wheelhouse),)))


def lab_mirrors() -> LabMirrors:
    cache = settings.load_settings().cache
    apt, wheels = mirrors_apt.existing(cache), mirrors_wheels.existing(cache)
    if not (apt and wheels):
        skip(f"the lab's mirrors are not built under {cache} (make lab-build)")
    return LabMirrors(apt["nvidia"], apt["debian"], wheels["wheelhouse"])


def lab_variables(work: Path) -> dict[str, Any]:
    """The lab inventory's bundle inputs, read by the playbook (a stand-in node when the lab is not up)."""
    inventories = [str(REPO / "inventories" / "lab")]
    if not (REPO / "inventories" / "lab" / "hosts.yml").is_file():
        (work / "standin.yml").write_text(STANDIN)
        inventories.append(str(work / "standin.yml"))
    return cli.inventory_variables(inventories)


def deb_versions(repository: Path, package: str) -> set[str]:
    stanzas = kbm.parse_deb822((repository / "Packages").read_text())
    return {stanza["Version"] for stanza in stanzas if stanza.get("Package") == package}


def other_version(versions: set[str], pinned: str) -> str | None:
    others = sorted(versions - {pinned})
    return others[-1] if others else None


def bumped(variables: dict[str, Any], mirrors: LabMirrors) -> tuple[dict[str, Any], str]:
    """The variables with the NCCL debs and wheel moved to another version the mirrors hold."""
    deb_pins = dict(variables["kimi_deb_pins"])
    pip_pins = dict(variables["kimi_vllm_pip_pins"])
    debs = set.intersection(*(deb_versions(mirrors.nvidia, name) for name in NCCL_DEBS))
    new_deb = other_version(debs, deb_pins[NCCL_DEBS[0]])
    wheels = {
        str(version)
        for name, version, _, _ in map(parse_wheel_filename, (p.name for p in mirrors.wheelhouse.glob("*.whl")))
        if name == canonicalize_name(NCCL_WHEEL)
    }
    new_wheel = other_version(wheels, str(Version(pip_pins[NCCL_WHEEL])))
    if new_deb is None or new_wheel is None:
        skip("the lab's mirrors hold no second version of the NCCL debs and wheel to bump to")
    described = f"{'/'.join(NCCL_DEBS)} {deb_pins[NCCL_DEBS[0]]} -> {new_deb}, "
    described += f"{NCCL_WHEEL} {pip_pins[NCCL_WHEEL]} -> {new_wheel}"
    deb_pins.update(dict.fromkeys(NCCL_DEBS, new_deb))
    pip_pins[NCCL_WHEEL] = new_wheel
    return {**variables, "kimi_deb_pins": deb_pins, "kimi_vllm_pip_pins": pip_pins}, described


def steps(summary: kbb.BuildSummary) -> str:
    return (
        "; ".join(
            f"{step.step} {step.files} {step.unit} {step.seconds:.1f} s "
            f"(fetched {step.fetched}, {format_bytes(step.fetched_bytes)}; reused {step.reused})"
            for step in summary.steps
        )
        + f"; manifest {summary.seconds['manifest']:.1f} s"
    )


def timed(run: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    value = run()
    return value, time.monotonic() - started


def main() -> int:
    for program in ("apt-get", "apt-ftparchive", "gpg", "gpgv"):
        if shutil.which(program) is None:
            skip(f"no {program} (apt-utils, gnupg)")
    mirrors = lab_mirrors()
    with tempfile.TemporaryDirectory(prefix="kimi-bench-bundle-") as scratch:
        work = Path(scratch)
        variables = lab_variables(work)
        inputs = kbi.inputs_from_variables(variables)
        bump_variables, bump = bumped(variables, mirrors)
        sources, gnupg = mirrors.sources(), work / "gnupg"

        def build(out: Path, build_inputs: kbi.BuildInputs = inputs, **options: Any) -> kbb.BuildSummary:
            return kbb.build(build_inputs, sources, out, gnupg, **options)

        first = build(work / "bundle")
        print(
            f"bundle (lab inventory, {len(inputs.apt_pins)} apt pins, {len(inputs.pip_pins)} pip pins): first build "
            f"{summary_size(first)} in {first.seconds['total']:.1f} s: {steps(first)}"
        )
        problems, seconds = timed(lambda: kbb.verify(work / "bundle", first.fingerprint))
        print(f"bundle: verify (signature, sizes, sha256 of every file) {seconds:.1f} s, {len(problems)} problem(s)")
        again = build(work / "bundle")
        print(
            f"bundle: unchanged rebuild fetched {again.fetched} files ({format_bytes(again.fetched_bytes)}), reused "
            f"{again.reused} in {again.seconds['total']:.1f} s: {steps(again)}"
        )
        after_bump = build(work / "bundle", kbi.inputs_from_variables(bump_variables))
        print(
            f"bundle: after a pin bump ({bump}) fetched {after_bump.fetched} files "
            f"({format_bytes(after_bump.fetched_bytes)}), reused {after_bump.reused}, "
            f"in {after_bump.seconds['total']:.1f} s"
        )
        interrupted_build(build, work / "resumed")
    return 0


def summary_size(summary: kbb.BuildSummary) -> str:
    return f"{summary.bytes / 1e9:.2f} GB ({summary.files} files)"


def interrupted_build(build: Callable[..., kbb.BuildSummary], out: Path) -> None:
    def stop_after_apt(step: kbb.StepReport) -> None:
        if step.step == "apt":
            raise StopAfterAptError

    started = time.monotonic()
    try:
        build(out, on_step=stop_after_apt)
    except StopAfterAptError:
        stopped = time.monotonic() - started
    resumed = build(out)
    apt, wheels = resumed.steps
    print(
        f"bundle: interrupted after the apt step ({stopped:.1f} s), then resumed: apt fetched {apt.fetched} of "
        f"{apt.files} debs (reused {apt.reused}), wheels fetched {wheels.fetched} "
        f"({format_bytes(wheels.fetched_bytes)}), {resumed.seconds['total']:.1f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
