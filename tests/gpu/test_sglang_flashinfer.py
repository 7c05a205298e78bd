"""The SGLang-facing FlashInferBackend on the H200, driven as SGLang's graph runner drives a backend:
``init_cuda_graph_state``, per mode and size out_graph with ``in_capture=True`` then in_graph and the
attention captured in a CUDA graph, then replays through the runner's padded view (``num_padding``,
``actual_forward_mode``), with real FlashInfer, against an fp32 oracle read from the pool.

SGLang itself does not import on this machine (its CUDA code paths import SGLang's GPU kernel
package, which is not installed here), so where it is missing the three SGLang definitions the
backend module imports, the ``AttentionBackend`` base and FlashInfer's ``DecodeMetadata`` /
``PrefillMetadata`` dataclasses, are STAND-INS with the same fields; the CPU suite
(tests/integrations) checks the backend against SGLang's real classes and kernels."""

import dataclasses
import enum
import importlib.util
import random
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from attnmeta.compiler import CompileOptions, compile_backend
from tests.batches import make_pool
from tests.oracles import masked_attention_from_pool

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer not installed")]
L, ROWS, D, MAX_BS, SIZES, H, HKV, HD = 1024, 40, 4, 16, (4, 16), 8, 2, 128


class Mode(enum.IntEnum):  # SGLang's ForwardMode names (the backend maps modes by name)
    DECODE, IDLE, TARGET_VERIFY, DRAFT_EXTEND_V2 = 2, 4, 5, 6


def sglang_backends():
    # the stand-in, once installed, is in sys.modules without a module spec (find_spec would raise)
    if "sglang" not in sys.modules and importlib.util.find_spec("sglang") is None:
        _stand_in_sglang()
    from attnmeta.integrations.sglang.backend import FlashInferBackend

    return FlashInferBackend


def _stand_in_sglang():
    """STAND-IN for the SGLang definitions the backend module imports (see the module docstring)."""
    class AttentionBackend:
        def init_forward_metadata(self, fb):
            self.init_forward_metadata_out_graph(fb)
            self.init_forward_metadata_in_graph(fb)

    @dataclasses.dataclass
    class DecodeMetadata:
        decode_wrappers: list
        swa_out_cache_loc: object = None

    @dataclasses.dataclass
    class PrefillMetadata:
        prefill_wrappers: list
        use_ragged: bool
        extend_no_prefix: bool
        multi_item_params: object = None
        swa_out_cache_loc: object = None

    names = ["sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.attention"]
    for n in names:
        sys.modules.setdefault(n, types.ModuleType(n))
    base = types.ModuleType("sglang.srt.layers.attention.base_attn_backend")
    base.AttentionBackend = AttentionBackend
    fi = types.ModuleType("sglang.srt.layers.attention.flashinfer_backend")
    fi.DecodeMetadata, fi.PrefillMetadata = DecodeMetadata, PrefillMetadata
    sys.modules[base.__name__], sys.modules[fi.__name__] = base, fi


class KVPool:
    def __init__(self, slots, dev, g):
        self.k = torch.randn(slots, HKV, HD, generator=g).to(dev).bfloat16()
        self.v = torch.randn(slots, HKV, HD, generator=g).to(dev).bfloat16()

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


def sglang_batch(mode, bs, lens, rows, kv, dev, masks=None):
    """A batch as SGLang's graph runner hands it: buffers padded to bs (fill 1, row 0), num_padding."""
    raw = len(lens)
    seq, rpi = torch.ones(bs, dtype=torch.int64), torch.zeros(bs, dtype=torch.int64)
    seq[:raw], rpi[:raw] = torch.tensor(lens, dtype=torch.int64), torch.tensor(rows, dtype=torch.int64)
    spec = None
    if mode is Mode.TARGET_VERIFY:
        spec = SimpleNamespace(custom_mask=torch.cat(masks) if masks else None)
    T = 1 if mode is Mode.DECODE else D
    return SimpleNamespace(batch_size=bs, forward_mode=mode, actual_forward_mode=mode, num_padding=bs - raw,
                           req_pool_indices=rpi.to(dev), seq_lens=seq.to(dev), seq_lens_cpu=seq,
                           out_cache_loc=torch.zeros(raw * T, dtype=torch.int64, device=dev), spec_info=spec,
                           token_to_kv_pool=kv, extend_seq_lens=None, extend_seq_lens_cpu=None)


