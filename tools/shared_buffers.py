"""SGLang's own backend and attnmeta's of the same kind on one set of engine buffers, captured and timed in rounds.

    python tools/shared_buffers.py [--kinds triton,flashinfer] [--pages 1,16] [--steps 330] [--device cuda]

The sequence (one process, per kind and page size): both backends built by SGLang on the same runner; one set of
int64 static buffers in the layout of SGLang's ``DecodeInputBuffers`` (zeroed, lengths at the fill value) shared by
both; for each backend ``init_cuda_graph_state``, then per size 256, 64, 8, 1 (largest first): out_graph on the
capture batch (``in_capture=True``), two eager in_graph runs each followed by a synchronize, then the capture, in a
memory pool of its own, of in_graph and ``marker.add_(1)`` on a float32 ``torch.zeros(1)`` allocated just before;
then a marker-only floor graph per size. Then rounds: per size, ``--steps`` steps of each backend (a live batch
copied into the shared buffers, SGLang's ``build_replay_fb_view``, out_graph on the view, the replay) and as many
floor replays; the second round in the reverse order. Every attnmeta step's kv indices are checked against the
live rows, and a ``BatchError`` ends the run: a marker's count read back as a request row means a captured graph
reads memory its plan does not own. With ``--trace`` the allocator's history is recorded, and on such an error the
history of every marker's address is printed (what held it before, freed where).
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

sys.path.insert(0, __file__.rsplit("/tools/", 1)[0])

SIZES = (256, 64, 8, 1)


def flags(kind: str, page: int) -> list[str]:
    return ["--attention-backend", f"attnmeta_{kind}", "--page-size", str(page), "--cuda-graph-bs-decode",
            *map(str, sorted(SIZES)), "--max-running-requests", str(max(SIZES) + 8)]


class Shared:
    """One set of the graph runner's input buffers (SGLang's DecodeInputBuffers layout), shared by both sides."""

    def __init__(self, n: int, fill: int, device):
        i64 = dict(dtype=torch.int64, device=device)
        self.fill = fill
        self.input_ids, self.positions = torch.zeros(n, **i64), torch.zeros(n, **i64)
        self.req_pool_indices = torch.zeros(n, **i64)
        self.seq_lens = torch.full((n,), fill, **i64)
        self.seq_lens_cpu = torch.full((n,), fill, dtype=torch.int64)
        self.out_cache_loc = torch.zeros(n, **i64)
        self.encoder_lens = self.mamba_track_indices = None

    def capture_batch(self, s, bs: int):
        from tests.integrations.sglang_server import decode

        fb = decode(s, [0] * bs, [self.fill] * bs)
        for f in ("input_ids", "positions", "req_pool_indices", "seq_lens", "seq_lens_cpu", "out_cache_loc"):
            setattr(fb, f, getattr(self, f)[:bs])
        return fb

    def load(self, fb, rows: list[int], seq: list[int], bs: int):
        """A live batch copied in (padded rows: request row 0, the fill length) and SGLang's view of it."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import build_replay_fb_view

        n = len(rows)
        self.req_pool_indices[n:].zero_()
        self.seq_lens[n:].fill_(self.fill)
        self.seq_lens_cpu[n:] = self.fill
        self.req_pool_indices[:n].copy_(torch.tensor(rows), non_blocking=True)
        self.seq_lens[:n].copy_(torch.tensor(seq), non_blocking=True)
        self.seq_lens_cpu[:n] = torch.tensor(seq)
        return build_replay_fb_view(fb, self, bs, n, bs, None, self.fill, ForwardMode.DECODE, False)


def capture(be, shared: Shared, s, sync) -> dict:
    from attnmeta.runtime import new_graph

    out = {}
    be.init_cuda_graph_state(max(SIZES), max(SIZES))
    for bs in SIZES:
        fb = shared.capture_batch(s, bs)
        be.init_forward_metadata_out_graph(fb, in_capture=True)
        for _ in range(2):
            be.init_forward_metadata_in_graph(fb)
            sync()
        marker = torch.zeros(1, device=shared.req_pool_indices.device)
        g = new_graph(marker.device)  # a memory pool of its own
        with g.capture():
            be.init_forward_metadata_in_graph(fb)
            marker.add_(1)
        out[bs] = (g, marker)
    return out


def floors(device) -> dict:
    from attnmeta.runtime import new_graph

    out = {}
    for bs in SIZES:
        marker = torch.zeros(1, device=device)
        g = new_graph(device)
        with g.capture():
            marker.add_(1)
        out[bs] = (g, marker)
    return out


