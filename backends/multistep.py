"""MultiStep: a wrapper for S speculative draft-decode steps and K branches (topk).

Step s (0-based) decodes the (s+1)-th draft token of every branch. With one
branch its keys are the prefix plus the s + 1 drafted tokens, which follow
the prefix in ``req_to_token``: step s is the inner backend's decode metadata
over ``seq_lens + s + 1``. With K branches each request has K rows,
``z = b*K + k``, over the same prefix; branch k's drafted tokens live in its
own slots after the prefix, from column
``floor(seq/P)*P + k*ceil((seq%P + S)/P)*P + seq%P`` (``seq + k*S`` for P 1),
so the inner decode graph is inlined on bs*K rows with its kv gather jumping
over the other branches' slots. All S steps are built in one graph before
the drafter's steps run. The planners' host indptrs come from the host
mirror plus the step offset: no device->host copy in a round (engines copy
the device indptrs back once per round). Fields are prefixed ``step<s>_``.

``per_round`` names inner fields an engine computes once per round, from the
prefix lengths, and hands every step (SGLang's Triton drafter plans the split
counts once, over ``seq_lens``, not over each step's ``seq_lens + s + 1``):
they are computed once, on the branch rows with the unshifted lengths, and
every step's field is that one.

The runtime keeps IDLE as IDLE: an IDLE batch stages only fill rows, so no
step ever reads a previous batch's requests.
"""

from __future__ import annotations

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode, OptionsError
from attnmeta.compiler.ir import Graph, Op, Role, SpecBuilder
from attnmeta.runtime.metadata import step_prefix

from .common import sub_rows

SEQ = ("seq_lens", "seq_lens_cpu")


