"""CI (.ci/run) must run exactly the two set-up commands README.md gives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_ci_runs_the_readme_commands():
    readme, ci = ROOT / "README.md", ROOT / ".ci" / "run"
    if not (readme.exists() and ci.exists()):
        pytest.skip("needs the repository checkout")
    section = readme.read_text().split("## Set-up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", section, flags=re.S)
    assert len(commands) == 2, "README's Set-up section must hold the install and the test command"
    ci_lines = [line for line in ci.read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci_lines == commands
