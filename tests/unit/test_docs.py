"""The design document is in the repository, and what cites it names sections that exist.

Every ``docs/design.md §N`` (or ``§N.M``) in a tracked file must be a heading of docs/design.md, every
README link into it must name a heading's anchor, and nothing may cite a design document outside the
repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def _texts() -> dict[Path, str]:
    texts = {}
    for path in _tracked():
        try:
            texts[path] = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def _sections() -> set[str]:
    return {m.group(1) for m in re.finditer(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", DESIGN.read_text(), re.M)}


def _anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation other than - and _ dropped, spaces → -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_section_reference_exists() -> None:
    sections = _sections()
    assert {"1", "2", "3", "4", "5", "2.5", "4.3"} <= sections, sections
    cited = {}
    for path, text in _texts().items():
        for m in re.finditer(r"docs/design\.md §(\d+(?:\.\d+)?)((?:/§\d+(?:\.\d+)?)*)", text):
            for ref in [m.group(1), *re.findall(r"§(\d+(?:\.\d+)?)", m.group(2))]:
                cited.setdefault(ref, []).append(path.relative_to(ROOT).as_posix())
    assert cited, "nothing cites docs/design.md"
    missing = {ref: files for ref, files in cited.items() if ref not in sections}
    assert not missing, missing


def test_readme_links_into_the_design_name_headings() -> None:
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", DESIGN.read_text(), re.M)}
    links = re.findall(r"\(docs/design\.md#([^)]+)\)", (ROOT / "README.md").read_text())
    assert links
    assert set(links) <= anchors, set(links) - anchors


def test_no_design_document_outside_the_repository_is_cited() -> None:
    offenders = [path.relative_to(ROOT).as_posix() for path, text in _texts().items()
                 if path.name != "test_docs.py" and re.search(r"DESIGN\.md|\.\./shared|/work/shared", text)]
    assert not offenders
