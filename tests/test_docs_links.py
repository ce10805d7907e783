"""Every relative link in README.md and docs/*.md leads somewhere: the file exists, and an anchor names a heading of
the page it points to (GitHub's rule: the heading's text lowercased, punctuation dropped, spaces to '-', a repeated
heading suffixed -1, -2, ...). Links inside code blocks and code spans are not links; web links are not checked."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1)[^\n]|\n(?!\n))+?\1")   # within a paragraph
# [text](target) and ![alt](target); the target ends at whitespace (a title may follow) or the closing parenthesis.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ANCHOR = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, with their line numbers."""
    lines, fenced = [], None
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fenced:
            if fence and fence.group(1) == fenced:
                fenced = None
            continue
        if fence:
            fenced = fence.group(1)
            continue
        lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)                          # punctuation goes; letters, digits, _ and - stay
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link outside code; a link's text may run over a line break."""
    lines = dict(prose_lines(page.read_text(encoding="utf-8")))
    text = "\n".join(lines.get(n, "") for n in range(1, max(lines, default=0) + 1))
    text = CODE_SPAN.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def broken(page: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for number, target in links(page):
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):   # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / unquote(path)).resolve() if path else page
        where = f"{page.relative_to(root)}:{number}: ({target})"
        if not destination.exists():
            problems.append(f"{where}: {path} does not exist")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            problems.append(f"{where}: {destination.relative_to(root)} has no heading with the anchor #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert links(page) or page.name != "README.md"
    assert broken(page) == []


def test_github_anchor_rules():
    assert slug("Deploy rehearsal (`make rehearse`)") == "deploy-rehearsal-make-rehearse"
    assert slug("Environments (`cdk.json` context)") == "environments-cdkjson-context"
    assert slug("4. Acceptance: what still needs a real account") == "4-acceptance-what-still-needs-a-real-account"
    assert slug("System One (`/v1/systemone`)") == "system-one-v1systemone"
    assert slug("Alarms, dashboard and what to subscribe to") == "alarms-dashboard-and-what-to-subscribe-to"


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[fine](other.md#a-section) [here](#page) `[code](missing.md)` [over a\nline](#page)\n\n"
                    "[broken over a\nline](#nowhere-else)\n\n"
                    "```sh\n[fenced](missing.md)\n```\n\n[gone](missing.md) [no such](other.md#nowhere) "
                    "[web](https://example.com/x#y)\n")
    problems = broken(page, root=tmp_path)
    assert len(problems) == 3, problems
    assert problems[0].startswith("page.md:6: (#nowhere-else)") and "page.md has no heading" in problems[0]
    assert "missing.md does not exist" in problems[1] and "no heading with the anchor #nowhere" in problems[2]
