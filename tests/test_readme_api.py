"""The README's Python API example runs as written: two policies, one step, and its typed report."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- python-api -->\n```python\n(.*?)```", text, re.S)
    assert found, "README.md has no <!-- python-api --> block"
    return found.group(1)


@pytest.mark.slow
def test_the_readme_python_api_example_runs_as_written(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUTUAL_RL_PRESET_REPORT": "0"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    rows = [re.match(r"(\w+): reward ([\d.]+), (\d+) tokens sampled, (\d+) trained, entropy ([\d.]+|nan), rescued (\d+)", x)
            for x in lines[:2]]
    assert [r.group(1) for r in rows] == ["gpt2", "llama"], lines
    for r in rows:
        reward, sampled, trained, entropy = float(r.group(2)), int(r.group(3)), int(r.group(4)), float(r.group(5))
        assert 0.0 <= reward <= 1.0 and 8 * 4 <= sampled <= 8 * 4 * 32 and 0 <= trained <= sampled
        assert (entropy > 0) if trained else entropy != entropy  # NaN: no token trained
    # every response of each policy was delivered to the other (8 prompts x 4 samples)
    assert "'exchange/gpt2->llama/delivered': 32.0" in lines[2] and "'exchange/llama->gpt2/delivered': 32.0" in lines[2]
