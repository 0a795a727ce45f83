"""The documentation: the site builds with every warning an error, every ```python block of README.md and
of the pages under docs/ runs (on the GPU when there is one, else on the CPU: the examples choose the device
at run time), and the pages link only to pages of the site."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
#: What a fence may be tagged: Python runs; shell commands, a program's output and code for a launcher do not.
RUN, SHOWN = "python", ("sh", "text")
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")

if not (README.exists() and DOCS.is_dir()):
    pytest.skip("needs the repository checkout (README.md and docs/)", allow_module_level=True)


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def fenced_blocks(path: Path) -> list[tuple[str, int, str]]:
    """The fenced code blocks of a Markdown page: (language, the line of its first line of code, code)."""
    blocks, lines, index = [], path.read_text().splitlines(), 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        index += 1
        if opening is None:
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        start, body = index, []
        while index < len(lines) and not re.fullmatch(rf" *{fence[0]}{{{len(fence)},}} *", lines[index]):
            line = lines[index]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            index += 1
        if index == len(lines):
            raise AssertionError(f"{path.relative_to(ROOT)}:{start}: a code fence is never closed")
        index += 1
        blocks.append((opening["info"].strip().split(" ")[0], start + 1, "\n".join(body)))
    return blocks


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


PAGES_WITH_CODE = [page for page in pages() if any(language == RUN for language, _, _ in fenced_blocks(page))]

# Runs each page's Python blocks in order in a namespace of the page's own (a block may use what the blocks
# above it defined), each block compiled under the page's name and line numbers, so that a traceback points
# into the page; one process for every page, as importing torch takes longer than most pages' code. Writes
# each page's traceback, or None, to the results file.
_RUNNER = """
import json, sys, traceback
results = {}
for page, blocks in json.load(open(sys.argv[1])).items():
    namespace = {"__name__": "__main__"}
    try:
        for filename, line, code in blocks:
            exec(compile("\\n" * (line - 1) + code, filename, "exec"), namespace)
        results[page] = None
    except BaseException:
        results[page] = traceback.format_exc()
json.dump(results, open(sys.argv[2], "w"))
"""


def test_every_block_is_tagged():
    """A fence says whether it runs: python, or sh / text for what is shown only."""
    for page in pages():
        for language, line, _ in fenced_blocks(page):
            assert language == RUN or language in SHOWN, (
                f"{_name(page)}:{line - 1}: a code fence tagged {language!r}: tag Python as {RUN!r} (it runs "
                f"in the tests) and what must not run as one of {', '.join(SHOWN)}"
            )


def test_readme_and_docs_have_examples():
    assert README in PAGES_WITH_CODE
    assert len(PAGES_WITH_CODE) >= 10, [_name(page) for page in PAGES_WITH_CODE]


@pytest.fixture(scope="module")
def page_results(tmp_path_factory) -> dict[str, str | None]:
    """Every page's blocks run in a fresh Python process, from an empty directory: page -> traceback or None."""
    directory = tmp_path_factory.mktemp("docs_blocks")
    blocks = {_name(page): [(_name(page), line, code) for language, line, code in fenced_blocks(page) if language == RUN]
              for page in PAGES_WITH_CODE}
    (directory / "blocks.json").write_text(json.dumps(blocks))
    (directory / "runner.py").write_text(_RUNNER)
    environment = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE")}
    result = subprocess.run([sys.executable, "runner.py", "blocks.json", "results.json"], cwd=directory,
                            env=environment, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"the pages' blocks could not be run\n{result.stdout}\n{result.stderr}"
    return json.loads((directory / "results.json").read_text())


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_name)
def test_python_blocks_run(page, page_results):
    """Every ```python block of the page runs, in order, in a namespace of the page's own."""
    assert page_results[_name(page)] is None, f"{_name(page)}: a Python block failed\n{page_results[_name(page)]}"


def test_links_stay_in_the_site():
    """Relative links of the pages under docs/ lead to files under docs/ (the site holds nothing else)."""
    link = re.compile(r"\]\(([^)\s]+)\)")
    for page in sorted(DOCS.rglob("*.md")):
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in link.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            resolved = (page.parent / target.split("#")[0]).resolve()
            assert resolved.is_relative_to(DOCS.resolve()) and resolved.exists(), (
                f"{_name(page)} links to {target}, which is not a file of docs/"
            )


def test_site_builds_strict(tmp_path):
    """`mkdocs build --strict`: broken links and anchors, pages missing from the navigation and docstrings the
    API reference cannot parse are errors."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (python -m pip install --no-build-isolation '.[docs]')")
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "site" / "api" / "index.html").exists()
