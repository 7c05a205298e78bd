"""What each side's kernels read after a step of tools/bench_sglang.py, copied for the comparison at the end:
a planned FlashInfer wrapper's index stream, FlashInfer MLA's kv indices and plan words, FlashMLA's pages and
tile schedule, TRT-LLM MHA's (and FA3's) key lengths, pages and indptrs, FA3's tree expansion."""

from __future__ import annotations

import torch


def stream(w, live: int) -> dict:
    """What a planned FlashInfer wrapper's kernels read, on the live rows."""
    out = {}
    indptr = w._paged_kv_indptr_buf[: live + 1].clone()
    out["kv_indptr"], out["kv_last_page_len"] = indptr, w._paged_kv_last_page_len_buf[:live].clone()
    out["kv_indices"] = w._paged_kv_indices_buf[: int(indptr[-1])].clone()
    if getattr(w, "_qo_indptr_buf", None) is not None and not hasattr(w, "_use_tensor_cores"):
        out["qo_indptr"] = w._qo_indptr_buf[: live + 1].clone()
    if getattr(w, "_custom_mask_buf", None) is not None and getattr(w, "_mask_indptr_buf", None) is not None:
        n = int(w._mask_indptr_buf[live])
        out["custom_mask"] = w._custom_mask_buf[:n].clone()
    return out


def mla_read(be, mine: bool, mode: str, prep) -> dict:
    """What FlashInfer's MLA kernel reads: the kv indices of the live rows and the plan's arrays in the int
    workspace up to the live work items (``run`` takes no other metadata buffer)."""
    if mine:
        md = be.forward_metadata
        w = md.decode_wrapper if mode == "decode" else md.prefill_wrapper
    else:
        w = (be.decode_cuda_graph_metadata if mode == "decode" else be.prefill_cuda_graph_metadata)[prep.bs]
    from attnmeta.backends.flashinfer_mla.device_plan import MLALayout, read_regions

    D = 0 if mode == "decode" else prep.fb.spec_info.draft_token_num
    total = int(prep.fb.seq_lens[: prep.live].sum()) + D * prep.live
    words = w._int_workspace_buffer.view(torch.int32)
    sms = torch.cuda.get_device_properties(words.device).multi_processor_count
    layout = MLALayout.of(w._plan_info, prep.bs, 0, False, sms)  # where the plan's arrays are (same on both)
    plan = torch.cat([words[a:a + n] for a, n in read_regions(layout, words)]) if layout else words.clone()
    return {"kv_indices": w._kv_indices_buf[:total].clone(), "plan": plan}


def flashmla_read(md, mode: str, prep) -> dict:
    """What FlashMLA's kernel reads: the pages each live row's keys cover, the whole tile schedule (every
    part's seven words, the split counts of the rows scheduled) and, in draft extend, the key lengths."""
    from attnmeta.backends.flashmla.planner import SCHEDULED

    D = prep.fb.spec_info.draft_token_num if mode == "verify" else 0
    keys = (prep.fb.seq_lens[: prep.live] + D).tolist()
    out = {"pages": torch.cat([md.block_kv_indices[i, : -(-k // 64)] for i, k in enumerate(keys)]).clone(),
           "schedule": md.flashmla_metadata[:, :SCHEDULED].clone(), "splits": md.num_splits[: prep.bs + 1].clone()}
    if mode == "extend":
        out["seq_lens_k"] = md.seq_lens_k[: prep.live].clone()
    return out


def trtllm_read(md, prep, P: int) -> dict:
    """What TRT-LLM MHA's kernel reads: each live row's key length, the pages its keys cover, the query and key
    indptrs and the longest query."""
    keys = md.cache_seqlens_int32[: prep.live]
    return {"keys": keys.clone(), "max_q": int(md.max_seq_len_q),
            "pages": torch.cat([md.page_table[i, : -(-k // P)] for i, k in enumerate(keys.tolist())]).clone(),
            **{f: getattr(md, f)[: prep.live + 1].clone() for f in ("cu_seqlens_q", "cu_seqlens_k")}}


def expand_read(md, rows: int) -> dict:
    """What FA3's second attention of a topk > 1 verify reads: per draft query its visible drafts' count and
    slots, and the key indptr."""
    keys = md.cache_seqlens_int32[:rows]
    return {"expand_keys": keys.clone(), "expand_cu_k": md.cu_seqlens_k[: rows + 1].clone(),
            "expand_slots": torch.cat([md.page_table[r, :k] for r, k in enumerate(keys.tolist())]).clone()}
