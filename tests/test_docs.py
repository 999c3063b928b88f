"""The documentation points at things that exist.

Checked in README.md, docs/*.md, tilefuse/**/README.md and benchmarks/**/*.md:
- every relative markdown link or image, ``[text](path)``, resolves from the document's folder;
- every backticked path that starts with docs/, benchmarks/, tilefuse/, tests/ or examples/ and
  names a file (its last part has an extension) exists from the repository root. ``<op>``, ``*`` and
  ``...`` stand for any text, ``{a,b}`` for each choice; a pytest id (``tests/x.py::test``) names
  its file.
And docs/perf/ holds exactly the results files docs/RESULTS.md cites, and every plot names the commit
and the torch and triton versions it was measured on.
"""

from __future__ import annotations

import itertools
import re
import struct
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_PATH = re.compile(r"`((?:docs|benchmarks|tilefuse|tests|examples)/[^`\s]+)`")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
FILE_NAME = re.compile(r"\.[A-Za-z0-9]{1,5}$")


def documents(repo: Path = REPO) -> list[Path]:
    docs = [repo / "README.md", *sorted((repo / "docs").glob("*.md")),
            *sorted((repo / "tilefuse").rglob("README.md")), *sorted((repo / "benchmarks").rglob("*.md"))]
    return [d for d in docs if d.is_file()]


def _prose(text: str) -> str:
    return FENCE.sub("", text)


def _choices(path: str) -> list[str]:
    """``a{1,2}b`` -> ``a1b``, ``a2b``."""
    parts = re.split(r"\{([^{}]*,[^{}]*)\}", path)
    fixed, options = parts[0::2], [p.split(",") for p in parts[1::2]]
    out = []
    for pick in itertools.product(*options):
        out.append("".join(f + (pick[i] if i < len(pick) else "") for i, f in enumerate(fixed)))
    return out


def _exists(base: Path, path: str) -> bool:
    for one in _choices(path):
        pattern = re.sub(r"<[^<>]*>|\.\.\.", "*", one)
        if "*" in pattern or "?" in pattern:
            if any(base.glob(pattern)):
                return True
        elif (base / pattern).exists():
            return True
    return False


def dead_references(doc: Path, repo: Path = REPO) -> list[str]:
    """What ``doc`` points at that is not there, as ``'doc: target'`` strings."""
    text = _prose(doc.read_text())
    where = doc.relative_to(repo)
    dead = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or an anchor in the same page
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not _exists(doc.parent, path):
            dead.append(f"{where}: link {target}")
    for cited in CODE_PATH.findall(text):
        path = cited.split("::", 1)[0].rstrip(".,;:)")
        if FILE_NAME.search(path) and not _exists(repo, path):
            dead.append(f"{where}: path {cited}")
    return dead


def test_docs_have_no_dead_links_or_missing_cited_files():
    docs = documents()
    assert REPO / "docs" / "RESULTS.md" in docs
    dead = [d for doc in docs for d in dead_references(doc)]
    assert not dead, "dead references:\n" + "\n".join(dead)


def test_the_checker_finds_dead_links_and_paths(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.csv").write_text("x\n")
    doc = tmp_path / "docs" / "page.md"
    doc.write_text("[ok](here.csv) [gone](gone.csv) [web](https://example.com) [top](#top)\n"
                   "`docs/here.csv` `docs/missing.csv` `docs/h*.csv` `docs/{here,nowhere}.csv` `docs/`\n"
                   "```\n[in a fence](fenced.csv)\n```\n")
    dead = dead_references(doc, tmp_path)
    assert dead == ["docs/page.md: link gone.csv", "docs/page.md: path docs/missing.csv"], dead


def test_results_folder_holds_what_results_page_cites():
    """docs/perf/ keeps the results files and plots that docs/RESULTS.md cites, and no others."""
    page = REPO / "docs" / "RESULTS.md"
    text = _prose(page.read_text())
    cited = {(page.parent / t.split("#", 1)[0]).resolve() for t in LINK.findall(text) if t.startswith("perf/")}
    cited |= {(REPO / p).resolve() for p in CODE_PATH.findall(text) if p.startswith("docs/perf/")}
    held = {p.resolve() for p in (REPO / "docs" / "perf").rglob("*") if p.is_file()}
    assert held, "no results files"
    uncited = sorted(str(p.relative_to(REPO)) for p in held - cited)
    assert not uncited, f"in docs/perf/ but not cited by docs/RESULTS.md: {uncited}"
    assert len(page.read_text().splitlines()) <= 200


def test_results_files_are_named_by_what_they_hold():
    """date, device, world and what: not the run or session that made them."""
    for path in (REPO / "docs" / "perf").rglob("*"):
        assert not re.search(r"(^|_)(s\d+c\d+|run\d+|call\d+|session\d*)(_|\.|$)", path.name), path


def png_text(path: Path) -> dict:
    """The ``tEXt`` chunks of a PNG file, ``{key: text}``."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    out, at = {}, 8
    while at + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"tEXt":
            key, _, text = data[at + 8:at + 8 + size].partition(b"\0")
            out[key.decode("latin-1")] = text.decode("latin-1")
        at += 12 + size
    return out


STAMP = re.compile(r"torch (\S+), triton (\S+), commit (\S+)$")


def test_every_plot_names_its_commit_and_versions():
    """Each PNG under docs/ carries what it was measured on (``python -m benchmarks plot`` writes it into
    the file), and that commit is named beside it in the results page."""
    pngs = sorted((REPO / "docs").rglob("*.png"))
    assert pngs, "no plots"
    results = (REPO / "docs" / "RESULTS.md").read_text()
    for png in pngs:
        facts = STAMP.search(png_text(png).get("Description", ""))
        assert facts, f"{png.name}: no 'torch X, triton Y, commit Z' in its Description"
        assert "not recorded" not in facts.group(0), f"{png.name}: {facts.group(0)}"
        assert f"`{facts.group(3)}`" in results, f"{png.name}: commit {facts.group(3)} not named in RESULTS.md"


def test_png_text_reads_the_chunks(tmp_path):
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I4s", len(body), kind) + body + struct.pack(">I", zlib.crc32(kind + body))

    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", b"\0" * 13) + chunk(b"tEXt", b"Description\0torch 1, "
                    b"triton 2, commit abc") + chunk(b"IEND", b""))
    assert png_text(png) == {"Description": "torch 1, triton 2, commit abc"}
