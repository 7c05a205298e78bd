"""``DSV4Backend``: SGLang's own ``DeepseekV4AttnBackend`` with its captured-mode metadata compiled,
driven by SGLang's real ``ForwardBatch``, against SGLang's own metadata code as the oracle.

SGLang's ``__init__`` needs a model runner, a DSV4 KV pool and SGLang's published runtime context,
none of which exist on a CPU; the backend is made with ``__new__`` and given the attributes that
``__init__`` sets and the metadata code reads (the request table, the full->SWA map, the ratios,
``index_topk``, the draft count), then bound to the compiled backend as ``__init__`` binds it.

The oracle is SGLang's code called on that same object: ``expand_extend_with_same_length``,
``make_core_attn_metadata`` (its page-table/positions and causal-SWA builders, its compression
Triton kernel in the interpreter, ``init_flashmla_related``) and ``init_forward_metadata_indexer``;
verify on ``seq_lens + D``, draft extend over T = D rows SWA only, as its raw-metadata upgrade
builds them. FlashMLA's scheduler object (GPU-only) is SGLang's ``_create_flashmla_metadata``,
replaced by a fresh marker object for both sides; DeepGEMM's indexer schedule is SGLang's torch
path (``SGLANG_FP8_PAGED_MQA_LOGITS_TORCH``), for both sides too."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.deepseek_v4_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random
from types import SimpleNamespace

import sglang.srt.layers.attention.deepseek_v4_backend as sgl
import torch
from sglang.kernels.ops.attention.dsv4.compress import CompressorDecodePlan, CompressorPrefillPlan

from attnmeta.backends.dsv4.eager import swa_table
from attnmeta.backends.dsv4.spec import DSV4Options
from attnmeta.compiler import CompileOptions, compile_backend
from attnmeta.compiler.ir.errors import ContractError, OptionsError
from attnmeta.integrations.sglang.dsv4_backend import DSV4Backend, dsv4_options
from attnmeta.runtime import BatchError, EmulatedGraph
from tests.integrations.sglang_world import MAX_BS, SIZES, D, L, make_pool, replay_view, sglang_batch

PAGE, TOPK = 256, 512
MODES = ("decode", "target_verify", "draft_extend")
# lengths at the edges DSV4 cares about: 1, multiples of 4/64/128/256 and one either side, the longest
EDGES = sorted({1, 2, L - D} | {m * k + d for m in (4, 64, 128, 256) for k in (1, 2) for d in (-1, 0, 1)
                               if 1 <= m * k + d <= L - D})


@pytest.fixture(autouse=True)
def cpu_schedulers(monkeypatch):
    monkeypatch.setattr(sgl, "_create_flashmla_metadata", lambda: SimpleNamespace(fresh=True))
    monkeypatch.setenv("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "1")


def sglang_dsv4(req_to_token, ratios=(4, 128), **changes):
    """SGLang's DSV4 backend object with the attributes its __init__ sets for a DeepSeek-V4 model
    served with MTP (one draft step, D draft tokens) on one process, its pool compressing at ``ratios``."""
    b = DSV4Backend.__new__(DSV4Backend)
    pool = SimpleNamespace(full_to_swa_index_mapping=swa_table(int(req_to_token.max()) + 2, "cpu"),
                           request_window=None, swa_req_ring_size=None, _unified_kv=False, present_ratios=ratios)
    attrs = dict(device=torch.device("cpu"), req_to_token=req_to_token, token_to_kv_pool=pool, page_size=PAGE,
                 present_ratios=ratios, low_ratios=(), has_c4=4 in ratios, has_c128=128 in ratios, index_topk=TOPK,
                 cuda_int32_kwargs={"device": torch.device("cpu"), "dtype": torch.int32}, trtllm_attn=False,
                 mtp_enabled=True, topk=1, speculative_num_draft_tokens=D, speculative_num_steps=1,
                 is_draft_runner=False, is_dspark_draft=False, online_c128_mtp=None, encoder_replay=False,
                 encoder_row_floor=None, MAX_SEQ_LEN_FOR_CAPTURE=req_to_token.shape[1],
                 dsa_topk_backend=SimpleNamespace(should_use_topk_v2=lambda: False),  # v2 plans on a GPU
                 enable_deepseek_v4_fp4_indexer=False, forward_metadata=None,
                 model_runner=SimpleNamespace(server_args=SimpleNamespace(cuda_graph_bs_decode=list(SIZES),
                                                                          cuda_graph_max_bs_decode=MAX_BS)))
    for k, v in (attrs | changes).items():
        setattr(b, k, v)
    return b


@pytest.fixture(scope="module")
def compiled():
    return compile_backend("dsv4", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                  num_draft_tokens=D, backend=DSV4Options(index_topk=TOPK),
                                                  modes=("decode", "idle", "target_verify", "draft_extend")))


def bound(compiled, seed):
    b = sglang_dsv4(make_pool(seed=seed))
    b.bind_attnmeta(compiled)
    return b


def oracle(b, mode: str, seq, rows, loc):
    """SGLang's DSV4Metadata pieces for the (padded) batch, from SGLang's own methods on ``b``."""
    n = seq.shape[0]
    if mode == "decode":
        casual, rep = seq.to(torch.int32), rows.to(torch.int32)
    else:
        end = (seq + D if mode == "target_verify" else seq).to(torch.int32)
        casual, rep = sgl.DeepseekV4AttnBackend.expand_extend_with_same_length(b, bs=n, qo_len=D, seq_lens=end,
                                                                              req_pool_indices=rows.to(torch.int32))
    draft = mode == "draft_extend"
    core = sgl.DeepseekV4AttnBackend.make_core_attn_metadata(
        b, req_to_token=b.req_to_token, req_pool_indices_repeated=rep, seq_lens_casual=casual,
        max_seq_len=PAGE if draft else b.MAX_SEQ_LEN_FOR_CAPTURE, out_loc=loc, need_compress=not draft,
        is_prefill=draft)
    core.swa_out_cache_loc = b.token_to_kv_pool.full_to_swa_index_mapping[loc].to(torch.int32)  # its in-graph write
    indexer = None if draft or not b.has_c4 else sgl.DeepseekV4AttnBackend.init_forward_metadata_indexer(b, core)
    return core, indexer


TENSORS = ("page_table", "raw_out_loc", "seq_lens_casual", "positions_casual", "swa_page_indices",
           "swa_topk_lengths", "swa_out_cache_loc", "c4_out_loc", "c4_topk_lengths_raw", "c4_topk_lengths_clamp1",
           "c4_sparse_topk_lengths", "c4_sparse_page_indices", "c128_out_loc", "c128_page_indices",
           "c128_topk_lengths_clamp1")


def differing(got, want_core, want_indexer, mode) -> list[str]:
    """Fields of SGLang's DSV4Metadata that differ on what its kernels read: the SWA window up to
    swa_topk_lengths, a page table up to each row's pages, everything else whole (dtype and width too)."""
    bad, core = [], got.core_attn_metadata
    if not isinstance(got, sgl.DSV4Metadata) or not isinstance(core, sgl.DSV4AttnMetadata):
        return [f"types {type(got).__name__}/{type(core).__name__}"]
    lens = want_core.seq_lens_casual.clamp(min=0)
    for name in TENSORS:
        g, w = getattr(core, name), getattr(want_core, name)
        if g is None or w is None:
            if (g is None) != (w is None):
                bad.append(f"{name}: {'None' if g is None else 'set'} vs SGLang {'None' if w is None else 'set'}")
            continue
        if g.dtype != w.dtype or g.shape != w.shape:
            bad.append(f"{name}: {g.dtype}{tuple(g.shape)} vs SGLang {w.dtype}{tuple(w.shape)}")
            continue
        if name == "swa_page_indices":
            window = want_core.swa_topk_lengths.clamp(min=0).tolist()
            ok = all(torch.equal(g[i, :c], w[i, :c]) for i, c in enumerate(window))
        elif name == "page_table":
            pages = (-(-lens // PAGE)).clamp(max=g.shape[1]).tolist()
            ok = all(torch.equal(g[i, :k], w[i, :k]) for i, k in enumerate(pages))
        else:
            ok = torch.equal(g, w)
        if not ok:
            bad.append(name)
    for name in ("page_size", "index_topk", "present_ratios", "low_ratios"):
        if getattr(core, name) != getattr(want_core, name):
            bad.append(name)
    for r in (0, 4, 128):  # a scheduler object per ratio where SGLang makes one, none where it does not
        if (core.get_flashmla_metadata(r) is None) != (want_core.get_flashmla_metadata(r) is None):
            bad.append(f"c{r}_flashmla_metadata")
    if (got.indexer_metadata is None) != (want_indexer is None):
        bad.append("indexer_metadata")
    elif want_indexer is not None:
        gi = got.indexer_metadata
        for name in ("page_size", "compressed_page_size", "use_topk_v2", "compress_ratio", "rows_per_request"):
            if getattr(gi, name) != getattr(want_indexer, name):
                bad.append(f"indexer.{name}")
        if not torch.equal(gi.compressed_seq_lens, want_indexer.compressed_seq_lens):
            bad.append("indexer.compressed_seq_lens")
        if gi.page_table is not core.page_table or gi.max_compressed_seq_len != want_indexer.max_compressed_seq_len:
            bad.append("indexer.page_table")
    kind = {"decode": CompressorDecodePlan, "target_verify": CompressorPrefillPlan}.get(mode)
    for r in (4, 128):  # a plan of SGLang's own type for each ratio the pool has, in a mode that compresses
        plan, want = getattr(got, f"c{r}_compress_metadata"), kind if r in want_core.present_ratios else None
        if (plan is None) != (want is None) or want is not None and not isinstance(plan, want):
            bad.append(f"c{r}_compress_metadata: {type(plan).__name__}")
    return bad


def padded(fb, bs: int, mode: str, fill: int = 1):
    raw = fb.batch_size
    seq, rows = torch.full((bs,), fill, dtype=torch.int64), torch.zeros(bs, dtype=torch.int64)
    seq[:raw], rows[:raw] = fb.seq_lens[:raw], fb.req_pool_indices[:raw]
    per = 1 if mode == "decode" else D
    loc = torch.zeros(bs * per, dtype=torch.int64)
    loc[: raw * per] = fb.out_cache_loc
    return seq, rows, loc


def step_batch(mode: str, rng: random.Random, n: int):
    lens = [rng.choice(EDGES) if rng.random() < 0.7 else rng.randint(1, L - D) for _ in range(n)]
    ext = [rng.randint(1, D) for _ in lens] if mode == "draft_extend" else None
    return sglang_batch(mode, lens, rng, ext=ext)


def test_it_is_sglangs_dsv4_backend():
    assert issubclass(DSV4Backend, sgl.DeepseekV4AttnBackend)
    for name in ("init_forward_metadata", "init_forward_metadata_out_graph", "init_forward_metadata_in_graph"):
        assert getattr(DSV4Backend, name) is not getattr(sgl.DeepseekV4AttnBackend, name)
    for name in ("forward", "store_cache", "init_forward_metadata_indexer", "make_core_attn_metadata"):
        assert getattr(DSV4Backend, name) is getattr(sgl.DeepseekV4AttnBackend, name)  # attention stays SGLang's
    b = DSV4Backend.__new__(DSV4Backend)  # SGLang's graph runner asks before routing prep through its glue graph
    assert b.glue_target_verify_metadata() and b.glue_draft_metadata()


def test_eager_every_mode_interleaved(compiled):
    """SGLang's eager path: init_forward_metadata on real ForwardBatches, modes interleaved; a fresh
    metadata object (and FlashMLA scheduler) every step, as SGLang builds one."""
    b, rng, seen = bound(compiled, 3), random.Random(7), []
    failures = []
    for step in range(15):
        mode = MODES[step % 3]
        fb = step_batch(mode, rng, rng.randint(1, MAX_BS))
        b.init_forward_metadata(fb)
        got = b.forward_metadata
        sched = got.core_attn_metadata.c0_flashmla_metadata
        assert all(sched is not s for s in seen)  # kept alive, so no two can share an address
        seen.append(sched)
        bad = differing(got, *oracle(b, mode, *padded(fb, fb.batch_size, mode)), mode)
        if bad:
            failures.append((step, mode, fb.seq_lens.tolist(), bad))
    assert not failures, failures


def test_graph_runner_capture_and_replay(compiled):
    """As SGLang's graph runner drives it: capture each mode and size (out_graph in_capture=True, then
    in_graph recorded), then replay real batches through SGLang's replay view, padded by the runner;
    forward_metadata is the object the graph recorded, its buffers rewritten by the replay."""
    b = bound(compiled, 4)
    fill = b.get_cuda_graph_seq_len_fill_value()
    rng, graphs, objects = random.Random(5), {}, {}
    for mode in MODES:
        for bs in SIZES:
            cap = sglang_batch(mode, [fill] * bs, rng, ext=[1] * bs if mode == "draft_extend" else None)
            cap.req_pool_indices.zero_()
            b.init_forward_metadata_out_graph(cap, in_capture=True)
            b.init_forward_metadata_in_graph(cap)  # SGLang's warmup runs the captured callable eagerly first
            warm = b.forward_metadata
            b.on_after_cuda_graph_warmup()  # SGLang's hook: fresh FlashMLA schedulers for the capture
            assert b.forward_metadata is warm and isinstance(warm, sgl.DSV4Metadata)
            g = graphs[mode, bs] = EmulatedGraph()
            with g.capture():
                b.init_forward_metadata_in_graph(cap)
            objects[mode, bs] = b.forward_metadata
    failures = []
    for step in range(24):
        mode = MODES[step % 3]
        raw = rng.randint(1, MAX_BS)
        bs = min(s for s in SIZES if s >= raw)
        fb = step_batch(mode, rng, raw)
        b.init_forward_metadata_out_graph(replay_view(fb, bs, fill))
        graphs[mode, bs].replay()
        assert b.forward_metadata is objects[mode, bs]
        bad = differing(b.forward_metadata, *oracle(b, mode, *padded(fb, bs, mode, fill)), mode)
        if bad:
            failures.append((step, mode, raw, bs, fb.seq_lens.tolist(), bad))
    assert not failures, failures


@pytest.mark.parametrize("ratios", [(4,), (128,)], ids=["c4-only", "c128-only"])
def test_a_pool_with_one_ratio(ratios):
    """A pool with one compression ratio (SGLang's present_ratios): the backend compiled with
    compress_ratios hands SGLang that ratio's fields, scheduler and plan, and None for the other's,
    as SGLang's own metadata code leaves them; eager and replayed, modes interleaved."""
    c = compile_backend("dsv4", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                               num_draft_tokens=D,
                                               backend=DSV4Options(index_topk=TOPK, compress_ratios=ratios),
                                               modes=("decode", "idle", "target_verify", "draft_extend")))
    b = sglang_dsv4(make_pool(seed=8), ratios)
    b.bind_attnmeta(c)
    rng, failures = random.Random(ratios[0]), []
    for step in range(9):
        mode = MODES[step % 3]
        fb = step_batch(mode, rng, rng.randint(1, MAX_BS))
        b.init_forward_metadata(fb)
        bad = differing(b.forward_metadata, *oracle(b, mode, *padded(fb, fb.batch_size, mode)), mode)
        if bad:
            failures.append((step, mode, fb.seq_lens.tolist(), bad))
    assert not failures, failures


def test_the_comparison_can_fail(compiled):
    """The oracle is not vacuous: one field off by one, one dtype changed, are each caught."""
    b = bound(compiled, 6)
    fb = step_batch("target_verify", random.Random(1), 3)
    b.init_forward_metadata(fb)
    core, indexer = oracle(b, "target_verify", *padded(fb, 3, "target_verify"))
    assert differing(b.forward_metadata, core, indexer, "target_verify") == []
    core.c128_topk_lengths_clamp1 = core.c128_topk_lengths_clamp1 + 1
    core.positions_casual = core.positions_casual.long()
    assert differing(b.forward_metadata, core, indexer, "target_verify") == [
        f"positions_casual: torch.int32({3 * D},) vs SGLang torch.int64({3 * D},)", "c128_topk_lengths_clamp1"]


def test_bad_configurations_and_batches_are_refused(compiled):
    """What the spec does not plan, and options that do not match SGLang's, are named at bind; a
    replay of a size never captured, a batch longer than the context, are typed errors."""
    for change, named in ((dict(low_ratios=(1, 2)), "c1/c2"), (dict(trtllm_attn=True), "trtllm-gen"),
                          (dict(is_dspark_draft=True), "DSpark"), (dict(index_topk=1024), "index_topk: compiled 512"),
                          (dict(is_draft_runner=True, speculative_num_steps=3), "multi-step draft decode"),
                          (dict(ratios=(128,)), r"compress_ratios: compiled \(4, 128\), SGLang \(128,\)")):
        b = sglang_dsv4(make_pool(seed=1), **change)
        with pytest.raises(OptionsError, match=named):
            b.bind_attnmeta(compiled)
    no_extend = compile_backend("dsv4", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                       num_draft_tokens=D, backend=DSV4Options(index_topk=TOPK),
                                                       modes=("decode", "idle", "target_verify")))
    with pytest.raises(OptionsError, match=r"modes \['draft_extend'\] are not compiled.*dsv4_options"):
        sglang_dsv4(make_pool(seed=1)).bind_attnmeta(no_extend)  # SGLang captures draft extend with MTP
    b = bound(compiled, 2)
    with pytest.raises(OptionsError, match="max_bs"):
        b.init_cuda_graph_state(MAX_BS * 2, MAX_BS * 2 * D)
    b.draft_extend_num_tokens_per_req = D + 1  # what SGLang's init_cuda_graph_state derives from its runner
    with pytest.raises(OptionsError, match=f"runs {D + 1} rows per request .* num_draft_tokens={D}"):
        b.init_forward_metadata_out_graph(sglang_batch("draft_extend", [9], random.Random(4), ext=[1]), True)
    b.draft_extend_num_tokens_per_req = D
    with pytest.raises(ContractError, match="no graph captured DECODE at batch size 4"):
        b.init_forward_metadata_out_graph(replay_view(step_batch("decode", random.Random(2), 3), 4, 1))
    with pytest.raises(BatchError, match="seq_lens"):
        b.init_forward_metadata(sglang_batch("decode", [L + 1], random.Random(3)))


def test_options_follow_sglangs_backend():
    b = sglang_dsv4(make_pool(seed=1))
    o = dsv4_options(b)
    assert (o.max_context_len, o.of(DSV4Options).index_topk, o.num_draft_tokens, o.max_bs) == (L, TOPK, D, MAX_BS)
    assert o.of(DSV4Options).compress_ratios == (4, 128)
    assert dsv4_options(sglang_dsv4(make_pool(seed=1), (128,))).of(DSV4Options).compress_ratios == (128,)
    assert {m.name for m in o.modes} == {"DECODE", "IDLE", "TARGET_VERIFY", "DRAFT_EXTEND"}