def held(be) -> list[tuple[str, int, int]]:
    """(what, address, bytes) of every device tensor attnmeta's bound plans hand their captured graphs: the
    arguments of the lowered modules, the engine buffers bound in place, the staged device-only fields' copies,
    the device record and the word."""
    am, out = be.attnmeta, []

    def add(what, t):
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            out.append((what, t.data_ptr(), t.numel() * t.element_size()))

    for key, b in am._bound.items():
        for a, t in zip(b.binding.in_args, b.in_args, strict=True):
            add(f"{key} in_arg {a.name}", t)
        for e in getattr(b.engine, "inputs", ()):
            add(f"{key} engine {e.name}", e.tensor)
        for st in b.stager.slots:
            add(f"{key} raw {st.source}", st.raw)
            add(f"{key} dev {st.source}", st.dev)
    add("word", getattr(getattr(am, "_word", None), "tensor", None))
    return out


def trace(markers: dict) -> None:
    """The allocator's history of each marker's address: which allocation held it before and where it was freed."""
    snap = torch.cuda.memory._snapshot()
    for name, t in markers.items():
        addr = t.data_ptr()
        print(f"--- marker {name} at {addr:#x} = {float(t.item())}")
        for dev_trace in snap.get("device_traces", []):
            for ev in dev_trace:
                if ev["addr"] <= addr < ev["addr"] + max(ev.get("size", 0), 1) and ev["action"] in (
                        "alloc", "free_requested", "free_completed", "segment_alloc"):
                    frames = [f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}"
                              for f in ev.get("frames", []) if "attnmeta" in f["filename"] or "tools/" in
                              f["filename"] or "tests/" in f["filename"]][:8]
                    print(f"  {ev['action']} {ev['addr']:#x} +{ev.get('size', 0)}: {' <- '.join(frames)}")


def run(kind: str, page: int, steps: int, device: str, do_trace: bool, seed: int = 0) -> dict:
    from attnmeta.runtime import BatchError
    from tests.integrations.sglang_server import Server

    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    s = Server(flags(kind, page), device=device, rows=max(SIZES) + 40, context=4096)
    ours, own = s.backend, s.own(kind)
    rng, res = random.Random(seed), dict(kind=kind, page=page, steps=0, error=None)
    with s.active():
        shared = Shared(max(SIZES), ours.get_cuda_graph_seq_len_fill_value(), dev)
        graphs = {"sglang": capture(own, shared, s, sync), "attnmeta": capture(ours, shared, s, sync)}
        graphs["floor"] = floors(dev)
        markers = {f"{side} {bs}": m for side, gs in graphs.items() for bs, (_, m) in gs.items()}
        fbs = {bs: shared.capture_batch(s, bs) for bs in SIZES}
        pool = s.runner.req_to_token_pool.req_to_token
        order = [("sglang", own), ("attnmeta", ours), ("floor", None)]
        try:
            for rnd in range(2):
                sizes = SIZES if rnd == 0 else SIZES[::-1]
                sides = order if rnd == 0 else order[::-1]
                for bs in sizes:
                    for side, be in sides:
                        g = graphs[side][bs][0]
                        for _ in range(steps):
                            n = rng.randint(max(1, bs // 2), bs)
                            rows = rng.sample(range(1, s.rows), n)
                            seq = [rng.randint(1, 2048) for _ in range(n)]
                            if be is None:
                                g.replay()
                                continue
                            view = shared.load(fbs[bs], rows, seq, bs)
                            be.init_forward_metadata_out_graph(view)
                            g.replay()
                            if side == "attnmeta" and kind == "triton":
                                sync()
                                m = be.forward_metadata
                                k = int(m.kv_indptr[n])
                                want = torch.cat([pool[r, :q] for r, q in zip(rows, seq, strict=True)])
                                assert k == sum(seq) and torch.equal(m.kv_indices[:k].long(), want.long()), \
                                    f"round {rnd} bs {bs}: kv indices of the live rows differ"
                            res["steps"] += 1
                    sync()
        except BatchError as e:
            res["error"] = str(e)
            print(f"{kind} page {page}: BatchError after {res['steps']} steps: {e}", flush=True)
            if dev.type == "cuda":
                sync()
                for what, addr, size in held(ours):
                    for name, m in markers.items():
                        if addr <= m.data_ptr() < addr + size:
                            print(f"  marker {name} lies inside {what} [{addr:#x}, +{size}]")
                if do_trace:
                    trace(markers)
    print(f"{kind} page {page}: {res['steps']} steps, error: {res['error']}", flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="triton,flashinfer")
    ap.add_argument("--pages", default="1,16")
    ap.add_argument("--steps", type=int, default=330)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--trace", action="store_true", help="record the allocator's history (CUDA)")
    a = ap.parse_args(argv)
    if a.trace and a.device == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=400000)
    bad = 0
    for kind in a.kinds.split(","):
        for page in (int(p) for p in a.pages.split(",")):
            bad += run(kind, page, a.steps, a.device, a.trace)["error"] is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
