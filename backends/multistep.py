"""MultiStep: a wrapper for S speculative draft-decode steps (topk 1).

Step s (0-based) decodes the (s+1)-th draft token: its keys are the prefix
plus the s + 1 tokens drafted so far, which with one branch follow the
prefix in ``req_to_token``. So step s is the inner backend's decode metadata
over ``seq_lens + s + 1``, and all S steps are built in one graph before the
drafter's steps run. The planners' host indptrs come from the host mirror
plus the step offset: no device->host copy in a round (engines copy the
device indptrs back once per round). Fields are prefixed ``step<s>_``.

The runtime keeps IDLE as IDLE: an IDLE batch stages only fill rows, so no
step ever reads a previous batch's requests. Topk > 1 (a tree of branches
per request, each with its own draft slots) is not expressed yet and is
refused at compile time.
"""

from __future__ import annotations

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode, OptionsError
from attnmeta.compiler.ir import Graph, Role, SpecBuilder


def multistep(inner: BackendSpec) -> BackendSpec:
    def build(mode: ForwardMode, options: CompileOptions) -> Graph:
        if options.topk != 1:
            raise OptionsError(f"multistep_{inner.name} supports topk 1, got topk={options.topk}; "
                               "the branch layout for topk > 1 is not implemented")
        g = inner.build(ForwardMode.DECODE, options)
        b = SpecBuilder(f"multistep.{g.name}")
        ins = {i.name: b.input(i.name, i.type.dtype, list(i.type.shape), i.type.placement, i.fill, i.role, i.mirror)
               for i in g.inputs}
        fields, ragged = {}, {}
        for s in range(options.num_steps):
            step = dict(ins)
            for i in g.inputs:
                if i.role is Role.batch and i.name in ("seq_lens", "seq_lens_cpu"):
                    with b.out_graph() if i.type.placement.on_host else b.in_graph():
                        step[i.name] = b.ewise("add", ins[i.name], s + 1, name=f"step{s}_{i.name}")
            out = b.inline(g, step, prefix=f"step{s}_")
            fields.update({f"step{s}_{f}": v for f, v in out.items()})
            ragged.update({f"step{s}_{o.field}": f"step{s}_{o.ragged_by}" for o in g.outputs if o.ragged_by})
        b.outputs(ragged=ragged, **fields)
        return b.build()

    return BackendSpec(f"multistep_{inner.name}", build, (ForwardMode.DECODE,),
                       doc=f"S draft-decode steps (topk 1) of {inner.name}")