@pytest.mark.parametrize("on_device", [False, True], ids=["default", "plan-on-device"])
def test_sglang_flashinfer_backend_under_the_graph_runner(on_device):
    """Default compile, and plan_on_device (no host indptrs: the partition planned on the GPU only)."""
    FlashInferBackend = sglang_backends()
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=7, device=dev)
    cb = compile_backend("flashinfer", CompileOptions(
        max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, num_draft_tokens=D, num_heads=H, num_kv_heads=HKV,
        modes=("decode", "idle", "target_verify", "draft_extend"), plan_on_device=on_device))
    be = FlashInferBackend(cb, pool, num_heads=H, num_kv_heads=HKV, head_dim=HD)
    be.init_cuda_graph_state(MAX_BS, MAX_BS * D)
    fill = be.get_cuda_graph_seq_len_fill_value()
    g = torch.Generator().manual_seed(4)
    kv = KVPool(ROWS * L + 1, dev, g)
    layer = SimpleNamespace(tp_q_head_num=H, qk_head_dim=HD, v_head_dim=HD, layer_id=0, scaling=HD ** -0.5)
    q_in = torch.zeros(MAX_BS * D, H * HD, dtype=torch.bfloat16, device=dev)
    out = torch.zeros_like(q_in)
    graphs = {}
    for mode in (Mode.DECODE, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2):
        T = 1 if mode is Mode.DECODE else D
        fwd = be.forward_decode if mode is Mode.DECODE else be.forward_extend
        for bs in sorted(SIZES, reverse=True):
            masks = [torch.ones(D * (fill + D), dtype=torch.bool, device=dev)] * bs
            fb = sglang_batch(mode, bs, [fill] * bs, [0] * bs, kv, dev, masks)
            fb.num_padding = 0
            be.init_forward_metadata_out_graph(fb, in_capture=True)
            be.init_forward_metadata_in_graph(fb)
            fwd(q_in[: bs * T], None, None, layer, fb, save_kv_cache=False)  # warm-up: FlashInfer's JIT
            torch.cuda.synchronize()
            graphs[mode, bs] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[mode, bs]):
                be.init_forward_metadata_in_graph(fb)
                out[: bs * T] = fwd(q_in[: bs * T], None, None, layer, fb, save_kv_cache=False)
    rng = random.Random(3)
    for step in range(18):
        mode = [Mode.DECODE, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2, Mode.IDLE][step % 4]
        raw = 0 if mode is Mode.IDLE else rng.randint(1, MAX_BS)
        bs = min(s for s in SIZES if s >= max(raw, 1))
        lens = [rng.choice([D, D + 1, 16, 17, 255, 256, 257, L - D]) if rng.random() < 0.5
                else rng.randint(D, L - D) for _ in range(raw)]
        rows = rng.sample(range(1, ROWS), raw)
        masks = [torch.rand(D * (n + D), generator=g).to(dev) < 0.6 for n in lens]
        for m in masks:
            m.view(D, -1)[:, 0] = True
        graph_mode = Mode.DECODE if mode is Mode.IDLE else mode
        fb = sglang_batch(graph_mode, bs, lens, rows, kv, dev, masks)
        fb.actual_forward_mode = mode
        be.init_forward_metadata_out_graph(fb)
        T = 1 if graph_mode is Mode.DECODE else D
        q = torch.randn(raw * T, H * HD, generator=g).to(dev).bfloat16()
        q_in[: raw * T], q_in[raw * T : bs * T] = q, 0
        graphs[graph_mode, bs].replay()
        torch.cuda.synchronize()
        if raw:
            verify, T = mode is Mode.TARGET_VERIFY, 1 if mode is Mode.DECODE else D
            want = masked_attention_from_pool(q.view(-1, H, HD), kv.k, kv.v, pool, rows, lens, T, D if verify else 0,
                                              masks if verify else None)
            rel = float((out[: raw * T].float().view(-1, H, HD) - want).norm() / want.norm())
            assert rel < 1e-2, (step, mode.name, raw, bs, rel)