def branch_stride(options: CompileOptions, page_offset: int) -> int:
    """Columns between two branches' drafted tokens for a prefix ending page_offset into its page."""
    P, S = options.page_size, options.num_steps
    return -(-(page_offset + S) // P) * P


def headroom(mode: ForwardMode, options: CompileOptions) -> int:
    """Columns past seq_lens the last branch's last draft may use (the page offset at its worst)."""
    return (options.topk - 1) * branch_stride(options, options.page_size - 1) + options.num_steps


def _branches(b: SpecBuilder, g: Graph, ins: dict, options: CompileOptions):
    """Every batch input once per branch (rows z = b*K + k), and the gather jump (split = the
    prefix length, shift = k * the branch stride of ``branch_stride``, here per row on device).
    On device a row reads its request's fields by lookup (a constant z // K), which keeps every
    branch in the one kernel over the branch rows; host mirrors are repeated."""
    K, P, S = options.topk, options.page_size, options.num_steps
    reads = {n.op for n in g.nodes if "req_to_token" in n.inputs}
    if reads - {Op.ragged_gather}:
        raise OptionsError(f"multistep with topk={K} needs an inner decode whose kv indices are ragged gathers; "
                           f"{g.name} reads req_to_token with {sorted(o.value for o in reads)}")
    rows = {}
    with b.in_graph():
        owner, k = sub_rows(b, K, "K")  # K, not its value: the inlined decode's shapes say K*bs
    for i in g.inputs:
        if i.name == "out_cache_loc":  # write slots: already one per branch and step (the caller picks a step's)
            continue
        if i.role is Role.batch and i.type.placement.on_host:
            with b.out_graph():
                rows[i.name] = b.repeat(ins[i.name], "K", name=f"branch_{i.name}")
        elif i.role is Role.batch:
            with b.in_graph():
                rows[i.name] = b.lookup(ins[i.name], owner, name=f"branch_{i.name}")
    with b.in_graph():
        seq = rows["seq_lens"]
        stride = b.ewise("mul", b.ewise("ceildiv", b.ewise("add", b.ewise("mod", seq, P), S), P), P)
        shift = b.ewise("mul", k, stride, name="branch_shift")
    return {**ins, **rows}, (seq, shift)


def _draft_window(b: SpecBuilder, inner: BackendSpec, options: CompileOptions, rows: dict):
    """A draft window (the inner backend's options ``draft_window`` W and ``draft_sink`` S, as SGLang's drafter
    reads them): of each row's ``seq`` prefix tokens the first min(S, seq) and the last min(seq, W + S) - min(S,
    seq), then its drafts. Returns (the gather's jump past the sink: (min(S, seq), seq - min(seq, W + S)), W + S:
    the cap of a step's prefix keys), or None without one."""
    own = options.of(inner.options_type) if inner.options_type else None
    W, S = getattr(own, "draft_window", 0), getattr(own, "draft_sink", 0)
    if not W:
        return None
    with b.in_graph():
        seq = rows["seq_lens"]
        sink = b.ewise("min", seq, S, name="draft_sink")
        skip = b.ewise("sub", seq, b.ewise("min", seq, W + S), name="draft_skip")
    return (sink, skip), W + S


def multistep(inner: BackendSpec, per_round: tuple[str, ...] = (), windows: bool = False) -> BackendSpec:
    """``inner``'s S draft steps x K branches; ``windows``: its sliding-window fields planned per step too (the
    inner decode's window over each step's keys, a branch's running from the prefix into its own drafts; its write
    slots that step's)."""
    def build(mode: ForwardMode, options: CompileOptions) -> Graph:
        g = inner.build(ForwardMode.DECODE, options)
        b = SpecBuilder(f"multistep.{g.name}")
        p_hi = f"L - {headroom(mode, options)}"  # every step's drafts, every branch, fit after the prefix
        K, S = options.topk, options.num_steps
        # one write slot per branch and step (EAGLE's [bs, K, S] layout): step s writes column s of each branch's
        # S, which a window pool's layers need translated (the inner decode's out_cache_loc: one per row)
        slot = next((i for i in g.inputs if i.name == "out_cache_loc"), None)
        ins = {i.name: b.input(i.name, i.type.dtype, list(i.type.shape), i.type.placement, i.fill, i.role, i.mirror,
                              i.kind, p_hi if i.name in SEQ else i.hi)
               for i in g.inputs if i is not slot}
        branch_rows = "K*bs" if K > 1 else "bs"
        if slot is not None:
            ins["out_cache_loc"] = b.input("out_cache_loc", slot.type.dtype, [f"{S}*{branch_rows}"],
                                           slot.type.placement, slot.fill, slot.role, slot.mirror, slot.kind, slot.hi)
        rows, jump, subs = ins, None, None
        if K > 1:
            rows, jump = _branches(b, g, ins, options)
            subs = {"bs": "bs*K", "max_bs": "max_bs*K"}  # buffers sized with the K factor
        sink_window = _draft_window(b, inner, options, rows)

        def branch_gather(n, xs):
            """Under a draft window the drafter's gather first jumps from its sink to its recent tokens. A branch
            row's gather then jumps over the other branches' slots once it passes its prefix: at entry seq less
            the columns an earlier jump skipped (a window's first column, the draft window's skip)."""
            if n.op is not Op.ragged_gather:
                return xs
            if len(xs) == 4 and sink_window:
                xs = [*xs, *sink_window[0]]
            if not jump:
                return xs
            seq, shift = jump
            return [*xs, seq if len(xs) == 4 else b.ewise("sub", seq, xs[5]), shift]

        fields, ragged, round_ = {}, {}, {}
        if per_round:  # once, over the prefix: dce drops the rest of this copy of the inner graph
            out = b.inline(g, dict(rows), prefix="round_", subs=subs, rewrite=branch_gather)
            round_ = {f: out[f] for f in per_round if f in out}
        for s in range(options.num_steps):
            step = dict(rows)
            for name in SEQ:
                if name in step:
                    with b.out_graph() if name.endswith("_cpu") else b.in_graph():
                        keys = rows[name] if not sink_window else b.ewise("min", rows[name], sink_window[1])
                        step[name] = b.ewise("add", keys, s + 1, name=step_prefix(s) + name)
            if slot is not None:
                with b.in_graph():
                    step["out_cache_loc"] = b.lookup(ins["out_cache_loc"], b.arange(branch_rows, start=s, step=S))
            out = b.inline(g, step, prefix=step_prefix(s), subs=subs, rewrite=branch_gather) | round_
            fields.update({step_prefix(s) + f: v for f, v in out.items()})
            ragged.update({step_prefix(s) + o.field: step_prefix(s) + o.ragged_by for o in g.outputs if o.ragged_by})
        b.outputs(ragged=ragged, **fields)
        return b.build()

    return BackendSpec(f"multistep_{inner.name}", build, (ForwardMode.DECODE,),
                       doc=f"S draft-decode steps x topk branches of {inner.name}", headroom=headroom,
                       planners=inner.planners, options_type=inner.options_type, windows=windows and inner.windows)
