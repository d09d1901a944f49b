"""bin/kimi-bundle: build, verify and inspect an air-gapped bundle (docs/air-gapped.md).

    kimi-bundle build -i INVENTORY -o OUT --apt-source "[trusted=yes] file:/srv/debian ./" --pip-find-links DIR
                      [--hf-endpoint URL]   (the checkpoint's source; HF_TOKEN from the environment)
    kimi-bundle verify BUNDLE --fingerprint FPR [-i INVENTORY]
    kimi-bundle inputs -i INVENTORY
    kimi-bundle fingerprint [--gnupg-home DIR]

The inventory is read by playbooks/bundle_inputs.yml through ansible-playbook (on the controller, no node is
contacted); the build and the checks are kimi_bundle_build's.

Exit status: 0 done (verify: the bundle is complete, signed by that key and, with -i, built for the inventory);
1 the build failed, or the bundle has problems (verify: one per line); 2 bad flags or inventory values (one per
line, naming the flag or the variable); 130 interrupted (a build resumes from <OUT>.partial on the next run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_inputs import (
    BuildInputs,
    BundleInputError,
    canonical_json,
    inputs_from_variables,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_signature import normalise_fingerprint
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_tree import BundleError

from . import CHECKOUT
from . import kimi_bundle_build as kbb
from .kimi_bundle_apt import AptSource
from .kimi_bundle_apt import source_problems as apt_source_problems
from .kimi_bundle_wheels import PipSources
from .kimi_bundle_wheels import source_problems as pip_source_problems

REPO_ROOT = CHECKOUT
PLAYBOOK = Path("playbooks") / "bundle_inputs.yml"
INPUTS_FILE_VARIABLE = "kimi_bundle_inputs_file"
DEFAULT_GNUPG_HOME = "~/.kimi-bundle/gnupg"
PLAYBOOK_TIMEOUT_S = 600
ERROR_LINES_SHOWN = 15
# Where the checkpoint comes from when --hf-endpoint is not given: HF_ENDPOINT as the hf CLI reads it, else the Hub.
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
APT_SOURCE_EXAMPLE = "'[trusted=yes] file:/srv/mirror ./' or 'https://deb.debian.org/debian bookworm main'"
# The advisory snapshot a bundle carries when --advisories is not given: the one the kimi role's input check reads.
DEFAULT_ADVISORIES = REPO_ROOT / "roles" / "kimi" / "files" / "advisories.json"


class FlagError(ValueError):
    """Flags the command cannot run with; `problems` holds (flag, message) pairs."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(f"{flag}: {message}" for flag, message in self.problems))


class InventoryError(ValueError):
    """The inventory could not be read (ansible-playbook failed, or it has no node); the message says why."""


# ------------------------------------------------------------------------------------------ arguments


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the flag, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _inventory_flag(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument(
        "-i",
        "--inventory",
        action="append",
        required=required,
        metavar="INVENTORY",
        help="inventory (a directory or file, as ansible-playbook -i; repeatable)",
    )


def _gnupg_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gnupg-home",
        default=DEFAULT_GNUPG_HOME,
        help=f"GnuPG home holding the signing key, made there when it has none (default {DEFAULT_GNUPG_HOME})",
    )


