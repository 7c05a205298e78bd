"""The README's SGLang snippets and the SGLang launcher example run (or, for the launcher, which
needs a GPU and a model, import and register) where SGLang is installed."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import importlib.util
import os

from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

from tests.test_readme import SNIPPETS, needs_sglang, run_snippet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ["attnmeta_triton", "attnmeta_flashinfer", "attnmeta_dsv4", "attnmeta_flashmla", "attnmeta_trtllm_mha",
         "attnmeta_fa3", "attnmeta_trtllm_mla", "attnmeta_cutedsl_mla"]
SGLANG_SNIPPETS = [k for k, s in enumerate(SNIPPETS) if needs_sglang(s)]


def test_the_readme_has_an_sglang_snippet():
    assert SGLANG_SNIPPETS


@pytest.mark.parametrize("k", SGLANG_SNIPPETS)
def test_readme_sglang_snippet_runs(k, capsys):
    run_snippet(k)
    assert str(NAMES) in capsys.readouterr().out


def test_the_launcher_registers_the_backends():
    spec = importlib.util.spec_from_file_location("sglang_server", os.path.join(ROOT, "examples", "sglang_server.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.BACKENDS == NAMES
    assert all(n in ATTENTION_BACKENDS for n in mod.BACKENDS)
    assert callable(mod.main)


def test_the_installed_launcher_is_sglangs_server_with_the_backends():
    """``attnmeta-sglang`` is an installed command: its entry point names the launcher, whose import
    registers every kind, and it takes SGLang's own arguments (``--help`` is SGLang's parser's)."""
    import subprocess
    import sys
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "attnmeta-sglang"]
    assert ep.value == "attnmeta.integrations.sglang.launch:main"
    r = subprocess.run([sys.executable, "-c", "import sys; from attnmeta.integrations.sglang.launch import BACKENDS, "
                        "main; print(BACKENDS); sys.argv = ['attnmeta-sglang', '--help']; main()"],
                       capture_output=True, text=True, timeout=300)
    assert str(NAMES) in r.stdout and "--attention-backend" in r.stdout and "attnmeta_triton" in r.stdout, \
        r.stderr[-2000:]


def test_every_documented_launch_is_a_served_case():
    """Each launch command docs/SGLANG.md shows is one test_sglang_serving / test_sglang_flashinfer starts
    from (the model and draft paths and the optional bracket aside)."""
    import re

    from tests.integrations.test_sglang_flashinfer import FLAGS as FI
    from tests.integrations.test_sglang_serving import FLAGS as TRITON

    text = open(os.path.join(ROOT, "docs", "SGLANG.md")).read()
    block = re.search(r"## Launching\n\n```sh\n(.*?)```", text, re.S).group(1).replace("\\\n", " ")
    served = [set(f) for f in (*TRITON.values(), *FI.values())]
    launches = [line for line in block.splitlines() if line.strip()]
    assert len(launches) == 5
    for line in launches:
        words = re.sub(r"\[.*?\]", "", line).split()
        flags = words[words.index("<model>") + 1:]
        if "--speculative-draft-model-path" in flags:
            i = flags.index("--speculative-draft-model-path")
            del flags[i : i + 2]
        assert any(set(flags) <= s for s in served), line
