"""SGLang's three CUDA-graph runners as they drive a backend on a CPU (capture, then pad, view and replay), and
how two backends' metadata are compared on the rows kernels read: for the integration tests, beside
``sglang_server`` (the server they run in)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode

if TYPE_CHECKING:
    from tests.integrations.sglang_server import Server


# --- SGLang's three graph runners, as they drive a backend (capture, then pad, view and replay) ---
class Runners:
    """Capture and replay as SGLang's ``DecodeCudaGraphRunner`` (decode, idle, target verify),
    ``EagleDraftCudaGraphRunner`` (draft decode) and ``EAGLEDraftExtendCudaGraphRunner`` (draft
    extend V2) do, over attnmeta's emulated graph on a CPU: ``init_cuda_graph_state`` once, then per
    captured size a dummy batch (pool row 0, the backend's fill) through out_graph(in_capture=True) and
    in_graph recorded; at replay the runner's buffers padded to the captured size and the view each
    runner hands out_graph (decode: SGLang's own ``build_replay_fb_view``; draft decode: the batch with
    ``num_padding``; draft extend: its buffers without ``num_padding``, the live tokens only)."""

    def __init__(self, server: Server, backend, kind: str, width: int = 1):
        from attnmeta.runtime import new_graph

        self.server, self.backend, self.kind, self.width = server, backend, kind, width
        self.sizes = server.sizes
        self.fill = backend.get_cuda_graph_seq_len_fill_value() if hasattr(backend,
                                                                           "get_cuda_graph_seq_len_fill_value") else 1
        self.graphs: dict = {}
        self.static: dict = {}  # (mode, bs) -> the batch captured: its tensors are the runner's buffers
        self._graph = lambda: new_graph(torch.device(server.device))  # a CUDA graph on a GPU, else emulated
        with server.active():
            backend.init_cuda_graph_state(max(self.sizes), max(self.sizes) * width)

    def bucket(self, n: int) -> int:
        return min(s for s in self.sizes if s >= n)

    def capture(self, make, mode_key) -> None:
        """``make(bs)``: the capture batch of a size (pool row 0, fill lengths)."""
        with self.server.active():
            for bs in self.sizes:
                fb = make(bs)
                self.backend.init_forward_metadata_out_graph(fb, in_capture=True)
                g = self._graph()
                with g.capture():
                    self.backend.init_forward_metadata_in_graph(fb)
                self.graphs[(mode_key, bs)] = g
                self.static[(mode_key, bs)] = fb

    def replay(self, fb, mode_key, view):
        """As SGLang's runners replay: the batch's rows and lengths copied into the buffers the graph was
        captured on (a kernel recorded in in_graph reads those), and the view handed out_graph points at
        them."""
        self.prepare(mode_key, view)
        with self.server.active():
            self.backend.init_forward_metadata_out_graph(view)
            self.graphs[(mode_key, view.batch_size)].replay()

    def prepare(self, mode_key, view) -> None:
        """The runner's copies before out_graph: the rows and lengths into the captured buffers (the view then
        points at them), the step's write slots into the captured ones (SGLang's own draft extend reads them
        in its graph), draft extend's per-request lengths into the captured ones, and, as SGLang's EAGLE
        worker does when the target backend owns a verify mask buffer (``verify_mask``), the tree mask
        written into that buffer."""
        static = self.static[(mode_key, view.batch_size)]
        # the draft-decode runner re-points its view at the buffers only when it padded rows: an unpadded
        # view keeps the batch's own tensors, whose values it copied into the buffers
        repoint = mode_key != "draft" or view.num_padding != 0
        for f in ("seq_lens", "req_pool_indices"):
            src, dst = getattr(view, f, None), getattr(static, f, None)
            if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and src.shape == dst.shape:
                dst.copy_(src)
                if repoint:
                    setattr(view, f, dst)
        src, dst = getattr(view, "out_cache_loc", None), getattr(static, "out_cache_loc", None)
        if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and src.numel() <= dst.numel() \
                and src.data_ptr() != dst.data_ptr():  # the write slots too (a graph reading them reads these)
            dst[: src.numel()].copy_(src)
        spec = getattr(view, "spec_info", None)
        src, dst = getattr(spec, "extend_seq_lens_tensor", None), getattr(static, "extend_seq_lens", None)
        if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and src.shape == dst.shape:
            dst.copy_(src)
            spec.extend_seq_lens_tensor = dst
        vm = getattr(self.backend, "verify_mask", None)
        mask = getattr(spec, "custom_mask", None)
        if view.forward_mode.name == "TARGET_VERIFY" and vm is not None and isinstance(mask, torch.Tensor) and \
                mask.data_ptr() != vm.buffer.data_ptr() and mask.numel() <= vm.buffer.numel():
            vm.buffer[: mask.numel()].copy_(mask.view(-1))
            spec.custom_mask = vm.buffer


def rows_read(ours, theirs, f: str, live: int):
    """Field ``f`` of two metadata objects on the rows kernels read, sized by ``theirs``: an indptr's first
    live + 1 entries, the indices it covers, a per-row field's live rows, a mask up to its indptr's end,
    scalars (and None) as they are."""
    a, b = getattr(ours, f), getattr(theirs, f)
    if a is None or b is None or isinstance(b, int):
        return a, b
    if f.endswith("indices"):
        n = int(getattr(theirs, f.replace("indices", "indptr"))[live])
        return a[:n], b[:n]
    if f == "custom_mask":
        n = int(theirs.mask_indptr[live])
        return a[:n].to(torch.bool), b[:n].to(torch.bool)
    if f.endswith("indptr"):
        return a[: live + 1], b[: live + 1]
    if f == "uneven_batch":
        return a.reshape(-1)[:1], b.reshape(-1)[:1]
    return a[:live], b[:live]


def padded(fb, bs: int, fill: int):
    """The runner's buffers: the live rows, then request row 0 at the fill length."""
    raw, dev = fb.batch_size, fb.seq_lens.device
    seq = torch.full((bs,), fill, dtype=torch.int64, device=dev)
    rows = torch.zeros(bs, dtype=torch.int64, device=dev)
    seq[:raw], rows[:raw] = fb.seq_lens, fb.req_pool_indices
    return seq, rows, raw


