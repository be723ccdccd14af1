#!/usr/bin/env python3
"""Checks the documentation's internal links: every relative link in README.md,
ARCHITECTURE.md and the book (docs/src) names a file that exists and, with a
`#fragment`, a heading of that file (by the slug mdBook and GitHub give it); every page
of the book is listed in docs/src/SUMMARY.md, and every page listed exists.

Links to other sites are not fetched. Prints each broken link with its file and line,
and exits 1 when there is one.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "docs" / "src"
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(text: str) -> str:
    """The anchor of a heading: lower case, punctuation other than `-` and `_` dropped,
    spaces as hyphens (inline code and links reduced to their text)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(path: Path):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        marker = re.match(r"^\s*(```+|~~~+)", line)
        if marker:
            if fence is None:
                fence = marker.group(1)[:3]
            elif marker.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


def anchors(path: Path) -> set:
    found, seen = set(), {}
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
    return found


def documents():
    yield ROOT / "README.md"
    yield ROOT / "ARCHITECTURE.md"
    yield from sorted(BOOK.rglob("*.md"))


def main() -> int:
    broken = []
    cache = {}
    for document in documents():
        for number, line in prose_lines(document):
            for match in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                target = match.group(1) or match.group(2)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # another site, or mailto:
                path_part, _, fragment = target.partition("#")
                destination = (document.parent / path_part).resolve() if path_part else document
                where = f"{document.relative_to(ROOT)}:{number}"
                if not destination.exists():
                    broken.append(f"{where}: {target}: no such file")
                    continue
                if fragment and destination.suffix == ".md":
                    if destination not in cache:
                        cache[destination] = anchors(destination)
                    if fragment not in cache[destination]:
                        broken.append(f"{where}: {target}: no heading #{fragment} there")
    summary = BOOK / "SUMMARY.md"
    listed = set()
    for number, line in prose_lines(summary):
        for match in LINK.finditer(line):
            page = (BOOK / (match.group(1) or "")).resolve()
            listed.add(page)
            if not page.exists():
                broken.append(f"docs/src/SUMMARY.md:{number}: {match.group(1)}: no such page")
    for page in sorted(BOOK.rglob("*.md")):
        if page != summary and page.resolve() not in listed:
            broken.append(f"{page.relative_to(ROOT)}: not listed in docs/src/SUMMARY.md")
    # The plots must be what their figures render (scripts/plots.py).
    import plots

    stale = [name for name, content in plots.render().items()
             if not (BOOK / "results" / name).exists() or (BOOK / "results" / name).read_text() != content]
    broken.extend(f"docs/src/results/{name}: differs from figures.json; run python3 scripts/plots.py"
                  for name in stale)
    for line in broken:
        print(f"docs: {line}", file=sys.stderr)
    pages = sum(1 for page in BOOK.rglob("*.md") if page != summary)
    if broken:
        print(f"docs: {len(broken)} broken link(s)", file=sys.stderr)
        return 1
    print(f"docs: {pages} pages, every internal link and anchor found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
