"""The planner seam: a spec's host_call binds the fields its planner plans into; inlining and CSE
rename them; lowering types each planner as a PlannerSite; the runtime hands the planner a Site
(those fields' buffers, hooks, state of its own) and nothing else."""

import pytest
import torch

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import DType, Placement, SpecBuilder
from attnmeta.compiler.ir.builder import SpecError
from attnmeta.compiler.ir.errors import UnknownName
from attnmeta.compiler.ir.verify import VerifyError
from attnmeta.compiler.passes.cse import cse
from attnmeta.compiler.passes.registry import PassContext
from attnmeta.runtime import StaleBufferError
from attnmeta.runtime.planning import PlanError
from tests.batches import capture, make_batch, make_pool

I32 = DType.int32
L, ROWS = 32, 9
OPTS = CompileOptions(max_bs=4, capture_sizes=(2, 4), max_context_len=L)


def mine(mode, options, twice: bool = False):
    """A backend of one planner: it plans into an indptr and a constant it binds by role."""
    b = SpecBuilder("mine")
    seq = b.input("seq_lens", I32, ["bs"], fill=1, mirror="seq_lens_cpu")
    cpu = b.input("seq_lens_cpu", I32, ["bs"], Placement.host, fill=1)
    with b.in_graph():
        indptr = b.cumsum(seq, name="indptr")
        ones = b.full(1, ["bs"], I32, name="ones")
        again = b.full(1, ["bs"], I32, name="again") if twice else ones  # CSE folds it into ones
    with b.out_graph():
        host = b.cumsum(cpu, name="indptr_host")
        plan = b.host_call("mine.plan", host, name="plan", binds=dict(indptr=indptr, pages=again))
    b.outputs(indptr=indptr, ones=ones, again=again, plan=plan, indptr_host=host)
    return b.build()


class Planner:
    """A planner that reads only its site: the host indptr it is called on, the device indptr its
    site binds, and state of its own; it adds device work after the metadata graph."""

    def __init__(self):
        self.seen = []

    def __call__(self, site, indptr_host):
        st = site.state.setdefault("plan", {"calls": 0})
        st["calls"] += 1
        st["host"] = indptr_host.tolist()
        site.after_graph(st.setdefault("hook", lambda: self.seen.append(site.field("indptr").tolist())))
        return st


def test_a_planner_plans_into_the_fields_its_spec_binds():
    spec = BackendSpec("mine", mine, (ForwardMode.DECODE,), planners={"mine.plan": Planner})
    be = compile_backend(spec, OPTS).instantiate(make_pool(ROWS, L))
    site = be.bound(ForwardMode.DECODE, 4).sites["plan"]
    assert (site.node, site.target, site.bs, sorted(site.fields)) == ("plan", "mine.plan", 4, ["indptr", "pages"])
    planner = be.planners["mine.plan"]
    for seed in range(3):
        fb = make_batch(4, L, ROWS, seed=seed)
        be.init_forward_metadata(fb)
        want = [0, *torch.cumsum(fb.seq_lens_cpu, 0).tolist()]
        m = be.forward_metadata
        assert m.plan is site.state["plan"] and m.plan["calls"] == seed + 1 and m.plan["host"] == want
        assert site.fields["indptr"].data_ptr() == m.indptr.data_ptr()  # the field's own buffer, not a copy
        assert planner.seen[-1] == want  # the hook ran after the metadata graph wrote the field
    assert len(planner.seen) == 3  # one hook, added once, run every step


