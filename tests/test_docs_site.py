"""The docs site builds with `mkdocs build --strict`, and the user-facing pages keep to what a user has."""
import os
import re
import subprocess
import sys

from markdown_it import MarkdownIt

from tests.common.transcripts import REPO, USER_PAGES

README = REPO / "README.md"


def test_the_site_builds_strict_every_page_in_the_nav_and_every_link_resolving(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                             str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr  # mkdocs.yml's validation turns an omitted page into an error


def test_no_user_page_points_into_tests():
    """A pip install has no tests/ folder: what users read must not send them there."""
    offenders = [f"{page.relative_to(REPO)}:{number}: {line.strip()}" for page in USER_PAGES
                 for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
                 if re.search(r"(^|[^\w.-])tests/", line)]
    assert not offenders, "\n".join(offenders)


def test_readme_is_the_front_door():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    first_block = next(t for t in MarkdownIt("commonmark").parse(text) if t.type == "fence")
    assert [line.split("#")[0].strip() for line in first_block.content.splitlines()] == ["make train", "make test"]


def test_readme_links_resolve():
    """mkdocs checks the links between docs pages; the README is not part of the site, so check its own."""
    links = [child.attrs["href"] for token in MarkdownIt("commonmark").parse(README.read_text(encoding="utf-8"))
             if token.type == "inline" for child in token.children or [] if child.type == "link_open"]
    local = [link.split("#")[0] for link in links if not re.match(r"[a-z]+://", link)]
    missing = [link for link in local if not (REPO / link).exists()]
    assert local and not missing, missing


def test_config_excerpts_match_the_example_project():
    """A ```yaml block headed `# conf/PATH: ...` shows lines of examples/my_project/conf/PATH, in order."""
    project = REPO / "examples" / "my_project"
    excerpts = [token.content.splitlines() for page in USER_PAGES
                for token in MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))
                if token.type == "fence" and token.info.strip() == "yaml" and token.content.startswith("# conf/")]
    assert excerpts
    for first, *shown in excerpts:
        lines = iter((project / first[2:].split(":")[0]).read_text(encoding="utf-8").splitlines())
        assert all(line in lines for line in shown), first  # `in` on an iterator: in order