def decode_view(fb, bs: int, fill: int, width: int):
    """What SGLang's decode graph runner hands out_graph at replay (its own ``build_replay_fb_view``)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import build_replay_fb_view

    seq, rows, raw = padded(fb, bs, fill)
    if fb.forward_mode.is_idle():
        raw = 0
    dev = seq.device
    bufs = SimpleNamespace(input_ids=torch.zeros(bs * width, dtype=torch.int64, device=dev),
                           positions=torch.zeros(bs * width, device=dev),
                           req_pool_indices=rows, seq_lens=seq, seq_lens_cpu=seq.cpu(), encoder_lens=None,
                           mamba_track_indices=None)
    mode = ForwardMode.DECODE if fb.forward_mode.is_idle() else fb.forward_mode
    return build_replay_fb_view(fb, bufs, bs, raw, bs * width, None, fill, mode, False)


def draft_decode_view(fb, bs: int, fill: int):
    """EagleDraftCudaGraphRunner: the batch re-pointed at its padded buffers, plus ``num_padding`` (the write
    slots too, zero past the live rows' ``topk * S``); with no row padded, the batch itself (its own tensors:
    the runner copied their values into its buffers, and ``prepare`` does)."""
    if fb.batch_size == bs:
        return SimpleNamespace(**vars(fb), num_padding=0)
    seq, rows, raw = padded(fb, bs, fill)
    K = fb.positions.numel() // max(raw, 1)
    positions = torch.zeros(bs * K, dtype=torch.int64, device=seq.device)  # zeroed, then the live rows copied
    positions[: raw * K] = fb.positions
    loc = fb.out_cache_loc
    if isinstance(loc, torch.Tensor) and raw:
        loc = torch.zeros(loc.numel() // raw * bs, dtype=loc.dtype, device=loc.device)
        loc[: fb.out_cache_loc.numel()] = fb.out_cache_loc
    view = dict(vars(fb), batch_size=bs, seq_lens=seq, req_pool_indices=rows, seq_lens_cpu=seq.cpu(),
                seq_lens_sum=int(seq.sum()), positions=positions, out_cache_loc=loc)
    return SimpleNamespace(**view, num_padding=bs - raw)


def draft_extend_view(fb, bs: int, fill: int, width: int):
    """EAGLEDraftExtendCudaGraphRunner: its buffers at the captured size (padded rows: request row 0,
    the fill length, ``width`` accepted), the live requests' tokens only, no ``num_padding``."""
    seq, rows, raw = padded(fb, bs, fill)
    ext = torch.full((bs,), width, dtype=torch.int32, device=seq.device)  # the batch's lengths, padded rows width
    ext[:raw] = fb.extend_seq_lens
    fb.spec_info.extend_seq_lens_tensor, fb.spec_info.extend_seq_lens_cpu = ext, ext.tolist()
    return SimpleNamespace(batch_size=bs, forward_mode=fb.forward_mode, input_ids=fb.input_ids,
                           req_pool_indices=rows, seq_lens=seq, seq_lens_sum=int(seq.sum()), seq_lens_cpu=seq.cpu(),
                           encoder_lens=None, out_cache_loc=fb.out_cache_loc, kv_loc_plan=fb.kv_loc_plan,
                           kv_loc_cols=None, out_cache_loc_virtual=None, spec_info=fb.spec_info,
                           mamba_track_indices=None, positions=fb.positions)
