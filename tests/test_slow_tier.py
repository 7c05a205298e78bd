"""make test-slow runs the slow tier as two processes, each a selection of files and keywords; together they must be
every test marked slow (a slow test elsewhere would otherwise never run)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _collected(*args: str) -> set[str]:
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "slow",
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return {line for line in p.stdout.splitlines() if "::" in line}


def test_the_two_processes_of_make_test_slow_run_every_slow_test():
    recipe = (ROOT / "Makefile").read_text().split("test-slow:")[1].split("\n\n")[0]
    parts = re.findall(r'\$\(SLOW\) (-k "[^"]+") ((?:tests/\S+ ?)+)', recipe)
    assert len(parts) == 2, recipe
    chosen = [_collected("-k", k[4:-1], *files.split()) for k, files in parts]
    everything = _collected("tests")
    assert chosen[0] and chosen[1] and not chosen[0] & chosen[1]
    assert chosen[0] | chosen[1] == everything, sorted(everything - chosen[0] - chosen[1])