def build_arg_parser(prog: str = "kimi-bundle") -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=prog,
        description="Build and verify the signed offline bundle (debs, wheels and optionally the checkpoint) an "
        "inventory's nodes install from. "
        "Exit 0: done; 1: build failed or bundle has problems; 2: bad flags or inventory values.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    build = commands.add_parser("build", help="build (or update) the bundle for an inventory")
    _inventory_flag(build, required=True)
    build.add_argument("-o", "--out", required=True, help="the bundle directory (empty, or an earlier bundle)")
    build.add_argument(
        "--apt-source",
        action="append",
        default=[],
        metavar="SOURCE",
        help=f"an apt repository as '[OPTIONS] URI SUITE [COMPONENT...]', e.g. {APT_SOURCE_EXAMPLE}; options: "
        "trusted=yes (an unsigned repository), signed-by=FILE (repeatable)",
    )
    build.add_argument("--apt-keyring", help="keyring that signs the --apt-source repositories without options")
    build.add_argument(
        "--pip-find-links", action="append", default=[], metavar="URL_OR_DIR", help="a wheelhouse (repeatable)"
    )
    build.add_argument("--pip-index-url", help="a package index (PEP 503), e.g. an internal PyPI mirror")
    build.add_argument(
        "--pip-trusted-host",
        action="append",
        default=[],
        metavar="HOST",
        help="a host pip may reach over plain HTTP, as pip's --trusted-host (repeatable)",
    )
    build.add_argument(
        "--hf-endpoint",
        default=os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT,
        metavar="URL",
        help="the Hub, or a mirror of it, the checkpoint comes from when the inventory sets kimi_bundle_checkpoint "
        "(default: $HF_ENDPOINT, else %(default)s); a token for a gated repository is read from $HF_TOKEN only",
    )
    build.add_argument(
        "--reuse-from", action="append", default=[], metavar="BUNDLE", help="an earlier bundle to reuse files from"
    )
    build.add_argument(
        "--advisories",
        default=str(DEFAULT_ADVISORIES),
        metavar="FILE",
        help="the advisory snapshot the bundle carries as advisories/advisories.json (default: %(default)s)",
    )
    _gnupg_flag(build)
    build.add_argument("--json", action="store_true", help="print one JSON object")
    verify = commands.add_parser("verify", help="check a bundle's signature, files and (-i) inputs")
    verify.add_argument("bundle", help="the bundle directory")
    verify.add_argument("--fingerprint", required=True, help="the signing key's fingerprint you trust (40 hex digits)")
    _inventory_flag(verify, required=False)
    inputs = commands.add_parser("inputs", help="print the inputs a bundle for the inventory is built from (JSON)")
    _inventory_flag(inputs, required=True)
    fingerprint = commands.add_parser("fingerprint", help="print the signing key's fingerprint (made if none)")
    _gnupg_flag(fingerprint)
    return parser


# --------------------------------------------------------------------------------------------- sources


def parse_apt_source(text: str, keyring: Path | None) -> AptSource:
    """One --apt-source: sources.list's one-line form without 'deb' ('[trusted=yes] URI SUITE [COMPONENT...]');
    a source without options is signed by --apt-keyring. FlagError names the flag."""
    tokens = text.split()
    options: dict[str, str] = {}
    if tokens and tokens[0].startswith("["):
        closing = next((index for index, token in enumerate(tokens) if token.endswith("]")), None)
        if closing is None:
            raise FlagError([("--apt-source", f"{text!r}: the options' '[' has no ']'")])
        for option in " ".join(tokens[: closing + 1])[1:-1].split():
            name, _, value = option.partition("=")
            options[name] = value
        tokens = tokens[closing + 1 :]
    unknown = sorted(set(options) - {"trusted", "signed-by"})
    if unknown:
        raise FlagError([("--apt-source", f"{text!r}: unknown option {', '.join(unknown)} (trusted=yes, signed-by=)")])
    if len(tokens) < 2:
        raise FlagError([("--apt-source", f"{text!r}: give URI and SUITE, e.g. {APT_SOURCE_EXAMPLE}")])
    trusted = options.get("trusted") == "yes"
    signed_by = Path(options["signed-by"]) if options.get("signed-by") else None
    if not trusted and signed_by is None:
        if keyring is None:
            raise FlagError(
                [("--apt-source", f"{text!r}: unsigned? say [trusted=yes]; signed? give --apt-keyring or [signed-by=]")]
            )
        signed_by = keyring
    return AptSource(tokens[0], tokens[1], tuple(tokens[2:]), trusted, signed_by)


def _absolute_location(location: str) -> str:
    """A find-links directory as an absolute path (pip and the build run elsewhere); URLs as given."""
    return location if urlsplit(location).scheme else str(kbb.absolute(location))


def _apt_sources(args: argparse.Namespace, problems: list[tuple[str, str]]) -> tuple[AptSource, ...]:
    keyring = None
    if args.apt_keyring:
        keyring = kbb.absolute(args.apt_keyring)
        if not keyring.is_file():
            problems.append(("--apt-keyring", f"{args.apt_keyring}: no such file"))
    if not args.apt_source:
        problems.append(("--apt-source", f"give at least one repository the debs come from, e.g. {APT_SOURCE_EXAMPLE}"))
    sources = []
    for text in args.apt_source:
        try:
            source = parse_apt_source(text, keyring)
        except FlagError as error:
            problems += error.problems
            continue
        problems += [("--apt-source", problem) for problem in apt_source_problems(source)]
        sources.append(source)
    return tuple(sources)


