"""The apt sources a node has enabled: every repository URI with the file (and line) it comes from.

Preflight refuses, in an air-gapped site, any source other than the offline mirror: apt-get update would wait on it
and fail late. So this reads what apt itself reads, no more and no less: sources.list and the files of
sources.list.d that apt accepts (one-line ``*.list``, deb822 ``*.sources``), each entry as apt parses it. The
rules below were checked against apt 2.6 (``apt-get indextargets``; tests/unit/.../test_kimi_apt_sources.py does
so on every run where apt-get exists).

Pure stdlib: kimi_node_info runs it with the nodes' own python3.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

APT_ETC = Path("/etc/apt")  # apt's Dir::Etc
SOURCE_TYPES = ("deb", "deb-src")
# apt reads only these two extensions in sources.list.d; anything else (.save, .disabled, .dpkg-old) is skipped.
PART_SUFFIXES = (".list", ".sources")
# apt skips, like run-parts, a file whose name has any other character (a space, say) or starts with a dot.
PART_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
# apt's boolean words for "no" (StringToBool); any other value of Enabled leaves the stanza enabled, as in apt.
FALSE_WORDS = frozenset({"no", "false", "without", "off", "disable", "0"})


class AptSource(NamedTuple):
    """One repository URI apt will fetch, and where it is written (line: the entry's, or its URIs field's)."""

    file: str
    line: int
    uri: str


def _words(text: str) -> list[str]:
    """Whitespace-separated words, where [...] and "..." keep their spaces: apt's own word rule, so a bracketed
    options block or a cdrom:[Debian GNU/Linux ...]/ URI stays one word."""
    words, current, closer = [], "", ""
    for char in text:
        if closer:
            current += char
            closer = "" if char == closer else closer
        elif char.isspace():
            if current:
                words.append(current)
            current = ""
        else:
            current += char
            closer = {"[": "]", '"': '"'}.get(char, "")
    if current:
        words.append(current)
    return [word.replace('"', "") for word in words]


def _strip_comment(line: str) -> str:
    """The line up to its first '#' that is not inside an options block (apt allows '#' in option values)."""
    depth = 0
    for index, char in enumerate(line):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        elif char == "#" and depth == 0:
            return line[:index]
    return line


def parse_one_line(text: str, file: str) -> list[AptSource]:
    """``deb [options] URI suite [components]`` and ``deb-src`` lines (sources.list, *.list); comments skipped.

    A line apt would refuse (another type, no URI) yields nothing: apt-get update stops on it anyway, with its
    own message naming the file and line.
    """
    sources = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = _words(_strip_comment(line))
        if len(words) < 2 or words[0] not in SOURCE_TYPES:
            continue
        rest = words[1:]
        if rest[0].startswith("["):
            rest = rest[1:]  # the options block: arch=, signed-by=, trusted= ...
        if rest:
            sources.append(AptSource(file, number, rest[0]))
    return sources


def _stanzas(text: str) -> list[dict[str, tuple[int, str]]]:
    """deb822 stanzas as {field in lower case: (its line, its value)}.

    Only an empty line ends a stanza (apt reads a line of blanks as a continuation, not an end); '#' lines are
    skipped anywhere; a line starting with a blank continues the field before it; a field given twice keeps the
    last value, as apt does.
    """
    stanzas: list[dict[str, tuple[int, str]]] = []
    fields: dict[str, tuple[int, str]] = {}
    last = ""
    for number, line in enumerate([*text.splitlines(), ""], start=1):
        if line == "":
            if fields:
                stanzas.append(fields)
            fields, last = {}, ""
        elif line.startswith("#"):
            continue
        elif line[0].isspace():
            if last and line.strip():
                at, value = fields[last]
                fields[last] = (at, f"{value} {line.strip()}")
        elif ":" in line:
            name, _, value = line.partition(":")
            last = name.strip().lower()
            fields[last] = (number, value.strip())
    return stanzas


def parse_deb822(text: str, file: str) -> list[AptSource]:
    """Every URI of every enabled deb/deb-src stanza of a *.sources file (URIs may list several)."""
    sources = []
    for fields in _stanzas(text):
        if fields.get("enabled", (0, "yes"))[1].lower() in FALSE_WORDS:
            continue
        types = fields.get("types", (0, ""))[1].split()
        if not set(types) & set(SOURCE_TYPES) or "uris" not in fields:
            continue  # apt refuses such a stanza with its own message
        line, uris = fields["uris"]
        sources.extend(AptSource(file, line, uri) for uri in _words(uris))
    return sources


def source_files(apt_etc: Path = APT_ETC) -> list[Path]:
    """sources.list (when present), then the files of sources.list.d apt reads, in apt's (name) order."""
    files = [apt_etc / "sources.list"] if (apt_etc / "sources.list").is_file() else []
    parts = apt_etc / "sources.list.d"
    if parts.is_dir():
        files += sorted(
            entry
            for entry in parts.iterdir()
            if entry.name.endswith(PART_SUFFIXES)
            and not entry.name.startswith(".")
            and PART_NAME.fullmatch(entry.name)
            and entry.is_file()
        )
    return files


def read_apt_sources(apt_etc: Path = APT_ETC) -> list[dict[str, str | int]]:
    """Every enabled source URI of this node, as {file, line, uri} (JSON-ready for the module's result)."""
    sources: list[AptSource] = []
    for path in source_files(apt_etc):
        # errors="replace": a stray byte in a comment must not hide the file's sources from preflight.
        text = path.read_text(encoding="utf-8", errors="replace")
        parse = parse_deb822 if path.suffix == ".sources" else parse_one_line
        sources += parse(text, str(path))
    return [source._asdict() for source in sources]