def test_cse_keeps_a_bound_value_its_own_buffer():
    """Two values the graph computes alike stay two when a planner binds one: a planner may write
    what it binds (FlashMLA's schedule), so merging them would let it write the other field too."""
    g = mine(ForwardMode.DECODE, OPTS, twice=True)
    merged = cse(g, PassContext(OPTS, ForwardMode.DECODE))
    assert {n.name for n in merged.nodes} >= {"ones", "again"}
    assert dict(merged.node("plan").a["binds"].pairs)["pages"] == "again"
    spec = BackendSpec("mine2", lambda m, o: mine(m, o, twice=True), (ForwardMode.DECODE,),
                       planners={"mine.plan": Planner})
    be = compile_backend(spec, OPTS).instantiate(make_pool(ROWS, L))
    be.init_forward_metadata(make_batch(2, L, ROWS, seed=1))
    site = be.bound(ForwardMode.DECODE, 2).sites["plan"]
    assert site.fields["pages"].data_ptr() != be.forward_metadata.ones.data_ptr()
    assert site.fields["pages"].data_ptr() == be.forward_metadata.again.data_ptr()


def test_tbo_children_bind_their_own_fields():
    """Inlining renames binds: each TBO child's planner binds that child's fields."""
    be = compile_backend("tbo_flashinfer", OPTS).instantiate(make_pool(ROWS, L))
    be.init_forward_metadata(make_batch(4, L, ROWS, seed=2))
    sites = be.bound(ForwardMode.DECODE, 4).sites
    assert sorted(sites) == ["plan", "tbo0_plan", "tbo1_plan"]
    m = vars(be.forward_metadata)
    for node, site in sites.items():
        prefix = node.removesuffix("plan")
        for role in ("kv_indptr", "kv_indices", "kv_last_page_len"):
            assert site.fields[role].data_ptr() == m[prefix + role].data_ptr(), (node, role)


def test_bad_binds_are_refused_where_they_are_written():
    b = SpecBuilder("bad")
    seq = b.input("seq_lens_cpu", I32, ["bs"], Placement.host, fill=1)
    other = SpecBuilder("other").input("x", I32, ["bs"])
    with b.out_graph(), pytest.raises(SpecError, match=r"host_call 'p' binds 'x' to .*not a value of spec 'bad'"):
        b.host_call("p", seq, binds={"x": other})
    with b.out_graph():
        h = b.cumsum(seq, name="h")
        p = b.host_call("p", h, binds={"indptr": h})
    b.outputs(p=p)  # h is no field
    with pytest.raises(VerifyError, match=r"planner %p binds indptr to %h, which is no metadata field"):
        b.build()


def test_a_missing_planner_or_role_is_named():
    spec = BackendSpec("mine3", mine, (ForwardMode.DECODE,))  # declares no stand-in
    be = compile_backend(spec, OPTS).instantiate(make_pool(ROWS, L))
    with pytest.raises(UnknownName, match=r"no planner for 'mine.plan' \(planner node 'plan'\).*set_planner"):
        be.init_forward_metadata(make_batch(2, L, ROWS, seed=0))
    be.set_planner("mine.plan", lambda site, h: site.field("kv_indices"))
    with pytest.raises(PlanError, match=r"binds no 'kv_indices' field \(it binds \['indptr', 'pages'\]\)"):
        be.init_forward_metadata(make_batch(2, L, ROWS, seed=0))


def test_set_planner_moves_bound_plans_before_capture_only():
    spec = BackendSpec("mine4", mine, (ForwardMode.DECODE,), planners={"mine.plan": Planner})
    be = compile_backend(spec, OPTS).instantiate(make_pool(ROWS, L))
    be.init_forward_metadata(make_batch(2, L, ROWS, seed=0))
    site = be.bound(ForwardMode.DECODE, 2).sites["plan"]
    assert site.state and len(be.bound(ForwardMode.DECODE, 2).after_in) == 1
    be.set_planner("mine.plan", lambda s, h: ("mine", s.node))
    assert not site.state  # the new planner starts with state of its own
    assert not be.bound(ForwardMode.DECODE, 2).after_in  # and the old one's device work is gone
    be.init_forward_metadata(make_batch(2, L, ROWS, seed=1))
    assert be.forward_metadata.plan == ("mine", "plan")
    capture(be, make_batch(4, L, ROWS, seed=0))
    with pytest.raises(StaleBufferError, match=r"planner 'mine.plan' cannot change: graphs .* captured"):
        be.set_planner("mine.plan", Planner())
