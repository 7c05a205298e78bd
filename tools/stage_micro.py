"""Where a compiled step's host microseconds go, part by part (run on the GPU machine):
python tools/stage_micro.py [backend] [bs]."""
import ctypes
import sys

import torch
from timing import median_us

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch, ReplayView, new_graph


def t(fn):
    return median_us(fn, 3000, 300)


name, bs = (sys.argv[1] if len(sys.argv) > 1 else "flashattention"), int(sys.argv[2] if len(sys.argv) > 2 else 8)
L, dev = 4096, torch.device("cuda")
pool = torch.randperm(300 * L).to(torch.int32).view(300, L).to(dev)
pool[0] = 0
be = compile_backend(name, CompileOptions(max_bs=256, capture_sizes=(bs,), max_context_len=L)).instantiate(pool)
seq = torch.randint(4, L // 2, (bs,), dtype=torch.int32)
rpi = torch.randperm(299)[:bs].long() + 1
fb = ForwardBatch(ForwardMode.DECODE, bs, req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi, seq_lens=seq.to(dev),
                  seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))
be.init_forward_metadata_out_graph(fb, in_capture=True)
be.init_forward_metadata_in_graph(fb)
torch.cuda.synchronize()
g = new_graph(dev)
with g.capture():
    be.init_forward_metadata_in_graph(fb)
view = ReplayView.of(fb, bs)
b = be.bound(ForwardMode.DECODE, bs)
st = b.stager
dv, hv = st.copies[0]
ev, stream = torch.cuda.Event(), torch.cuda.current_stream()
ev.record(stream)
s0 = st.slots[0]
rows = [
    ("compiled step: out_graph(view) + replay", lambda: (be.init_forward_metadata_out_graph(view), g.replay())),
    ("out_graph(view)", lambda: be.init_forward_metadata_out_graph(view)),
    ("ReplayView.of", lambda: ReplayView.of(fb, bs)),
    ("stager.fast", lambda: st.fast(view, bs, bs)),
    ("stager.stage (general)", lambda: st.stage(view, bs, bs)),
    ("replay", g.replay),
    ("floor: copy_ + replay", lambda: (dv.copy_(hv, non_blocking=True), g.replay())),
    ("H2D copy_ alone", lambda: dv.copy_(hv, non_blocking=True)),
    ("event.record(stream)", lambda: ev.record(stream)),
    ("event.synchronize", ev.synchronize),
    ("memmove 32 B", lambda: ctypes.memmove(s0.ptr, seq.data_ptr(), 32)),
    ("run_out_graph", b.run_out_graph),
]
for label, fn in rows:
    print(f"{label:45s} {t(fn):8.2f} us")
