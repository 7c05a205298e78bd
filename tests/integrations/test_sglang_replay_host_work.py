"""The host work of a replayed step, counted: what ``init_forward_metadata_out_graph`` dispatches when
SGLang's graph runner hands it a view of the buffers the graph was captured on.

Each kind is built by SGLang from its flags (``sglang_server.Server``), its graphs captured per size as
SGLang's runners capture them, and every replayed step prepared as SGLang's runners prepare it (the batch
copied into the captured buffers, the view by SGLang's own ``build_replay_fb_view`` for decode and
verify, the tree mask written into the backend's verify buffer as EAGLE's worker writes it). torch's
profiler then counts the aten ops of the backend's out_graph alone: 0 for every kind and mode whose
planners need no host data (the graph reads SGLang's buffers in place). After each replay, the metadata
the graph wrote is compared with the same batch served eagerly through the staging path of a second
instance of the same compiled backend (rows and lengths from the host; that path is checked against
SGLang's own classes by the served tests), so a graph that read stale buffers fails here too.
"""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch
from torch.profiler import ProfilerActivity, profile

from attnmeta.compiler import ForwardMode
from attnmeta.integrations.sglang.batch import BatchView
from tests import fake_fa3, fake_flash_mla, fake_flashinfer
from tests.integrations.sglang_server import (
    ROWS,
    Runners,
    Server,
    decode,
    decode_view,
    draft_decode,
    draft_decode_view,
    draft_extend,
    draft_extend_view,
    verify,
)

EAGLE = ["--speculative-algorithm", "EAGLE"]
CHAIN = ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1", "--speculative-num-steps", "3",
         "--speculative-num-draft-tokens", "4"]
# kind -> (flags, model, stand-in installer[, the Server's other arguments])
CASES = {
    "triton": (["--attention-backend", "attnmeta_triton"], "llama", None),
    # a sliding-window model in one plain pool: the window's fields come from the same recorded kernel
    "triton-window": (["--attention-backend", "attnmeta_triton", "--page-size", "16"], "llama", None, {"window": 40}),
    "triton-p16-eagle": (["--attention-backend", "attnmeta_triton", "--page-size", "16", *EAGLE], "llama", None),
    "flashinfer-eagle": (["--attention-backend", "attnmeta_flashinfer", *EAGLE], "llama", fake_flashinfer.into_sglang),
    "flashinfer-p16": (["--attention-backend", "attnmeta_flashinfer", "--page-size", "16"], "llama",
                       fake_flashinfer.into_sglang),
    # EAGLE on a window model: the window layers' verify wrapper planned on the GPU beside the full one's
    "flashinfer-window-eagle": (["--attention-backend", "attnmeta_flashinfer", "--page-size", "16",
                                 "--speculative-draft-attention-backend", "attnmeta_triton", *CHAIN], "llama",
                                fake_flashinfer.into_sglang, {"window": 40}),
    "fa3-p16-eagle": (["--attention-backend", "attnmeta_fa3", "--page-size", "16", *CHAIN], "llama",
                      fake_fa3.into_sglang),
    # topk 4: the verify reads the tree mask SGLang's worker wrote into the plan's buffer (SGLang's own drafter)
    "fa3-p16-topk4": (["--attention-backend", "attnmeta_fa3", "--page-size", "16", *EAGLE, "--speculative-eagle-topk",
                       "4", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "6"], "llama",
                      fake_fa3.into_sglang),
    "trtllm_mha-eagle": (["--attention-backend", "attnmeta_trtllm_mha", "--page-size", "16", *CHAIN], "llama",
                         fake_flashinfer.into_sglang_trtllm),
    "trtllm_mla-eagle": (["--attention-backend", "attnmeta_trtllm_mla", "--page-size", "64", *CHAIN], "deepseek",
                         fake_flashinfer.into_sglang_trtllm),
    "flashmla-eagle": (["--attention-backend", "attnmeta_flashmla", *CHAIN], "deepseek-h128",
                       fake_flash_mla.into_sglang),
    "flashinfer_mla-eagle": (["--attention-backend", "attnmeta_flashinfer", *CHAIN], "deepseek",
                             fake_flashinfer.into_sglang_mla),
}
CHAINS = {k for k, (flags, *_) in CASES.items() if flags[-len(CHAIN):] == CHAIN}  # a chain's verify: no mask


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    flags, model, standin, *more = CASES[request.param]
    with pytest.MonkeyPatch.context() as mp:
        if standin is not None:
            standin(mp)
        yield request.param, Server(flags, seed=11, model=model, **(more[0] if more else {}))