def _pip_sources(args: argparse.Namespace, problems: list[tuple[str, str]]) -> PipSources:
    sources = PipSources(
        index_url=args.pip_index_url,
        find_links=tuple(_absolute_location(link) for link in args.pip_find_links),
        trusted_hosts=tuple(args.pip_trusted_host),
    )
    if not sources.locations():
        problems.append(("--pip-find-links", "give a wheelhouse (--pip-find-links) or an index (--pip-index-url)"))
        return sources
    flags = {"--index-url": "--pip-index-url", "--find-links": "--pip-find-links"}
    for problem in pip_source_problems(sources):
        flag = next((ours for theirs, ours in flags.items() if f"pip source {theirs} " in problem), "--pip-find-links")
        problems.append((flag, problem))
    return sources


def _hub_source(args: argparse.Namespace, problems: list[tuple[str, str]]) -> kbb.HubSource:
    endpoint = (args.hf_endpoint or "").rstrip("/")
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        problems.append(("--hf-endpoint", f"{args.hf_endpoint!r} is not an http(s) URL, e.g. {DEFAULT_HF_ENDPOINT}"))
    # A token on the command line would show in ps and the shell's history: the environment only, as hf reads it.
    return kbb.HubSource(endpoint, os.environ.get("HF_TOKEN") or None)


def sources_from_args(args: argparse.Namespace) -> kbb.BuildSources:
    """The build's sources from the flags; FlagError names every bad flag."""
    problems: list[tuple[str, str]] = []
    apt = _apt_sources(args, problems)
    pip = _pip_sources(args, problems)
    hub = _hub_source(args, problems)
    advisories = Path(args.advisories).expanduser().absolute()
    if not advisories.is_file():
        problems.append(("--advisories", f"{args.advisories}: not a file (the snapshot bin/kimi-advisories writes)"))
    if problems:
        raise FlagError(problems)
    return kbb.BuildSources(apt, pip, hub, advisories)


def build_flag_problems(args: argparse.Namespace) -> list[tuple[str, str]]:
    """-o and --reuse-from, checked before the inventory is read (seconds) or anything is fetched."""
    problems = [("--out", problem) for problem in kbb.out_dir_problems(kbb.layout_for(Path(args.out)).out)]
    problems += [
        ("--reuse-from", f"{path}: not a directory (give an earlier bundle)")
        for path in args.reuse_from
        if not Path(path).is_dir()
    ]
    return problems


# ------------------------------------------------------------------------------------------- inventory


def ansible_playbook_program() -> str:
    """The ansible-playbook beside this Python (the repository's .venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.is_file():
        return str(beside)
    found = shutil.which("ansible-playbook")
    if found is None:
        raise InventoryError("ansible-playbook is not installed: run bin/kimi-bundle with the repository's .venv")
    return found


def playbook_command(program: str, repo_root: Path, inventories: Sequence[str], inputs_file: Path) -> list[str]:
    command = [program, str(repo_root / PLAYBOOK)]
    for inventory in inventories:
        command += ["-i", inventory]
    return [*command, "-e", json.dumps({INPUTS_FILE_VARIABLE: str(inputs_file)})]


def playbook_environment(repo_root: Path, base: Mapping[str, str]) -> dict[str, str]:
    """The repository's ansible.cfg unless the caller names another, results as JSON (failures are read for
    their msg), no colour."""
    environment = dict(base)
    environment.setdefault("ANSIBLE_CONFIG", str(repo_root / "ansible.cfg"))
    environment.setdefault("ANSIBLE_HOME", str(repo_root / ".ansible"))
    environment.update({"ANSIBLE_NOCOLOR": "1", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_FORCE_COLOR": "0"})
    return environment


def playbook_failure_lines(output: str) -> list[str]:
    """What went wrong, from ansible-playbook's output: each failed task's msg (results in JSON), else its
    error lines, else the output's tail."""
    lines = []
    for line in output.splitlines():
        if "FAILED! =>" in line:
            try:
                result = json.loads(line.split("FAILED! =>", 1)[1])
            except json.JSONDecodeError:
                lines.append(line.strip())
                continue
            lines.append(str(result.get("msg", line.strip())) if isinstance(result, dict) else line.strip())
        elif line.startswith(("ERROR!", "[ERROR]")):
            lines.append(line.strip())
    return lines or output.strip().splitlines()[-ERROR_LINES_SHOWN:]


