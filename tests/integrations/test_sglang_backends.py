"""SGLang's own attention kernels reading attnmeta's metadata, through SGLang's own ``forward_decode``
of the backend SGLang built (``Server``), against attention read by hand from SGLang's KV pool, eager
and replayed. The kernels are SGLang's Triton ones, in Triton's interpreter on a CPU (fp32: the
interpreter computes bf16 attention wrong, SGLang's own metadata included). SGLang's extend kernel
(verify, draft extend) corrupts the interpreter's memory on a CPU with SGLang's own metadata as with
attnmeta's, so those modes' attention is checked on the H200 (``tests/gpu/test_sglang_engine.py``)."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend as SGLangAttentionBackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention

from attnmeta.integrations.sglang.kinds import KIND
from tests.integrations.sglang_server import (
    ROWS,
    Runners,
    Server,
    decode,
    decode_view,
)

FLAGS = ["--attention-backend", "attnmeta_triton", "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk",
         "4", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"]


@pytest.fixture(scope="module")
def server():
    s = Server(FLAGS, seed=5)
    pool = s.runner.token_to_kv_pool
    g = torch.Generator().manual_seed(0)
    for buf in (*pool.k_buffer, *pool.v_buffer):  # the cache, as if every slot held a token
        buf.copy_(torch.randn(buf.shape, generator=g).to(buf.dtype))
    return s


def test_the_backends_are_sglangs_own():
    for name in ("triton", "flashinfer"):
        cls = KIND[name].face_class(mla=False)
        assert issubclass(cls, SGLangAttentionBackend) and cls.spec_name == name
    assert issubclass(KIND["triton"].face_class(False), TritonAttnBackend)
    assert KIND["triton"].face_class(False).forward_decode is TritonAttnBackend.forward_decode  # SGLang's own code


def layer(s: Server, layer_id: int = 0) -> RadixAttention:
    mc = s.model_config
    return RadixAttention(mc.num_attention_heads, mc.head_dim, mc.head_dim ** -0.5, mc.get_num_kv_heads(1),
                          layer_id=layer_id)


def oracle(s: Server, q, rows, kv_lens, allowed) -> torch.Tensor:
    """Attention read by hand: query row t of request i over the pool slots of its first ``kv_lens[i]``
    tokens, where ``allowed(i, t, j)``; fp32."""
    pool, r2t = s.runner.token_to_kv_pool, s.runner.req_to_token_pool.req_to_token
    H, hkv = q.shape[1], pool.k_buffer[0].shape[1]
    outs, per = [], q.shape[0] // len(rows)
    for i, (r, n) in enumerate(zip(rows, kv_lens, strict=True)):
        idx = r2t[r, :n].long()
        k = pool.k_buffer[0][idx].float().repeat_interleave(H // hkv, 1)
        v = pool.v_buffer[0][idx].float().repeat_interleave(H // hkv, 1)
        for t in range(per):
            ok = torch.tensor([allowed(i, t, j) for j in range(n)])
            sc = torch.einsum("hd,nhd->hn", q[i * per + t].float(), k) * q.shape[-1] ** -0.5
            outs.append(torch.einsum("hn,nhd->hd", torch.softmax(sc.masked_fill(~ok, float("-inf")), -1), v))
    return torch.stack(outs)


def test_decode_attention_is_sglangs_kernel_over_the_metadata(server):
    s, rng = server, random.Random(1)
    be, mc = s.backend, s.model_config
    run = Runners(s, be, "t", s.spec.speculative_num_draft_tokens)
    with s.active():
        run.capture(lambda bs: decode(s, [0] * bs, [run.fill] * bs), "decode")
    H, hd = mc.num_attention_heads, mc.head_dim
    for replayed in (False, True, True):
        rows, seq = rng.sample(range(1, ROWS), 3), [rng.choice([1, 16, 17, 129, 700]) for _ in range(3)]
        fb = decode(s, rows, seq)
        with s.active():
            if replayed:
                run.replay(fb, "decode", decode_view(fb, run.bucket(3), run.fill, 1))
            else:
                be.init_forward_metadata(fb)
            q = torch.randn(run.bucket(3) if replayed else 3, H * hd).float()
            out = be.forward_decode(q, None, None, layer(s), fb, save_kv_cache=False).view(-1, H, hd)[:3]
        want = oracle(s, q[:3].view(3, H, hd), rows, seq, lambda i, t, j: True)
        torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)
