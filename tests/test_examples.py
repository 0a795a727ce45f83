"""The training scripts in examples/ run and learn: a short run on the CPU, its printed loss must fall."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


def run_example(name: str, *args: str) -> str:
    script = EXAMPLES / name
    if not script.exists():
        pytest.skip("needs the repository checkout (examples/)")
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_selective_copying_learns():
    output = run_example("selective_copying.py", "--device", "cpu", "--seed", "0", "--steps", "200", "--log-every", "50")
    logged = [(int(step), float(loss), float(accuracy))
              for step, loss, accuracy in re.findall(r"step\s+(\d+)\s+loss\s+([\d.]+)\s+accuracy\s+([\d.]+)", output)]
    assert [step for step, _, _ in logged] == [1, 50, 100, 150, 200], output
    (_, first_loss, _), (_, last_loss, last_accuracy) = logged[0], logged[-1]
    # Chance (guessing among the 8 data tokens) is a loss of ln 8 = 2.08 and an accuracy of 1/8; seed 0
    # reaches about 1.15 and 0.5 here, and 0.04 and 0.99 with the script's default 600 steps.
    assert last_loss < first_loss - 0.8, output
    assert last_loss < math.log(8) - 0.5 and last_accuracy > 0.3, output


def test_mamba_lm_learns_the_topics():
    """The Mamba language model beats what the previous token alone allows: it has learned to read the
    sequence's topic from its memory (the selective scan), not only the transitions."""
    output = run_example("mamba_lm.py", "--device", "cpu", "--seed", "0", "--steps", "200", "--log-every", "50")
    chance, previous_only, topic_known = (float(value) for value in re.search(
        r"loss at chance ([\d.]+), from the previous token ([\d.]+), and the topic too ([\d.]+)", output).groups())
    logged = [(int(step), float(loss)) for step, loss in re.findall(r"step\s+(\d+)\s+loss\s+([\d.]+)", output)]
    assert [step for step, _ in logged] == [1, 50, 100, 150, 200], output
    # Seed 0 starts near chance (3.47) and reaches about 1.72 here, under the previous token's 2.37.
    assert logged[0][1] > chance - 0.3, output
    assert logged[-1][1] < previous_only - 0.3 and logged[-1][1] > topic_known - 0.1, output
