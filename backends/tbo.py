"""Two-batch overlap: a wrapper around any backend spec.

The parent's metadata plus two children over static sub-ranges of the
parent's batch: rows [0, floor(bs/2)) and [floor(bs/2), bs) in decode (one
token per request, so the token split equals the row split; IDLE replays
DECODE's graph). The split is an expression of ``bs`` that specialize-batch
folds to an int per captured size, so the children are fixed slices (views)
of the parent's static buffers and nothing is recomputed at replay. A
zero-size child (bs = 1) is a set of empty ops. Child fields are prefixed
``tbo0_`` and ``tbo1_``; each side's ``num_token_non_padded`` is derived on
device from the replayed batch.
"""

from __future__ import annotations

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode
from attnmeta.compiler.ir import DType, Graph, Role, SpecBuilder
from attnmeta.runtime.metadata import child_prefix

SPLIT = "floor(bs/2)"


def non_padded(b: SpecBuilder, rpi) -> dict:
    """Real tokens, for the parent and each child, derived on device: live requests never use the
    reserved pool row 0 that padded rows read, so n = #(rpi != 0) (one token per request in
    decode). Child 0 gets min(n, split), child 1 max(n - split, 0), split fixed per size."""
    with b.in_graph():
        n = b.reduce("sum", b.cast(b.compare("ne", rpi, 0), DType.int32), name="num_token_non_padded")
        split = b.reduce("sum", b.full(1, [SPLIT], DType.int32))
        return {"num_token_non_padded": n, child_prefix(0) + "num_token_non_padded": b.ewise("min", n, split),
                child_prefix(1) + "num_token_non_padded": b.ewise("max", b.ewise("sub", n, split), 0)}


def tbo(inner: BackendSpec) -> BackendSpec:
    def build(mode: ForwardMode, options: CompileOptions) -> Graph:
        g = inner.build(mode, options)
        b = SpecBuilder(f"tbo.{g.name}")
        ins = {i.name: b.input(i.name, i.type.dtype, list(i.type.shape), i.type.placement, i.fill, i.role, i.mirror,
                              i.kind, i.hi) for i in g.inputs}
        fields = b.inline(g, ins)
        ragged = {o.field: o.ragged_by for o in g.outputs if o.ragged_by}
        fields.update(non_padded(b, ins["req_pool_indices"]))
        for c, (lo, hi) in enumerate([("0", SPLIT), (SPLIT, "bs")]):
            child = {}
            for i in g.inputs:
                if i.role is Role.pool:
                    child[i.name] = ins[i.name]
                    continue
                ctx = b.out_graph() if i.type.placement.on_host else b.in_graph()
                with ctx:
                    child[i.name] = b.slice(ins[i.name], lo, hi, name=child_prefix(c) + i.name)
            out = b.inline(g, child, bs=f"{hi} - ({lo})", prefix=child_prefix(c))
            fields.update({child_prefix(c) + f: v for f, v in out.items()})
            ragged.update({child_prefix(c) + f: child_prefix(c) + r for f, r in ragged.items()
                           if not f.startswith((child_prefix(0), child_prefix(1)))})
        b.outputs(ragged=ragged, **fields)
        return b.build()

    return BackendSpec(f"tbo_{inner.name}", build, inner.modes, doc=f"two-batch overlap around {inner.name}",
                       headroom=inner.headroom, planners=inner.planners,
                       options_type=inner.options_type, check=inner.check)
