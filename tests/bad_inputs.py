"""Bad inputs and the error each one gets: one table that the tests run (tests/test_reliability.py)
and that docs/RELIABILITY.md prints (``python -m tests.bad_inputs`` writes its table), so the doc
never drifts from what the code says."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import attrs
import torch


@attrs.frozen
class Case:
    what: str  # the bad input, as a user would describe it
    run: Callable[[], object]  # does it; must raise
    error: str  # the exception class name
    says: str  # a fragment of its message


@functools.cache
def _compiled(name: str = "flashinfer", modes=("decode", "target_verify", "draft_extend"), **kw):
    from attnmeta.compiler import CompileOptions, compile_backend

    return compile_backend(name, CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=16, modes=modes, **kw))


def _chunk_options(chunk: int):
    from attnmeta.backends.flashattention.spec import FlashAttentionOptions

    return FlashAttentionOptions(attention_chunk=chunk)


def _chunked(chunk: int, page: int):
    return _compiled("flashattention", modes=("decode",), page_size=page, backend=_chunk_options(chunk))


def _backend(name: str = "flashinfer", **kw):
    from tests.batches import make_pool

    return _compiled(name, **kw).instantiate(make_pool(8, 16))


def _step(mode: str = "DECODE", raw: int = 3, backend=None, **fields):
    """One batch of ``raw`` requests through the backend, with ``fields`` replaced."""
    from attnmeta.runtime import ForwardMode
    from tests.batches import make_batch

    fb = make_batch(raw, 16, 12, seed=1, max_len=8, mode=ForwardMode[mode])
    for k, v in fields.items():
        setattr(fb, k, v)
    (backend or _backend()).init_forward_metadata(fb)


def _ints(*v, dtype=torch.int64):
    return torch.tensor(v, dtype=dtype)


def _options(**kw):
    from attnmeta.compiler import CompileOptions

    return CompileOptions(**kw)


def _own(name: str, **given):
    from attnmeta.compiler import backend_options

    return backend_options(name, **given)


def _dsv4_options(**kw):
    from attnmeta.backends.dsv4.spec import DSV4Options

    return DSV4Options(**kw)


def _parse(text):
    from attnmeta.compiler.ir import parse

    return parse(text)


def _fill_spec(fill):
    from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode, compile_backend
    from attnmeta.compiler.ir import DType, SpecBuilder

    def build(mode, options):
        b = SpecBuilder("mine")
        seq = b.input("seq_lens", DType.int32, ["bs"], fill=1)
        rpi = b.input("req_pool_indices", DType.int64, ["bs"], fill=fill)
        r2t = b.pool("req_to_token", DType.int32, ["R", "L"])
        with b.in_graph():
            b.outputs(kv_indices=b.ragged_gather(r2t, rpi, seq, b.cumsum(seq), capacity="max_bs*L"))
        return b.build()

    compile_backend(BackendSpec("mine", build, (ForwardMode.DECODE,)), CompileOptions(max_bs=4, capture_sizes=(4,)))


def _plan_on_device_with(version: str):
    """A backend compiled with plan_on_device, served through a FlashInfer of ``version`` (the CPU
    stand-in of tests/fake_flashinfer.py): the first step plans."""
    from unittest import mock

    from attnmeta.backends.flashinfer.planner import FlashInferDecodeAdapter
    from attnmeta.backends.flashinfer.spec import FlashInferOptions
    from attnmeta.runtime import ReplayView
    from tests import fake_flashinfer
    from tests.batches import make_batch

    be = _backend(backend=FlashInferOptions(plan_on_device=True))
    with mock.patch.dict(sys.modules, {"flashinfer": fake_flashinfer.module(version=version)}):
        FlashInferDecodeAdapter(be, 8, 2, 128, use_tensor_cores=False, workspace_bytes=1 << 10)
        be.init_forward_metadata_out_graph(ReplayView.of(make_batch(3, 16, 8, seed=1, max_len=8), 4))


GRAPH = 'graph "g" [] {\n  input %x: i32[bs]@device batch fill=1\n  output y = %x\n'
def _planner_without_site():
    def plan(indptr_host, last_page_len_host):  # written before planners got their site
        return "planned"

    from tests.batches import make_pool

    _step(backend=_compiled().instantiate(make_pool(8, 16), planners={"flashinfer.decode_plan": plan}))


def _planner_after_capture():
    from tests.batches import capture, make_batch

    be = _backend()
    capture(be, make_batch(4, 16, 8, seed=0, max_len=8))
    be.set_planner("flashinfer.decode_plan", lambda site, indptr, last: "planned")


def _mla_lengths(lens):
    from attnmeta.backends.flashinfer_mla.planner import ReferenceMLAPlanner
    from attnmeta.runtime import ForwardMode
    from attnmeta.runtime.planning import Site

    site = Site.detached("flashinfer.mla_plan", ForwardMode.DECODE, 2)
    i32 = functools.partial(_ints, dtype=torch.int32)
    ReferenceMLAPlanner()(site, i32(0, 1, 2), i32(0, 3, 5), i32(*lens))


CASES = [
    Case("a pool row outside the pool (`req_pool_indices_cpu = [1, 99, 2]`)",
         lambda: _step(req_pool_indices_cpu=_ints(1, 99, 2)), "BatchError",
         "req_pool_indices_cpu[1] = 99 is not a request row of this pool: allowed 1..7"),
    Case("a negative pool row", lambda: _step(req_pool_indices_cpu=_ints(1, -1, 2)), "BatchError",
         "req_pool_indices_cpu[1] = -1 is not a request row"),
    Case("a live request on the reserved pool row 0", lambda: _step(req_pool_indices_cpu=_ints(0, 1, 2)),
         "BatchError", "row 0 is reserved for padding"),
    Case("a negative sequence length", lambda: _step(seq_lens_cpu=_ints(3, -2, 4, dtype=torch.int32)), "BatchError",
         "seq_lens_cpu[1] = -2: a length cannot be negative"),
    Case("a sequence longer than the context", lambda: _step(seq_lens_cpu=_ints(3, 17, 4, dtype=torch.int32)),
         "BatchError", "a sequence of 17 tokens exceeds 16, the longest this backend serves (max_context_len=16)"),
    Case("a verify sequence without room for the drafts",
         lambda: _step("TARGET_VERIFY", seq_lens_cpu=_ints(3, 13, 4, dtype=torch.int32)),
         "BatchError", "exceeds 12, the longest this backend serves (max_context_len=16 less the 4 slots"),
    Case("an int64 length past 2^32 (it would wrap into range)",
         lambda: _step(seq_lens_cpu=_ints(3, 2**32 + 5, 4)), "BatchError", "= 4294967301: a sequence of"),
    Case("float or NaN lengths", lambda: _step(seq_lens_cpu=torch.tensor([3.0, float("nan"), 2.0])), "BatchError",
         "seq_lens_cpu must hold integers (torch.int32 or torch.int64), got torch.float32"),
    Case("fewer values than the batch has rows", lambda: _step(req_pool_indices_cpu=_ints(1, 2)), "BatchError",
         "req_pool_indices_cpu has 2 values for a batch of 3 rows"),
    Case("a field the spec reads is missing", lambda: _step(req_pool_indices_cpu=None, req_pool_indices=None),
         "BatchError", "the batch has no req_pool_indices (nor req_pool_indices_cpu)"),
    Case("more accepted draft tokens than drafted",
         lambda: _step("DRAFT_EXTEND", extend_seq_lens_cpu=_ints(1, 5, 2, dtype=torch.int32),
                      backend=_backend("flashattention", modes=("decode", "draft_extend"))),
         "BatchError", "a request extends by at most num_draft_tokens tokens"),
    Case("a draft extend reading past the context (FlashMLA: seq - extend + D > L)",
         lambda: _step("DRAFT_EXTEND", seq_lens_cpu=_ints(16, 5, 2, dtype=torch.int32),
                       extend_seq_lens_cpu=_ints(1, 1, 1, dtype=torch.int32),
                       backend=_backend("flashmla", modes=("decode", "draft_extend"), page_size=64)),
         "BatchError", "the row is past its bound seq_lens - extend_seq_lens <= 12"),
    Case("a batch larger than max_bs", lambda: _step(raw=5), "BatchError", "batch size 5 exceeds max_bs=4"),
    Case("a mode the backend was not compiled for",
         lambda: _step("TARGET_VERIFY", backend=_backend("triton", modes=("decode",))), "BatchError",
         "was compiled for modes ['decode'], not target_verify"),
    Case("a pool of the wrong width", lambda: _compiled().instantiate(torch.zeros(8, 17, dtype=torch.int32)),
         "BatchError", "pool req_to_token must be i32[rows, 16]"),
    Case("a padding fill that is a live pool row (spec)", lambda: _fill_spec(3), "SplitError",
         "[missing-fill-value] %req_pool_indices"),
    Case("capture sizes past max_bs", lambda: _options(max_bs=4, capture_sizes=(8,)), "OptionsError",
         "capture sizes [8] are outside 1..max_bs=4"),
    Case("topk, num_steps or num_draft_tokens below 1", lambda: _options(topk=0), "OptionsError",
         "topk must be an int >= 1, got 0"),
    Case("query heads that do not group over the KV heads", lambda: _options(num_heads=12, num_kv_heads=8),
         "OptionsError", "num_heads=12 is not a multiple of num_kv_heads=8"),
    Case("a DSV4 `index_topk` its kernels are not built for", lambda: _dsv4_options(index_topk=300), "OptionsError",
         "index_topk must be 512 or 1024"),
    Case("a DSV4 compression ratio it does not plan (V4.1's c1/c2)", lambda: _dsv4_options(compress_ratios=(2, 4)),
         "OptionsError", "compress_ratios must be drawn from 4 and 128"),
    Case("another backend's own options", lambda: _compiled("triton", backend=_dsv4_options()), "OptionsError",
         "backend 'triton' takes TritonOptions, got backend=DSV4Options"),
    Case("a flag of another backend's options (`--index-topk` for triton)", lambda: _own("triton", index_topk=512),
         "OptionsError", "--index-topk: not an option of backend 'triton'"),
    Case("`--disable-pass` with an unknown pass", lambda: _compiled("triton", disabled_passes=("fusee",)),
         "OptionsError", "--disable-pass fusee: no such pass"),
    Case("`--disable-pass check-split` without `--force`",
         lambda: _compiled("triton", disabled_passes=("check-split",)), "OptionsError", "switches off a safety check"),
    Case("`plan_on_device` with a FlashInfer whose planner the device kernel does not repeat",
         lambda: _plan_on_device_with("0.7.0"), "PlanError", "compiled with plan_on_device, so no step has host"),
    Case("`--disable-pass plan-buffers` (the runtime needs it)",
         lambda: _compiled("triton", disabled_passes=("plan-buffers",)), "OptionsError", "cannot be disabled"),
    Case("an engine planner written without the site argument", _planner_without_site, "PlanError",
         "planner 'flashinfer.decode_plan' cannot be called planner(site, *inputs) with the 2 host inputs"),
    Case("a planner swapped after capture", _planner_after_capture, "StaleBufferError",
         "planner 'flashinfer.decode_plan' cannot change: graphs"),
    Case("MLA kv lengths that disagree with the kv indptr (FlashInfer 0.7 refuses them)",
         lambda: _mla_lengths((3, 3)), "PlanError", "MLA plan(): the kv lengths disagree with the kv indptr's steps"),
    Case("a page size the backend's kernels do not serve (TRT-LLM MLA at 16)",
         lambda: _compiled("trtllm_mla", page_size=16), "OptionsError",
         "backend 'trtllm_mla' serves page sizes [32, 64], not 16"),
    Case("a sliding window for a backend that plans none (TRT-LLM MHA)",
         lambda: _compiled("trtllm_mha", sliding_window=40), "OptionsError",
         "backend 'trtllm_mha' does not plan sliding-window layers (sliding_window=40)"),
    Case("a sliding window under a tree verify on FlashInfer with its host planner (topk 4: the window streams' "
         "lengths come from the tree mask, on the GPU)",
         lambda: _compiled("flashinfer", sliding_window=40, topk=4, num_draft_tokens=6), "OptionsError",
         "attnmeta's flashinfer spec verifies a sliding-window model's draft tree (topk 4) with the window wrapper's "
         "partition planned on the GPU only"),
    Case("chunked local attention off page boundaries (FlashAttention, chunk 24 at page size 16)",
         lambda: _chunked(24, 16), "OptionsError",
         "attention_chunk=24 is not a multiple of the page size 16"),
    Case("chunked local attention under a tree verify (FlashAttention, topk 4)",
         lambda: _compiled("flashattention", modes=("decode", "target_verify"), topk=4, num_steps=2,
                           num_draft_tokens=4, backend=_chunk_options(8)), "OptionsError",
         "chunked local attention is planned for decode and target_verify at topk 1, not target_verify with topk > 1"),
    Case(".ir text with a missing `}`", lambda: _parse(GRAPH), "ParseError", "graph 'g' is not closed"),
    Case(".ir text after the closing `}`", lambda: _parse(GRAPH + "}\n  output z = %x\n"), "ParseError",
         "text after the closing '}'"),
    Case(".ir text with a bad value name", lambda: _parse(GRAPH.replace("%x\n", "%9x\n") + "}\n"), "ParseError",
         "expected a value name after %"),
]


def table() -> str:
    """The markdown table of CASES: what was given, the error, what it says (run to get the message)."""
    rows = ["| bad input | error | message (start) |", "|---|---|---|"]
    for c in CASES:
        try:
            c.run()
        except BaseException as e:  # noqa: BLE001  (every case raises; the table shows what)
            msg = " ".join(ln.strip() for ln in str(e).splitlines()[:2])
            msg = msg if len(msg) <= 240 else msg[:237] + "..."
            rows.append(f"| {c.what} | `{type(e).__name__}` | {msg.replace('|', '/')} |")
        else:
            rows.append(f"| {c.what} | (no error) | |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table())
