"""The README is a front page and the manual is docs/: every relative link and anchor resolves, the README stays
short, and every docs page is reachable from it. Pure file reading: no Ray."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> str:
    """The page without its fenced and indented code blocks (a link-like string there is code, not a link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced and not line.startswith("    "):
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", prose(page.read_text()), re.M)}


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z]+:", t)]


def test_the_slug_is_githubs() -> None:
    assert slug("Triton's tools: perf_analyzer") == "tritons-tools-perf_analyzer"
    assert slug("OpenAPI and /docs") == "openapi-and-docs"
    assert slug("Engines: the fastest correct one for the node") == "engines-the-fastest-correct-one-for-the-node"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken


def test_the_checker_finds_a_broken_link_and_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[a](missing.md) [b](#nowhere) [c](#top) [d](https://example.org)\n\n    [e](code.md)\n")
    assert links(page) == ["missing.md", "#nowhere", "#top"]
    assert anchors(page) == {"top"}


def test_the_readme_is_a_front_page_with_a_map_of_the_manual() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(REPO / "README.md")}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, unlinked  # every docs page is reachable from the front page
    assert "make serve" in readme and "make test" in readme  # the two set-up commands


def test_every_committed_result_is_shown_by_a_page() -> None:
    """Results are committed only where the docs cite them: each tracked file under benchmarks/results/ carries the
    stamp (date-time, or its time part after a page's full stamp) of a result set a page names."""
    tracked = subprocess.run(
        ["git", "ls-files", "benchmarks/results"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    text = "".join(p.read_text() for p in PAGES)
    cited = set(re.findall(r"\d{4}-\d{2}-\d{2}-\d{6}", text)) | set(re.findall(r"-(\d{6})-", text))
    cited |= set(re.findall(r"\d{4}-\d{2}-\d{2}-docs-chromium", text))
    uncited = []
    for path in tracked:
        stamp = re.search(r"\d{4}-\d{2}-\d{2}-(\d{6}|docs-chromium)", path)
        if stamp is None or not ({stamp[0], stamp[1]} & cited):
            uncited.append(path)
    assert not uncited, uncited


def test_the_configuration_reference_is_generated_and_lists_every_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.config import FrontArgs, RouterConfig
    from app.ops import config_reference

    text = config_reference.render()
    assert (REPO / "docs" / "configuration-reference.md").read_text() == text  # make lint checks the same
    for key in FrontArgs.model_fields:
        assert f"`args.front.{key}`" in text
    for key in RouterConfig.model_fields:
        assert f"`Router user_config.{key}`" in text
    stale = tmp_path / "reference.md"
    stale.write_text(text.replace("max_per_client", "max_per_user"))
    monkeypatch.setattr(config_reference, "OUT", stale)
    assert config_reference.main(["--check"]) == 1
    assert config_reference.main([]) == 0 and stale.read_text() == text
    assert config_reference.main(["--check"]) == 0
