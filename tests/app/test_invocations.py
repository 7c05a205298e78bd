"""Every invocation of tests/app/invocations.py as the installed ``attnmeta`` command answers it: exit 2 with one
line naming the fix, or exit 0 where the call is valid. Exit 1, exit 3 or a traceback fails.

The rows run in processes forked from one that loaded the command's entry point and imported torch once
(tests/app/forked_command.py: torch's import alone is 3 s of a core, and there are over 150 rows); the review's
own rows and ``--help`` also run through the installed executables themselves. Every row that broke its promise
is reported at once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.app.invocations import INVOCATIONS, OK, SPECS, Report, spec_text

ROOT = Path(__file__).resolve().parents[2]
BIN = os.path.dirname(sys.executable)
ATTNMETA = shutil.which("attnmeta", path=BIN)
# through the executables, one of each outcome (every row runs through the entry point in the test above; here the
# wiring of the installed command is what is checked, at a torch import each): an option refused before compiling,
# a spec refused after its build, the help (no torch), a compile
THROUGH_THE_SCRIPT = [INVOCATIONS[0], INVOCATIONS[4], (["--help"], OK), (["compile", "examples/mine.py:SPEC"], OK)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ATTNMETA_DUMP_DIR", None)  # a user's shell sets none
    env.pop("TRITON_INTERPRET", None)  # nor this: the commands choose (demo --kernels triton re-runs itself)
    return env


def _folder(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    mine = (ROOT / "examples" / "mine.py").read_text()
    for name in SPECS:
        (tmp_path / f"{name}.py").write_text(spec_text(mine, name))
    (tmp_path / "notpy.txt").write_text("not a spec\n")
    return tmp_path


def _broken(argv: list[str], says: str | None, rc: int, out: str, err: str) -> str | None:
    shown = f"attnmeta {' '.join(argv)}: exit {rc}\n{err[-1500:]}"
    if "Traceback" in out + err:
        return shown
    if says is OK:
        return None if rc == 0 else shown
    lines = [ln for ln in err.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("report: ", "dumps: "))]  # where a failed run's files went
    if isinstance(says, Report):
        lines = [ln for ln in lines if ln.startswith("attnmeta")][:1]
    if rc != 2 or len(lines) != 1 or says not in lines[0] or not lines[0].startswith("attnmeta"):
        return shown + f"\n(wanted exit 2 and one line containing {says!r})"
    return None


def _report(rows, results) -> None:
    broken = [b for (argv, says), r in zip(rows, results, strict=True) if (b := _broken(argv, says, *r))]
    assert not broken, f"{len(broken)} of {len(rows)} invocations broke the promise:\n\n" + "\n\n".join(broken)


@pytest.mark.skipif(ATTNMETA is None, reason="the attnmeta command is not installed (pip install -e .)")
def test_every_invocation_is_one_line_or_valid(tmp_path):
    cwd = _folder(tmp_path)
    p = subprocess.run([sys.executable, "-m", "tests.app.forked_command", str(cwd)], cwd=ROOT, env=_env(),
                       input=json.dumps([argv for argv, _ in INVOCATIONS]), capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    _report(INVOCATIONS, json.loads(p.stdout))
    assert len(INVOCATIONS) >= 150


@pytest.mark.skipif(ATTNMETA is None, reason="the attnmeta command is not installed (pip install -e .)")
def test_the_installed_executables_answer_the_same(tmp_path):
    cwd = _folder(tmp_path)
    results = [subprocess.run([ATTNMETA, *argv], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
               for argv, _ in THROUGH_THE_SCRIPT]
    _report(THROUGH_THE_SCRIPT, [(r.returncode, r.stdout, r.stderr) for r in results])


@pytest.mark.skipif(shutil.which("attnmeta-sglang", path=BIN) is None, reason="attnmeta-sglang is not installed")
def test_the_engine_command_without_the_engine_is_one_line():
    try:
        import sglang  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("SGLang is installed here: attnmeta-sglang --help is SGLang's server's help")
    r = subprocess.run([shutil.which("attnmeta-sglang", path=BIN), "--help"], capture_output=True, text=True,
                       timeout=120, env=_env())
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "SGLang" in line and "pip install" in line, line


def test_the_table_covers_every_mistaken_spec():
    used = {a[1].removesuffix(".py:SPEC") for a, _ in INVOCATIONS if len(a) > 1 and a[0] == "compile"}
    assert set(SPECS) <= used, set(SPECS) - used
