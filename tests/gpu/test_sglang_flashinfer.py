"""attnmeta_flashinfer against SGLang's own FlashInfer backend on the H200, both built by SGLang from the
same flags on the same runner (``tests/integrations/sglang_server.Server`` on CUDA), real FlashInfer:
every mode SGLang captures, eagerly and on real CUDA graphs through the runner's padded view. The
wrappers each side planned must hold the same index stream (indptr, indices, last-page lengths, query
indptr) and SGLang's own ``forward_decode`` / ``forward_extend`` over each side's metadata must give the
same attention on the same KV pool. Needs SGLang's Python code and the stand-in kernel package
(docs/SGLANG.md, "On the H200")."""

import importlib.util
import random

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("sglang") is None or
                                 importlib.util.find_spec("flashinfer") is None, reason="needs SGLang and FlashInfer")]

FLAGS = {"plain": ["--attention-backend", "attnmeta_flashinfer"],
         # what the fault report drew: every captured size to 256, lengths to 2048, SGLang's replay view
         "bs256": ["--attention-backend", "attnmeta_flashinfer", "--cuda-graph-bs-decode", "1", "8", "64", "256",
                   "--max-running-requests", "300"],
         "eagle": ["--attention-backend", "attnmeta_flashinfer", "--speculative-algorithm", "EAGLE",
                   "--speculative-eagle-topk", "4", "--speculative-num-steps", "3",
                   "--speculative-num-draft-tokens", "6"]}


@pytest.fixture(scope="module", params=sorted(FLAGS))
def server(request):
    from tests.integrations.sglang_server import Server

    big = request.param == "bs256"
    s = Server(FLAGS[request.param], seed=2, device="cuda", rows=300 if big else 24, context=4096 if big else 1024)
    pool = s.runner.token_to_kv_pool
    g = torch.Generator(device="cuda").manual_seed(0)
    for buf in (*pool.k_buffer, *pool.v_buffer):
        buf.copy_(torch.randn(buf.shape, generator=g, device="cuda").to(buf.dtype))
    return s


def wrapper_stream(w, live: int) -> dict:
    """The index stream a planned FlashInfer wrapper's kernels read, on the live rows."""
    indptr = w._paged_kv_indptr_buf[: live + 1].long().cpu()
    out = {"kv_indptr": indptr, "kv_indices": w._paged_kv_indices_buf[: int(indptr[-1])].long().cpu(),
           "kv_last_page_len": w._paged_kv_last_page_len_buf[:live].long().cpu()}
    if getattr(w, "_qo_indptr_buf", None) is not None and not hasattr(w, "_use_tensor_cores"):
        out["qo_indptr"] = w._qo_indptr_buf[: live + 1].long().cpu()
    return out


def test_every_mode_equals_sglangs_own_flashinfer(server):
    from sglang.srt.layers.attention.flashinfer_backend import DecodeMetadata
    from sglang.srt.layers.radix_attention import RadixAttention

    from tests.integrations.sglang_server import Runners, decode, decode_view, draft_extend, verify
    from tests.integrations.test_sglang_serving import lens

    s, rng = server, random.Random(3)
    mc = s.model_config
    H, hd, hkv = mc.num_attention_heads, mc.head_dim, mc.get_num_kv_heads(1)
    layer = RadixAttention(H, hd, hd ** -0.5, hkv, layer_id=0)
    own = s.own("flashinfer")
    D = s.spec.speculative_num_draft_tokens if s.speculative else 1
    mine_r, own_r = Runners(s, s.backend, "fi", D), Runners(s, own, "fi", D)
    with s.active():
        for r in (mine_r, own_r):
            r.capture(lambda bs: decode(s, [0] * bs, [1] * bs), "decode")
    L = min(mc.context_len, 2048)
    for step in range(16):
        n = max(s.sizes) if step < 4 else rng.randint(1, max(s.sizes))
        rows, seq = rng.sample(range(1, s.rows), n), lens(rng, n, L - D)
        replayed = step % 2 == 0
        q = torch.randn((r_bs := mine_r.bucket(n)) if replayed else n, H * hd, device="cuda", dtype=torch.bfloat16)
        outs, streams = [], []
        for r in (mine_r, own_r):
            fb = decode(s, rows, seq)
            with s.active():
                if replayed:
                    r.replay(fb, "decode", decode_view(fb, r_bs, r.fill, 1))
                    if r is own_r:  # what SGLang's captured graph of this size runs: its wrappers of that size
                        r.backend.forward_metadata = DecodeMetadata(r.backend.decode_cuda_graph_metadata[r_bs])
                    w = r.backend.forward_metadata.decode_wrappers[0]
                else:
                    r.backend.init_forward_metadata(fb)
                    w = r.backend.forward_metadata.decode_wrappers[0]
                outs.append(r.backend.forward_decode(q, None, None, layer, fb, save_kv_cache=False)[:n].float())
            streams.append(wrapper_stream(w, n))
        for f in streams[1]:
            assert torch.equal(streams[0][f], streams[1][f]), (step, f)
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-2, atol=1e-2)
        if not s.speculative:
            continue
        for mode in ("verify", "draft_extend"):  # eagerly: FlashInfer's prefill over each side's plan
            be_own = own if mode == "verify" else s.own("flashinfer", s.draft_runner)
            be_mine = s.backend if mode == "verify" else s.draft_extend
            qx = torch.randn(n * D, H * hd, device="cuda", dtype=torch.bfloat16)
            res, streams = [], []
            for be in (be_mine, be_own):
                fb = verify(s, rows, seq, random.Random(step)) if mode == "verify" else draft_extend(s, rows, seq)
                # SGLang's own eager draft extend may split the keys: the prefix paged, the D new tokens
                # ragged from k and v, as its model hands them; here they are the pool's own entries
                # (attnmeta's single paged pass reads them from the pool, save_kv_cache=False either way)
                table = s.runner.req_to_token_pool.req_to_token
                loc = torch.cat([table[r, p:p + D] for r, p in zip(rows, seq, strict=True)]).long()
                k = s.runner.token_to_kv_pool.k_buffer[0][loc] if mode == "draft_extend" else None
                v = s.runner.token_to_kv_pool.v_buffer[0][loc] if mode == "draft_extend" else None
                with s.active():
                    be.init_forward_metadata(fb)
                    res.append(be.forward_extend(qx, k, v, layer, fb, save_kv_cache=False).float())
                    m = be.forward_metadata
                    ragged = getattr(m, "use_ragged", False)
                    streams.append(None if ragged else wrapper_stream(m.prefill_wrappers[0], n))
            if mode == "verify":
                for f in streams[1]:
                    assert torch.equal(streams[0][f], streams[1][f]), (mode, step, f)
            torch.testing.assert_close(res[0], res[1], rtol=1e-2, atol=1e-2, msg=lambda m, mode=mode, step=step:
                                       f"{mode} step {step}: {m}")