def aten_ops(fn) -> list[str]:
    """The aten ops ``fn`` dispatches itself (not those an op calls inside: a CPU foreach copy's per-tensor
    copies are its own)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("aten::")
            and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]


def tensors(meta) -> dict:
    """The tensor fields of attnmeta's bound plan, copied (what the graph wrote)."""
    return {k: v.clone() for k, v in vars(meta).items() if isinstance(v, torch.Tensor) and not k.endswith("_host")}


def v_mode(v):
    from attnmeta.integrations.sglang.batch import attnmeta_mode

    return attnmeta_mode(v.forward_mode)


def modes(s: Server) -> list[tuple]:
    """(mode key, backend, capture batch, step batch, view) of every graph mode this server replays."""
    D = s.spec.speculative_num_draft_tokens if s.speculative else 1
    if not s.speculative:
        return [("decode", s.backend, 1, lambda bs, fill: decode(s, [0] * bs, [fill] * bs),
                 lambda rows, seq, step: decode(s, rows, seq), lambda fb, bs, fill: decode_view(fb, bs, fill, 1))]
    drafted = hasattr(s.draft_decode, "attnmeta")  # the kinds with no attnmeta drafter draft with SGLang's own
    return [("verify", s.backend, D, lambda bs, fill: verify(s, [0] * bs, [fill] * bs, random.Random(bs)),
             lambda rows, seq, step: verify(s, rows, seq, random.Random(step)),
             lambda fb, bs, fill: decode_view(fb, bs, fill, D)),
            ("extend", s.draft_extend, D, lambda bs, fill: draft_extend(s, [0] * bs, [1] * bs),
             lambda rows, seq, step: draft_extend(s, rows, seq),
             lambda fb, bs, fill: draft_extend_view(fb, bs, fill, D)),
            # EAGLE's multi-step draft decode (EagleDraftCudaGraphRunner): every step of a round in one plan
            ("draft", s.draft_decode, 1, lambda bs, fill: draft_decode(s, [0] * bs, [fill] * bs),
             lambda rows, seq, step: draft_decode(s, rows, seq),
             lambda fb, bs, fill: draft_decode_view(fb, bs, fill))][: 3 if drafted else 2]