def read_inputs_file(path: Path) -> dict[str, dict[str, Any]]:
    """{node: {variable: value}} as playbooks/bundle_inputs.yml writes it; InventoryError when it did not."""
    if not path.is_file():
        raise InventoryError("the inventory has no host in kimi_nodes: there is nothing to resolve its variables for")
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise InventoryError(f"{path}: not JSON ({error})") from None
    hosts = document.get("hosts") if isinstance(document, dict) else None
    if not isinstance(hosts, dict) or not hosts or not all(isinstance(v, dict) for v in hosts.values()):
        raise InventoryError(f"{path}: expected {{'hosts': {{node: {{variable: value}}}}}}, got {document!r:.200}")
    return hosts


def common_variables(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The one value of each variable every node resolves; BundleInputError names each variable whose value
    differs between nodes (one bundle serves them all) with the nodes on each side."""
    problems = []
    for variable in sorted({name for values in hosts.values() for name in values}):
        by_value: dict[str, list[str]] = {}
        for host, values in hosts.items():
            by_value.setdefault(canonical_json(values.get(variable)), []).append(host)
        if len(by_value) > 1:
            sides = "; ".join(f"{', '.join(names)}: {value}" for value, names in by_value.items())
            problems.append((variable, f"differs between nodes ({sides}): one bundle serves them all"))
    if problems:
        raise BundleInputError(problems)
    return dict(next(iter(hosts.values())))


Runner = Callable[..., subprocess.CompletedProcess]


def inventory_variables(
    inventories: Sequence[str], repo_root: Path = REPO_ROOT, run: Runner = subprocess.run
) -> dict[str, Any]:
    """The variables playbooks/bundle_inputs.yml resolves for the inventory's nodes (their common values)."""
    program = ansible_playbook_program()
    with tempfile.TemporaryDirectory(prefix="kimi-bundle-inputs-") as scratch:
        inputs_file = Path(scratch) / "inputs.json"
        try:
            result = run(
                playbook_command(program, repo_root, inventories, inputs_file),
                env=playbook_environment(repo_root, os.environ),
                cwd=repo_root,
                capture_output=True,
                text=True,
                timeout=PLAYBOOK_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise InventoryError(
                f"reading {', '.join(inventories)} with {PLAYBOOK}: no answer in {PLAYBOOK_TIMEOUT_S} s"
            ) from None
        if result.returncode != 0:
            failure = "\n".join(playbook_failure_lines(result.stdout + "\n" + result.stderr))
            raise InventoryError(f"reading {', '.join(inventories)} with {PLAYBOOK}:\n{failure}")
        hosts = read_inputs_file(inputs_file)
    return common_variables(hosts)


def inputs_from_inventory(inventories: Sequence[str], repo_root: Path = REPO_ROOT) -> BuildInputs:
    """BuildInputs from the inventory; BundleInputError names every bad variable."""
    return inputs_from_variables(inventory_variables(inventories, repo_root))


# ------------------------------------------------------------------------------------------- printing


def format_bytes(count: int) -> str:
    """Decimal units, as download sizes are usually quoted: 1.01 GB, 110.2 MB, 532 B."""
    size = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{count} B" if unit == "B" else f"{size:.{2 if size < 10 else 1}f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def step_line(step: kbb.StepReport) -> str:
    return (
        f"{step.step}: {step.files} {step.unit}, fetched {step.fetched} ({format_bytes(step.fetched_bytes)}), "
        f"reused {step.reused} ({format_bytes(step.reused_bytes)}), dropped {step.dropped}, {step.seconds:.1f} s"
    )


def summary_lines(summary: kbb.BuildSummary) -> list[str]:
    seconds = summary.seconds
    phases = ", ".join(f"{name} {value:.1f} s" for name, value in seconds.items() if name != "total")
    lines = [
        f"kimi-bundle: built {summary.bundle} for inventory {summary.inventory}: {summary.files} files, "
        f"{format_bytes(summary.bytes)}",
        f"  fetched {summary.fetched} files ({format_bytes(summary.fetched_bytes)}), reused {summary.reused} "
        f"({format_bytes(summary.reused_bytes)}) in {seconds.get('total', 0):.1f} s ({phases})",
        f"  signing key fingerprint: {summary.fingerprint}",
        f"  receivers check it with: bin/kimi-bundle verify BUNDLE --fingerprint {summary.fingerprint}",
    ]
    return lines + [f"  warning: {warning}" for warning in summary.warnings]


def verified_lines(bundle: Path, fingerprint: str, inventories: Sequence[str] | None) -> list[str]:
    info = kbb.bundle_info(bundle)
    built_for = info.built_for
    target = (
        f"{built_for['distribution']} {built_for['codename']} {built_for['architecture']}, "
        f"Python {built_for['python_version']}"
    )
    lines = [
        f"kimi-bundle: {bundle} verified: {info.files} files, {format_bytes(info.bytes)}, built {info.created_at} "
        f"for inventory {info.inventory} ({target}), signed by {fingerprint}"
    ]
    if inventories:
        lines.append(f"  built for exactly the inputs of {', '.join(inventories)}")
    return lines


def _write(stream: TextIO, lines: Sequence[str]) -> None:
    stream.write("".join(f"{line}\n" for line in lines))
    stream.flush()


def _errors(prog: str, lines: Sequence[str]) -> None:
    _write(sys.stderr, [f"{prog}: error: {line}" for line in lines])


def input_error_lines(error: BundleInputError) -> list[str]:
    return [f"{variable} {message}" for variable, message in error.problems]


# ------------------------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Context:
    prog: str
    repo_root: Path


def run_build(args: argparse.Namespace, context: Context) -> int:
    flag_problems = build_flag_problems(args)
    try:
        sources = sources_from_args(args)
    except FlagError as error:
        flag_problems += error.problems
    if flag_problems:
        _errors(context.prog, [f"argument {flag}: {message}" for flag, message in flag_problems])
        return 2
    inputs = inputs_from_inventory(args.inventory, context.repo_root)
    progress = None if args.json else (lambda step: _write(sys.stdout, [f"kimi-bundle: {step_line(step)}"]))
    layout = kbb.layout_for(Path(args.out))
    try:
        summary = kbb.build(
            inputs,
            sources,
            layout.out,
            Path(args.gnupg_home).expanduser(),
            reuse_from=[Path(path) for path in args.reuse_from],
            on_step=progress,
        )
    except BundleInputError:
        raise  # bad inventory values: exit 2 in cli_main, not a failed build
    except (BundleError, OSError) as error:  # a step, or the disk (full, read-only)
        resume = f"(the partial build in {layout.partial} resumes on the next run)" if layout.partial.is_dir() else ""
        _errors(context.prog, [f"build failed: {error}", *([resume] if resume else [])])
        return 1
    if args.json:
        _write(sys.stdout, [json.dumps(summary.to_dict(), indent=2, sort_keys=True)])
    else:
        _write(sys.stdout, summary_lines(summary))
    return 0


def run_verify(args: argparse.Namespace, context: Context) -> int:
    try:
        fingerprint = normalise_fingerprint(args.fingerprint)
    except ValueError as error:
        hint = "as `kimi-bundle fingerprint` and every build print it; a key id is not enough"
        _errors(context.prog, [f"argument --fingerprint: {error} ({hint})"])
        return 2
    wanted = inputs_from_inventory(args.inventory, context.repo_root) if args.inventory else None
    bundle = Path(args.bundle)
    problems = kbb.verify(bundle, fingerprint, wanted)
    if problems:
        _write(sys.stdout, [f"kimi-bundle: {bundle}: {len(problems)} problem(s), do not use it:", *problems])
        return 1
    _write(sys.stdout, verified_lines(bundle, fingerprint, args.inventory))
    return 0


def run_inputs(args: argparse.Namespace, context: Context) -> int:
    inputs = inputs_from_inventory(args.inventory, context.repo_root)
    _write(sys.stdout, [json.dumps(inputs.to_dict(), indent=2, sort_keys=True)])
    return 0


def run_fingerprint(args: argparse.Namespace, context: Context) -> int:
    _write(sys.stdout, [kbb.signing_fingerprint(Path(args.gnupg_home).expanduser())])
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, Context], int]] = {
    "build": run_build,
    "verify": run_verify,
    "inputs": run_inputs,
    "fingerprint": run_fingerprint,
}


def cli_main(argv: Sequence[str] | None = None, prog: str = "kimi-bundle", repo_root: Path = REPO_ROOT) -> int:
    """Run the CLI; returns the exit status (see the module's docstring)."""
    args = build_arg_parser(prog).parse_args(argv)
    context = Context(prog, repo_root)
    try:
        return COMMANDS[args.command](args, context)
    except BundleInputError as error:
        _errors(prog, input_error_lines(error))
        return 2
    except InventoryError as error:
        _errors(prog, str(error).splitlines())
        return 2
    except BundleError as error:
        _errors(prog, str(error).splitlines())
        return 1
    except KeyboardInterrupt:
        _errors(prog, ["interrupted (a build resumes from <OUT>.partial on the next run)"])
        return 130
