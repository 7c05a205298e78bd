"""The backend of examples/mine.py with the CUDA-graph bugs engines keep shipping, to show what
check-split says. Try

    attnmeta compile examples/mine_broken.py:SPEC

and read the report: every violation at once, each with its rule, the spec line and a fix.
"""

from attnmeta.compiler import BackendSpec, ForwardMode
from attnmeta.compiler.ir import DType, Kind, Placement, SpecBuilder


def build(mode, options):
    b = SpecBuilder(f"mine_broken.{mode.name.lower()}")
    seq_lens = b.input("seq_lens", DType.int32, ["bs"], fill=1, mirror="seq_lens_cpu", kind=Kind.length)
    seq_lens_cpu = b.input("seq_lens_cpu", DType.int32, ["bs"], Placement.host, fill=1, kind=Kind.length)
    # BUG 1: padded rows filled with pool row 3, a live request's row: a padded batch would read its
    # KV slots, and an attention that writes through the metadata would write them
    rows = b.input("req_pool_indices", DType.int64, ["bs"], fill=3, mirror="req_pool_indices_cpu", kind=Kind.row)
    req_to_token = b.pool("req_to_token", DType.int32, ["R", "L"])
    with b.out_graph():
        # BUG 2: the indptr computed on the host from the host lengths...
        indptr_host = b.cumsum(seq_lens_cpu)
    with b.in_graph():
        # ...and read inside the graph: every replay would see the capture batch's values
        cu_seqlens_k = b.ewise("add", indptr_host, 0)
        page_table = b.page_table(req_to_token, rows, seq_lens, page_size=options.page_size, width="W")
    b.outputs(page_table=page_table, cu_seqlens_k=cu_seqlens_k)
    return b.build()


SPEC = BackendSpec("mine_broken", build, (ForwardMode.DECODE,))
