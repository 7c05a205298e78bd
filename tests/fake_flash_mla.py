"""A stand-in for FlashMLA (``flash_mla``, SGLang's ``sgl-flash-mla`` wheel: CUDA only) on a CPU, so SGLang's
own ``FlashMLABackend`` can be built and its metadata code run here as the oracle of ``attnmeta_flashmla``.

Its one working function is the scheduler SGLang calls every step, ``get_mla_decoding_metadata`` (dense
BF16, the legacy kernels'), restated here from FlashMLA's scheduler on its own terms: a queue of requests,
each costing its 64-token key blocks plus a fixed 5, poured part by part into ``num_sm_parts`` equal
budgets. It shares no code with attnmeta's scheduler kernel or its Python transcription (``schedule``);
both it and they are checked against the real FlashMLA on the H200 (``tests/gpu/test_flashmla_*``). The
SM count is an H200's, as attnmeta's option defaults to. The attention kernel raises: nothing here runs it.
"""

from __future__ import annotations

import sys
import types

import torch

SMS, BLOCK, OVERHEAD = 132, 64, 5


class FlashMLASchedMeta:
    def __init__(self, tile_scheduler_metadata=None, num_splits=None):
        self.tile_scheduler_metadata, self.num_splits = tile_scheduler_metadata, num_splits
        self.have_initialized, self.config = False, None


def get_mla_decoding_metadata(seqlens_k, num_q_tokens_per_head_k, h_k, h_q=None, is_fp8_kvcache=False, topk=None,
                              use_legacy=False):
    assert use_legacy and not is_fp8_kvcache and topk is None, "the stand-in schedules dense BF16 decode only"
    parts = max(SMS // h_k // -(-num_q_tokens_per_head_k // 64), 1)
    lens = [int(x) for x in seqlens_k.tolist()]
    cost = [(max(n, 1) + BLOCK - 1) // BLOCK for n in lens]  # a request's key blocks (an empty one has one)
    budget = -(-sum(c + OVERHEAD for c in cost) // parts) + OVERHEAD
    rows, cum = [], [0]
    req, done, pieces = 0, 0, 0  # the request being placed, its blocks placed, the parts it has had
    for _ in range(parts):
        row = dict(begin_req=req, begin_block=done, begin_split=pieces, first=done > 0)
        left = budget
        while req < len(lens) and left >= cost[req] - done + OVERHEAD:  # the rest of the request fits
            left -= cost[req] - done + OVERHEAD
            cum.append(cum[-1] + pieces + 1)
            req, done, pieces = req + 1, 0, 0
        if req < len(lens) and left > OVERHEAD:  # a piece of it does: the request is split here
            done, pieces = done + left - OVERHEAD, pieces + 1
        if done:
            end_req, end_block = req, done
        else:  # ends with the last whole request (an empty one ends at block 0)
            end_req = req - 1
            end_block = cost[end_req] if lens[end_req] else 0
        last = end_block != cost[end_req] and lens[end_req] != 0
        first = row["first"]
        if row["begin_req"] == end_req:
            first = last = first or last
        rows.append([row["begin_req"], end_req, row["begin_block"], end_block, row["begin_split"], int(first),
                     int(last), 0])
    dev = seqlens_k.device
    return torch.tensor(rows, dtype=torch.int32, device=dev), torch.tensor(cum, dtype=torch.int32, device=dev)


def get_mla_metadata(*args, **kwargs):
    return FlashMLASchedMeta(), None


def flash_mla_with_kvcache(*args, **kwargs):
    raise AssertionError("FlashMLA's attention ran on a CPU (the stand-in has no kernels)")


def module() -> types.ModuleType:
    m = types.ModuleType("flash_mla")
    interface = types.ModuleType("flash_mla.flash_mla_interface")
    interface.FlashMLASchedMeta = FlashMLASchedMeta
    for f in (get_mla_decoding_metadata, get_mla_metadata, flash_mla_with_kvcache):
        setattr(m, f.__name__, f)
        setattr(interface, f.__name__, f)
    m.flash_mla_interface = interface
    m.fused_norm_rope_attn_rope_cast = types.ModuleType("flash_mla.fused_norm_rope_attn_rope_cast")
    m.__version__ = "stand-in"
    return m


class _Cuda:
    """``torch.cuda`` as SGLang's FlashMLA backend sees it here: an H200's SM count."""

    def get_device_properties(self, device=None):
        return types.SimpleNamespace(multi_processor_count=SMS)

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


def into_sglang(monkeypatch) -> None:
    """This stand-in as ``flash_mla`` for SGLang's FlashMLA backend module, which is imported (fresh) with
    the stand-ins of FlashInfer MLA (its base class builds FlashInfer's wrappers) and ``torch`` making its
    ``"cuda"`` buffers on the CPU; on undo, SGLang's modules built over the stand-in are dropped again."""
    from tests import fake_flashinfer

    fake_flashinfer.into_sglang_mla(monkeypatch)
    m = module()
    for name, mod in (("flash_mla", m), ("flash_mla.flash_mla_interface", m.flash_mla_interface),
                      ("flash_mla.fused_norm_rope_attn_rope_cast", m.fused_norm_rope_attn_rope_cast)):
        monkeypatch.setitem(sys.modules, name, mod)
    built = ("sglang.kernels.ops.attention.flash_mla_interface", "sglang.srt.layers.attention.flashmla_backend",
             "attnmeta.integrations.sglang.flashmla")
    for name in built:
        monkeypatch.delitem(sys.modules, name, raising=False)
    import importlib

    sgl = importlib.import_module("sglang.srt.layers.attention.flashmla_backend")
    for name in built:  # registered so the undo removes them (they hold the stand-in)
        importlib.import_module(name)
        monkeypatch.setitem(sys.modules, name, sys.modules[name])
    on_cpu = fake_flashinfer._OnTheCPU()
    on_cpu.cuda = _Cuda()
    monkeypatch.setattr(sgl, "torch", on_cpu)
