"""Compile ahead of serving: an artifact saved, loaded without a pass, equal to the compile it
came from; stale or unreadable artifacts refused with the command that rebuilds them; a fresh
process serving from one."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

from attnmeta.backends import get_spec, list_backends
from attnmeta.backends.triton.spec import TritonOptions
from attnmeta.compiler import ArtifactError, CompileOptions, compile_backend, load_compiled
from tests.batches import make_batch, make_pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MINE = os.path.join(ROOT, "examples", "mine.py")


def _every_mode(name: str) -> CompileOptions:
    modes = [m.name.lower() for m in get_spec(name).modes if m.name != "EXTEND"]
    return CompileOptions(max_bs=8, capture_sizes=(1, 4, 8), max_context_len=600, modes=modes,
                          page_size=256 if "dsv4" in name else (get_spec(name).page_sizes or (1,))[0])


@pytest.mark.parametrize("name", list_backends())
def test_a_loaded_artifact_is_the_compile_it_came_from(name, tmp_path):
    cb = compile_backend(name, _every_mode(name))
    loaded = load_compiled(cb.save(str(tmp_path / "a.attnmeta")))
    assert sorted(loaded.plans) == sorted(cb.plans) and loaded.options == cb.options
    for key, p in cb.plans.items():
        q = loaded.plans[key]
        assert q.graph == p.graph and q.binding.describe() == p.binding.describe()
        assert q.in_gm.code == p.in_gm.code and q.out_gm.code == p.out_gm.code
    assert loaded.summary() == cb.summary()


def test_every_plan_shaping_option_survives_the_artifact(tmp_path):
    """Options that change plans (the device and heads of triton's split heuristic, triton's own split cap)
    come back as they were: a size compiled on demand after loading must see them too."""
    opts = CompileOptions(max_bs=8, capture_sizes=(2, 8), max_context_len=256, sm_count=78, num_heads=64,
                          num_kv_heads=4, backend=TritonOptions(max_kv_splits=4), num_draft_tokens=3,
                          modes=("decode", "target_verify"))
    cb = compile_backend("triton", opts)
    loaded = load_compiled(cb.save(str(tmp_path / "a.attnmeta")))
    assert loaded.options == cb.options
    from attnmeta.runtime import ForwardMode

    assert loaded.specialize(ForwardMode.DECODE, 5).graph == cb.specialize(ForwardMode.DECODE, 5).graph


def test_a_backends_own_options_come_back_typed(tmp_path):
    """DSV4's options (a tuple field among them) are stored as their fields and made back by the spec's own
    options class; a plan compiled after loading sees them (with c128 only, decode is one kernel)."""
    from attnmeta.backends.dsv4.spec import DSV4Options
    from attnmeta.runtime import ForwardMode

    opts = CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=512, page_size=256,
                          backend=DSV4Options(index_topk=1024, compress_ratios=(128,)))
    loaded = load_compiled(compile_backend("dsv4", opts).save(str(tmp_path / "d.attnmeta")))
    assert loaded.options.backend == DSV4Options(index_topk=1024, compress_ratios=(128,))
    assert loaded.kernels(ForwardMode.DECODE, 3) == 1


def test_loaded_backend_serves_the_same_metadata(tmp_path):
    opts = CompileOptions(max_bs=8, capture_sizes=(4, 8), max_context_len=64, modes=("decode", "target_verify"))
    cb = compile_backend("flashinfer", opts)
    loaded = load_compiled(cb.save(str(tmp_path / "a.attnmeta")))
    pool = make_pool(10, 64)
    a, b = cb.instantiate(pool), loaded.instantiate(pool)
    for mode in ("DECODE", "TARGET_VERIFY", "DECODE"):
        from attnmeta.runtime import ForwardMode

        fb = make_batch(5, 64, 10, seed=len(mode), max_len=60, mode=ForwardMode[mode])
        a.init_forward_metadata(fb)
        b.init_forward_metadata(fb)
        for field, want in vars(a.forward_metadata).items():
            if isinstance(want, torch.Tensor):
                assert torch.equal(getattr(b.forward_metadata, field), want), field


def test_loading_runs_no_pass(tmp_path, monkeypatch):
    path = compile_backend("triton", _every_mode("triton")).save(str(tmp_path / "a.attnmeta"))

    def no_pass(name):
        raise AssertionError(f"pass {name} ran while loading an artifact")

    monkeypatch.setattr("attnmeta.compiler.pipeline.get_pass", no_pass)
    assert load_compiled(path).timing.seconds.keys() == {"load"}


def test_a_changed_spec_makes_the_artifact_stale(tmp_path):
    mine = tmp_path / "mine.py"
    shutil.copy(MINE, mine)
    path = compile_backend(f"{mine}:SPEC", CompileOptions(max_bs=4)).save(str(tmp_path / "a.attnmeta"))
    load_compiled(path)
    mine.write_text(mine.read_text() + "\n# an edit\n")
    with pytest.raises(ArtifactError, match=r"is stale \(spec_source changed\); rebuild it with `attnmeta compile "):
        load_compiled(path)


def test_other_versions_make_the_artifact_stale(tmp_path):
    path = str(tmp_path / "a.attnmeta")
    compile_backend("triton", CompileOptions(max_bs=4)).save(path)
    with zipfile.ZipFile(path) as z:
        manifest, blob = json.loads(z.read("manifest.json")), z.read("graphs.pickle")
    manifest["key"]["torch"] = "2.0.0"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("manifest.json", json.dumps(manifest))
        z.writestr("graphs.pickle", blob)
    with pytest.raises(ArtifactError, match=r"torch '2.0.0' -> '" + torch.__version__.replace("+", r"\+")):
        load_compiled(path)


@pytest.mark.parametrize("content", [None, b"not a zip", b""])
def test_a_missing_or_garbled_file_is_refused(tmp_path, content):
    path = tmp_path / "a.attnmeta"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ArtifactError, match="cannot read compiled artifact .*attnmeta compile BACKEND --out FILE"):
        load_compiled(str(path))


def test_compile_in_one_process_serve_in_another(tmp_path):
    out = tmp_path / "mine.attnmeta"
    cli = [sys.executable, "-m", "attnmeta.app.cli", "compile", "examples/mine.py:SPEC", "--page-size", "16",
           "--max-bs", "16", "--capture-sizes", "2", "16", "--max-context-len", "512", "--out", str(out)]
    r = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    serve = [sys.executable, os.path.join(ROOT, "examples", "serve.py"), "--artifact", str(out), "--steps", "20",
             "--device", "cpu"]
    r = subprocess.run(serve, cwd=tmp_path, capture_output=True, text=True)  # another directory, too
    assert r.returncode == 0, r.stderr
    assert "served 20 steps of mine on cpu: every page table checked" in r.stdout
