"""SGLang 0.5.23's DSV4 compressor planner (``jit/csrc/deepseek_v4/c_plan.cuh``: the decode kernel,
and the prefill planner's host loop followed by its slot-translation kernel), read from its CUDA
source and written here statement by statement as plain Python loops. SGLang builds these plans
with CUDA C++ only, so this is the CPU oracle of the tests; it shares no code with attnmeta.

Plans are returned as int32 words, the structs' memory (``DecodePlan`` {u32 seq_len, i32 write_loc,
i32 read_page_0, i32 read_page_1}; ``CompressPlan`` {u32 seq_len, u16 ragged_id, u16 buffer_len,
i32 read_page_0, i32 read_page_1}; ``WritePlan`` {u32 ragged_id, i32 write_loc})."""

from __future__ import annotations

import torch


def ring_size(ratio: int, num_draft_tokens: int) -> int:
    """get_compress_state_ring_size (paged, not online c128)."""
    if num_draft_tokens > 0:
        return 16 if ratio == 4 else 256
    return 8 if ratio == 4 else 128


def _u32(x: int) -> int:  # a uint32 word read back as int32
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


class _Slots:
    def __init__(self, r2t, f2s, ratio, swa_page_size, ring_size):
        self.r2t, self.f2s, self.cr, self.sps, self.ring = r2t, f2s, ratio, swa_page_size, ring_size

    def compute_loc(self, swa_loc: int) -> int:
        return (swa_loc // self.sps) * self.ring + swa_loc % self.ring

    def req_ring_loc(self, rid: int, position: int) -> int:
        return rid * self.ring + position % self.ring

    def state_loc(self, rid: int, position: int) -> int:
        return self.compute_loc(int(self.f2s[int(self.r2t[rid, position])]))


def plan_decode(rids, seqs, r2t, f2s, ratio, swa_page_size, ring_size, use_req_ring=False) -> torch.Tensor:
    """plan_compress_decode_kernel, one thread per request."""
    s = _Slots(r2t, f2s, ratio, swa_page_size, ring_size)
    out = []
    for rid, seq_len in zip(rids.tolist(), seqs.tolist(), strict=True):
        position_1 = seq_len - 1
        position_0 = max(position_1 - ratio, 0)
        if ratio == 128 or use_req_ring:
            write_loc = s.req_ring_loc(rid, position_1)
            read_page_0 = s.req_ring_loc(rid, position_0) // ratio
            read_page_1 = s.req_ring_loc(rid, position_1) // ratio
        else:
            write_loc = s.state_loc(rid, position_1)
            read_page_0 = s.state_loc(rid, position_0) // ratio
            read_page_1 = write_loc // ratio
        out.append([_u32(seq_len), write_loc, read_page_0, read_page_1])
    return torch.tensor(out, dtype=torch.int32).reshape(-1, 4)


def plan_prefill(rids, seqs, extends, r2t, f2s, ratio, swa_page_size, ring_size, num_q_tokens,
                 use_req_ring=False) -> tuple[torch.Tensor, torch.Tensor]:
    """plan_compress_prefill's host path (use_cuda_graph: padded to num_q_tokens with invalid
    entries), then plan_compress_prefill_kernel_1's slot translation."""
    is_overlap = ratio == 4
    window_size = ratio * (2 if is_overlap else 1)
    mtp_pad = ring_size - window_size + 2 if ring_size > window_size else 0
    plan_c, plan_w = [], []  # stage 0: (seq_len, ragged_id, buffer_len, read_page_0, batch_id) / (ragged, batch, pos+1)
    counter = 0
    for i, (seq_len, extend_len) in enumerate(zip(seqs.tolist(), extends.tolist(), strict=True)):
        prefix_len = seq_len - extend_len
        last_c_pos = seq_len // ratio * ratio
        first_w_pos = min(last_c_pos - (ratio if is_overlap else 0), seq_len - mtp_pad)
        assert 0 < extend_len <= seq_len
        for j in range(extend_len):
            position = prefix_len + j
            ragged_id = counter + j
            if (position + 1) % ratio == 0:
                buffer_len = window_size - min(j + 1, window_size)
                plan_c.append([position + 1, ragged_id, buffer_len, -1, i])
            write = position >= first_w_pos or (
                is_overlap and not use_req_ring and position % swa_page_size >= swa_page_size - ratio)
            if write:
                plan_w.append([ragged_id, i, position + 1])
        counter += extend_len
    assert counter == num_q_tokens
    s = _Slots(r2t, f2s, ratio, swa_page_size, ring_size)
    rid_of = rids.tolist()
    words_c, words_w = [], []
    for seq_len, ragged_id, buffer_len, read_page_0, batch_id in plan_c:  # kernel_1, compress half
        read_page_1 = batch_id
        if buffer_len > 0:
            rid = rid_of[batch_id]
            position_1 = seq_len - 1
            position_0 = max(position_1 - ratio, 0)
            if ratio == 128 or use_req_ring:
                read_page_0 = s.req_ring_loc(rid, position_0) // ratio
                read_page_1 = s.req_ring_loc(rid, position_1) // ratio
            else:
                read_page_0 = s.state_loc(rid, position_0) // ratio
                read_page_1 = s.state_loc(rid, position_1) // ratio
        words_c.append([_u32(seq_len), ragged_id | buffer_len << 16, read_page_0, read_page_1])
    for ragged_id, batch_id, write_pos in plan_w:  # kernel_1, write half
        rid, position = rid_of[batch_id], write_pos - 1
        loc = s.req_ring_loc(rid, position) if ratio == 128 or use_req_ring else s.state_loc(rid, position)
        words_w.append([ragged_id, loc])
    words_c += [[-1, 0, -1, -1]] * (num_q_tokens - len(words_c))  # CompressPlan::invalid()
    words_w += [[-1, -1]] * (num_q_tokens - len(words_w))  # WritePlan::invalid()
    return torch.tensor(words_c, dtype=torch.int32), torch.tensor(words_w, dtype=torch.int32)


def paged_mqa_schedule(context_lens, num_sm: int) -> torch.Tensor:
    """paged_mqa_metadata.cuh (the single-block kernel every path shares): a prefix sum of 256-key
    blocks, then per SM i a binary search (upper bound) for its start ``target``."""
    s_prefix, running = [], 0
    for length in context_lens.tolist():
        running += (length + 256 - 1) >> 8
        s_prefix.append(running)
    bs, global_sum = len(s_prefix), running
    avg, ret = global_sum // num_sm, global_sum % num_sm
    pivot = num_sm - ret
    out = []
    for i in range(num_sm + 1):
        target = i * avg + (i - pivot if i > pivot else 0)
        lo, hi = 0, bs
        while lo < hi:
            mid = (lo + hi) >> 1
            if s_prefix[mid] <= target:
                lo = mid + 1
            else:
                hi = mid
        q = lo
        if q >= bs:
            out.append([bs, 0])
        else:
            out.append([q, target - (0 if q == 0 else s_prefix[q - 1])])
    return torch.tensor(out, dtype=torch.int32)