def test_a_replayed_step_dispatches_no_aten_op(case):
    """Through SGLang's own replay view, every replayed out_graph dispatches 0 aten ops, and the graph's
    metadata equals the same batch staged from the host."""
    name, s = case
    rng = random.Random(5)
    L = s.model_config.context_len
    for key, be, width, capture, step_batch, view in modes(s):
        r = Runners(s, be, name, width)
        with s.active():
            r.capture(lambda bs, r=r, make=capture: make(bs, r.fill), key)
        am = be.attnmeta
        twin = am.compiled.instantiate(am.pools["req_to_token"], device=am.device,
                                       pools={k: t for k, t in am.pools.items() if k != "req_to_token"})
        for step in range(4):
            n = rng.choice([1, 2, 3, max(r.sizes)])
            rows = rng.sample(range(1, ROWS), n)
            seq = [rng.randint(1, L // 2) for _ in rows]
            fb = step_batch(rows, seq, step)
            bs = r.bucket(n)
            v = view(fb, bs, r.fill)
            mask = getattr(fb.spec_info, "custom_mask", None) if key == "verify" else None
            mask = None if mask is None else mask.view(-1).clone()
            r.prepare(key, v)
            plan = am.bound(v_mode(v), bs)
            # every kind's planners run in the graph here, except FlashInfer MLA's where the stand-in's plan does
            # not take the device partition (sizes past 2): its C++ planner then needs the host lengths
            assert not plan.host_work or name.startswith("flashinfer_mla"), (name, key, bs)
            # SGLang's draft-decode runner hands an unpadded batch's own tensors (their values already in its
            # buffers): one grouped copy into the buffers the graph reads, still no staging and no wait
            fed = key == "draft" and v.num_padding == 0
            taken = []  # the engine-buffer path, asserted by its own hook (not a timing): the plan's step served it
            if plan.step is not None:
                step_fn = plan.step
                plan.step = lambda view, step_fn=step_fn, taken=taken: taken.append(step_fn(view)) or taken[-1]
            with s.active():
                ops = aten_ops(lambda v=v, be=be: be.init_forward_metadata_out_graph(v))
                want = ["aten::_foreach_copy_"] if fed else []
                assert (ops == want) is not plan.host_work, (name, key, bs, ops)
                assert (taken == [True]) is not plan.host_work, (name, key, bs, taken)
                if taken:
                    plan.step = step_fn
                r.graphs[(key, bs)].replay()
                replayed = tensors(am.forward_metadata)
                theirs = twin.bound(v_mode(v), bs).meta  # the mask copied into the twin's plan, as the backend does
                if mask is not None and isinstance(getattr(theirs, "custom_mask", None), torch.Tensor):
                    theirs.custom_mask.view(-1)[: mask.numel()].copy_(mask)
                twin.init_forward_metadata(BatchView(width).fill(v))  # the same padded view, staged, eager
                staged = tensors(twin.forward_metadata)
            if mask is not None:  # the drafter's mask, read where the drafter wrote it (a chain's verify reads none)
                read = getattr(be.forward_metadata, "custom_mask", None)  # triton's; FlashInfer's packer reads
                read = read if isinstance(read, torch.Tensor) else getattr(am.forward_metadata, "custom_mask", None)
                assert read is None and name in CHAINS or \
                    torch.equal(read.view(-1)[: mask.numel()].bool(), mask.bool()), (name, step)
            assert set(replayed) == set(staged)
            # SGLang's draft-extend runner pads its own buffers (a padded row's extend length is the step's width, its
            # length the fill plus that), and a replay reading the engine's buffers reads them on the padded rows
            # too, where the staged twin has the spec's fills: the two agree on the live rows (what attention
            # reads), not on the padded ones (known; docs/SGLANG.md, "Who pads a batch")
            live = n if key == "extend" and n < bs else None
            for f, a in replayed.items():
                b, ptr = staged[f], staged.get(f.replace("indices", "indptr"))
                if f.endswith("indices") and ptr is not None and a.dim() == 1:  # the entries the indptr covers
                    end = int(ptr[-1] if live is None else ptr[live])
                    a, b = a[:end], b[:end]
                elif live is not None and a.dim() == 1 and a.shape[0] in (bs, bs + 1):  # per row, or an indptr
                    a, b = a[: live + a.shape[0] - bs], b[: live + a.shape[0] - bs]
                assert f == "custom_mask" or torch.equal(a, b), (name, key, step, f)


@pytest.mark.triton_kernels  # it counts the fused kernels' launches
def test_a_bound_graph_is_the_compiled_kernels_and_the_planners_device_work(case):
    """What a replay launches, counted in the emulated graph SGLang's runners captured: the compiled plan's
    own launches (the compiler's count: fused kernels and unfused ops) and the planners' device work. The
    device checks of the engine's buffers and the staged fields are the plan's first fused kernel's own
    (guard-inputs): no launch of their own. triton's decode, counted by hand: one kernel."""
    name, s = case
    for key, be, width, capture, _, _ in modes(s):
        r = Runners(s, be, name, width)
        with s.active():
            r.capture(lambda bs, r=r, make=capture: make(bs, r.fill), key)
        am = be.attnmeta
        for (k, bs), g in r.graphs.items():
            mode = {"decode": ForwardMode.DECODE, "draft": ForwardMode.DECODE, "verify": ForwardMode.TARGET_VERIFY,
                    "extend": ForwardMode.DRAFT_EXTEND}[k]
            plan = am.bound(mode, bs)
            assert plan.engine is not None, (name, k, bs)  # bound to SGLang's buffers
            # the device checks are the first kernel's own (guard-inputs): no launch of their own
            assert g.num_ops == am.compiled.kernels(mode, bs) + len(plan.after_in), (name, k, bs)
            if name == "triton" and k == "decode":
                assert g.num_ops == 1, bs


def test_a_view_of_other_buffers_is_staged_and_still_right():
    """A captured plan handed a view of tensors other than the ones it captured (another engine, an eager
    caller) stages them, even tensors of exactly the buffers' shape (only the drafter's runner is known to
    feed its buffers first): host work again, and the graph replayed after it reads what was staged, not
    the captured buffers' stale values."""
    s = Server(["--attention-backend", "attnmeta_triton"], seed=2)
    be = s.backend
    r = Runners(s, be, "triton", 1)
    with s.active():
        r.capture(lambda bs: decode(s, [0] * bs, [r.fill] * bs), "decode")
        fb = decode(s, [3, 5], [40, 7])
        v = decode_view(fb, r.bucket(2), r.fill, 1)  # not prepared: fresh tensors, not the captured ones
        assert len(aten_ops(lambda: be.init_forward_metadata_out_graph(v))) > 1
        r.graphs[("decode", v.batch_size)].replay()
        got = tensors(be.attnmeta.forward_metadata)
        be.init_forward_metadata(decode(s, [3, 5], [40, 7]))
        want = tensors(be.attnmeta.forward_metadata)
    n = int(want["kv_indptr"][2])
    assert torch.equal(got["kv_indptr"][:3], want["kv_indptr"][:3]) and n == 47
    assert torch.equal(got["kv_indices"][:n], want["kv_indices"][:n])
