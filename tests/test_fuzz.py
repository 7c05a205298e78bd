"""Every input boundary fuzzed (``tests/fuzz.py``): a typed error or the right result, never another
exception and never a crash. Each profile runs in a subprocess, so a crash fails this test (with
hypothesis' falsifying example in the output) instead of taking pytest down."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fuzz(profile: str, timeout: int) -> str:
    p = subprocess.run([sys.executable, "-m", "tests.fuzz", profile], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1")))
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}"
    return p.stdout


def test_fuzz_fast_profile():
    out = fuzz("fast", 600)
    assert "cases" in out and int(out.split("cases")[1].split()[0]) >= 300, out


@pytest.mark.slow
def test_fuzz_long_profile():
    """The long profile: 100,000 cases over every boundary (about 25 minutes on one core)."""
    out = fuzz("long", 4 * 3600)
    assert int(out.split("cases")[1].split()[0]) >= 100_000, out
