"""Every command the README and ``attnmeta --help`` show runs as written, in order, in a fresh folder
(the README's command table, its shell blocks, the help's examples): exit 0, or the exit the README
says. Left out, each for its reason: commands for a GPU, a placeholder (``--backend X``), the
minutes-long interpreter demo, and the SGLang launcher (tests/integrations/test_sglang_docs.py)."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from attnmeta.app import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()


def readme_commands() -> list[tuple[str, int]]:
    out = []
    for cmd, what, time in re.findall(r"^\| `((?:attnmeta|python) [^`]*)` \| (.*) \| ([^|]*) \|$", README, re.M):
        if " X" in cmd or "min" in time or what.startswith("GPU"):
            continue
        out.append((cmd, 0))
    for block in re.findall(r"```sh\n(.*?)```", README, re.S):
        for line in block.splitlines():
            if line.startswith(("attnmeta ", "python examples/serve.py")):
                cmd, _, note = line.partition("#")
                out.append((cmd.strip(), 2 if "exit 2" in note else 0))
    return out


def help_commands() -> list[tuple[str, int]]:
    return [(line.strip().split("   ")[0].strip(), 0) for line in cli.__doc__.split("examples:")[1].splitlines()
            if line.strip().startswith("attnmeta ")]


def run(cmd: str, cwd: str) -> tuple[int, str]:
    argv = shlex.split(cmd.replace("examples/", os.path.join(ROOT, "examples") + "/"))
    if argv[0] == "python":
        r = subprocess.run([sys.executable, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=600)
        return r.returncode, r.stdout[-1500:] + r.stderr[-1500:]
    here = os.getcwd()
    os.chdir(cwd)  # in this process: a command's own start-up is not what is tested
    try:
        return cli.main(argv[1:]), ""
    except SystemExit as e:
        return e.code, ""
    finally:
        os.chdir(here)


def test_there_are_commands_to_run():
    assert len(readme_commands()) >= 15 and len(help_commands()) == 7


def _runs(cmds: list[tuple[str, int]], cwd: str, serving: bool) -> None:
    """``serving``: the demos and benches (seconds each: the slow tier); else compile and inspect (CI)."""
    for cmd, want in cmds:
        if serving != cmd.startswith(("attnmeta demo", "attnmeta bench", "python ")):
            continue
        code, out = run(cmd, cwd)
        assert code == want, f"{cmd!r} exited {code}, the docs say {want}:\n{out}"


@pytest.mark.parametrize("source", ["readme", "help"])
def test_every_documented_compile_and_inspect_runs_in_order(source, tmp_path):
    _runs(readme_commands() if source == "readme" else help_commands(), str(tmp_path), serving=False)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["readme", "help"])
def test_every_documented_demo_and_bench_runs(source, tmp_path):
    cmds = readme_commands() if source == "readme" else help_commands()
    _runs([c for c in cmds if not c[0].startswith("python ")], str(tmp_path), serving=True)
    if source == "readme":  # the artifact the README's shell block compiles, then serves
        _runs([c for c in cmds if "mine.attnmeta" in c[0]], str(tmp_path), serving=False)
        _runs([c for c in cmds if c[0].startswith("python ")], str(tmp_path), serving=True)
