"""The planner seam: what a host planner gets, typed like the buffers it plans into.

Lowering records each ``host_call`` of a plan as a ``PlannerSite`` (its operands, the fields its
spec ``binds``, the field its result becomes). Binding a plan makes one ``Site`` per planner
node: views of those fields by role, the plan's hook list (device work recorded with the
metadata graph, run every step after it), and a state dict the planner owns. The planner is then
called ``planner(site, *host_inputs)`` in out_graph, before capture and every replay. Nothing
else is shared: a planner never reads the backend, and the backend never looks inside a planner.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType

import attrs
import torch

from attnmeta.compiler.ir.errors import UnknownName, UserError
from attnmeta.compiler.modes import ForwardMode


class PlanError(UserError):
    """A planner given what it cannot plan (device indptrs, mismatched lengths, a missing field)."""

    rule = "plan"


@attrs.define(eq=False)
class Site:
    """One planner node of one bound plan (mode, bs), as its planner sees it."""

    node: str  # the host_call node: ``plan``, or ``tbo0_plan``/``step2_plan`` once inlined
    target: str  # the planner's name in the spec
    mode: ForwardMode
    bs: int
    max_bs: int
    options: object  # the backend's CompileOptions (context length, SM count, ...)
    device: torch.device
    fields: Mapping[str, torch.Tensor]  # role (from the spec's binds) -> the field's static buffer
    hooks: list[Callable[[], None]]  # run after the metadata graph, recorded with it
    # the planner's own, which it may replace by a typed object of its own (FlashInfer's adapters keep a
    # ``WrapperState``): an empty dict until then, and again after ``reset``
    state: object = attrs.Factory(dict)
    # set by a planner that no longer reads its host inputs (its work is in the graph now): a replay on an
    # engine's buffers then skips out_graph altogether
    host_free: bool = False
    _added: list = attrs.Factory(list)  # the hooks this site added (a new planner takes them out)

    @classmethod
    def detached(cls, target: str, mode: ForwardMode, bs: int, device="cpu") -> Site:
        """A site of no compiled plan: for calling a planner by hand (an eager path, a benchmark's
        baseline), with no fields and hooks nobody runs."""
        return cls("detached", target, mode, bs, bs, None, torch.device(device), MappingProxyType({}), [])

    def field(self, role: str) -> torch.Tensor:
        try:
            return self.fields[role]
        except KeyError:
            raise PlanError(f"planner node {self.node!r} ({self.target}) binds no {role!r} field (it binds "
                            f"{sorted(self.fields) or 'none'}); add it to the spec's host_call(..., binds={{...}})"
                            ) from None

    def after_graph(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` after the metadata graph every step, recorded with it (once per site)."""
        if fn not in self.hooks:
            self.hooks.append(fn)
            self._added.append(fn)

    def reset(self) -> None:
        """Forget what the planner made: its state and the hooks it added (a new planner serves it)."""
        for fn in self._added:
            self.hooks.remove(fn)
        self._added.clear()
        self.state = {}
        self.host_free = False


def make_site(s, mode: ForwardMode, bs: int, backend, views: Callable, hooks: list) -> Site:
    """The ``Site`` of lowered ``PlannerSite`` ``s``: ``views(arg)`` gives each bound field's buffer."""
    return Site(s.node, s.target, mode, bs, backend.max_bs, backend.compiled.options, backend.device,
                MappingProxyType({r: views(a) for r, a in s.binds}), hooks)


def planner_call(planners: Mapping[str, Callable], site: Site, nargs: int) -> Callable:
    """``planners[site.target]`` bound to ``site``; refused at bind if missing or if it cannot be
    called ``planner(site, *inputs)`` with the node's ``nargs`` host inputs."""
    planner = planners.get(site.target)
    if planner is None:
        raise UnknownName(f"no planner for {site.target!r} (planner node {site.node!r}); planners: "
                          f"{sorted(planners) or 'none'}; the spec declares stand-ins in BackendSpec.planners, or pass "
                          "one: instantiate(planners={...}) or backend.set_planner(...)")
    try:
        inspect.signature(planner).bind(site, *([None] * nargs))
    except TypeError as e:
        raise PlanError(f"planner {site.target!r} cannot be called planner(site, *inputs) with the {nargs} host "
                        f"inputs of node {site.node!r}: {e}. Planners take the site first "
                        "(attnmeta.runtime.planning.Site)") from None
    except ValueError:  # a builtin without a signature: trust it
        pass
    return functools.partial(planner, site)
