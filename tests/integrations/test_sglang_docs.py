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


def _recipe(sms: str | None = None) -> tuple[str, list[str]]:
    """docs/SGLANG.md's ahead-of-serving script as written (``<model>`` made this test's model; ``sms``: its SM
    count replaced), and the flags of the serve line that follows it (after ``--model-path <model>``)."""
    import re
    import shlex

    text = open(os.path.join(ROOT, "docs", "SGLANG.md")).read()
    section = text[text.index("### Compiling ahead of serving"):]
    code = re.search(r"```python\n(# compile_ahead\.py.*?)```", section, re.S).group(1)
    serve = re.search(r"```sh\n(ATTNMETA_ARTIFACT=.*?)\n```", section, re.S).group(1)
    assert code.count('"<model>"') == 1 and code.count("\nSMS = ") == 1
    from tests.integrations.sglang_server import model_dir

    code = code.replace('"<model>"', repr(model_dir()))
    if sms is not None:
        code = re.sub(r"\nSMS = \d+", f"\nSMS = {sms}", code)
    argv = shlex.split(serve)
    assert argv[:4] == ["ATTNMETA_ARTIFACT=triton.attnmeta", "attnmeta-sglang", "--model-path", "<model>"], argv
    return code, argv[4:]


def _run_recipe(code: str, where) -> str:
    import subprocess
    import sys

    (where / "compile_ahead.py").write_text(code)
    r = subprocess.run([sys.executable, "compile_ahead.py"], cwd=where, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and (where / "triton.attnmeta").exists(), r.stderr[-3000:]
    return r.stdout


def test_the_ahead_of_serving_recipe_runs_as_written_and_the_server_holds_its_artifact_to_what_it_resolved(
        tmp_path, monkeypatch):
    """The recipe, run as written with ``python compile_ahead.py`` in the engines' venv (a machine without a GPU,
    as the recipe says it may be): it writes the artifact, and a server started with the serve line's flags
    (SGLang's own parsing and resolution; this CPU server's backends see 0 SMs) refuses it naming only the SM
    count, both values. The recipe with the SM count this server has: the server takes the artifact (compiling
    nothing) and its decode steps equal SGLang's own triton backend's."""
    from attnmeta.compiler.ir.errors import OptionsError
    from tests.integrations.sglang_server import Server, decode
    from tests.integrations.test_sglang_serving import DECODE_FIELDS, lens, same, target

    code, flags = _recipe()
    out = _run_recipe(code, tmp_path)
    assert "triton.attnmeta: max_bs 32," in out and "sm_count 132" in out, out
    monkeypatch.setenv("ATTNMETA_ARTIFACT", str(tmp_path / "triton.attnmeta"))
    with pytest.raises(OptionsError) as e:
        Server(flags, rows=33)
    assert str(e.value).count(": compiled ") == 1 and "sm_count: compiled 132, SGLang 0" in str(e.value), e.value

    here = tmp_path / "cpu"
    here.mkdir()
    (here / "compile_ahead.py").write_text(_recipe(sms="0")[0])
    monkeypatch.chdir(here)  # run here, in this process: SGLang is imported once
    import runpy

    runpy.run_path("compile_ahead.py", run_name="__main__")
    monkeypatch.setenv("ATTNMETA_ARTIFACT", str(here / "triton.attnmeta"))
    server = Server(flags, rows=33)
    be, own = target(server), server.own("triton")
    assert be.attnmeta.compiled.options.max_bs == 32 == max(server.sizes)
    import random

    rng = random.Random(3)
    for n in (1, 7, 32):
        with server.active():
            fb = decode(server, rng.sample(range(1, 33), n), lens(rng, n, server.model_config.context_len))
            be.init_forward_metadata(fb)
            own.init_forward_metadata(fb)
        same(be.forward_metadata, own.forward_metadata, DECODE_FIELDS, n, f"decode of {n}")


def test_the_install_sentence_names_the_versions_sglang_pins():
    """docs/SGLANG.md's install line installs SGLang's released wheel (the ``sglang`` extra) and what it pins;
    the versions the sentence names are the ones that wheel's metadata requires (read from the wheel make test
    downloads, the one installed here), and the extra names that wheel's version."""
    import re
    import zipfile

    from tests.sglang_oracle import REQUIRED, VERSION, wheel

    path = wheel()
    assert path or not REQUIRED, "ATTNMETA_REQUIRE_SGLANG=1 but SGLang's wheel is not downloaded (make oracles)"
    if path is None:
        pytest.skip("SGLang's wheel is not downloaded (make oracles)")
    with zipfile.ZipFile(path) as z:
        meta = z.read(f"sglang-{VERSION}.dist-info/METADATA").decode()
    pins = dict(re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^;\s]+)", meta, re.M))
    text = open(os.path.join(ROOT, "docs", "SGLANG.md")).read()
    sentence = re.search(r"Install from a clone of attnmeta.*?what it pins \(.*?\)", text, re.S).group(0)
    sentence = sentence.replace("\n", " ")
    assert "pip install -e '.[sglang]'" in sentence and f"SGLang {VERSION}" in sentence, sentence
    named = dict(re.findall(r"([a-z_-]+) (\d+\.\d+\.\d+)", sentence.split("what it pins", 1)[1]))
    assert set(named) == {"torch", "sglang-kernel", "flashinfer_python", "sgl-flash-mla"}, named
    for package, version in named.items():
        assert pins.get(package) == version, (package, version, pins.get(package))
    project = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert f'sglang = ["sglang=={VERSION}"]' in project
