"""SGLang's own attention backend, with the modes it captures served by a compiled attnmeta backend.

``CompiledModes`` is a mixin placed before one of SGLang's backend classes: the object *is* SGLang's
backend (built by SGLang's ``__init__`` from the model runner, so heads per attention-TP rank, the
context, the page size, the split cap and the draft settings are SGLang's resolved values), and
attention, KV stores, prefill and every path attnmeta does not compile stay SGLang's code. What
changes is the metadata of the batches attnmeta serves:

- the modes SGLang captures (decode, idle, target verify, draft extend V2) that the backend was
  compiled for, at any size up to the compiled ``max_bs``: out_graph stages the batch (checked), in
  out_graph the planners run, in_graph is the one recorded kernel;
- everything else (prefill and extend, mixed, a mode not compiled, an eager batch larger than any
  captured size) goes to SGLang's own methods, unchanged.

``forward_metadata`` is SGLang's own metadata class of that kind, built over the compiled buffers
once per (mode, size) by the subclass's ``_shape`` and reused, so SGLang's kernels and model code
read it unchanged.
"""

from __future__ import annotations

import logging

import attrs

from attnmeta.compiler import CompileOptions, compile_backend
from attnmeta.compiler.ir.errors import ContractError, OptionsError
from attnmeta.runtime.engine import Fed, Sources

from .batch import ENGINE_PATHS, MODES, BatchView

log = logging.getLogger("attnmeta.runtime.integrations")

CAPTURED = frozenset(MODES[m] for m in ("DECODE", "IDLE", "TARGET_VERIFY", "DRAFT_EXTEND_V2"))
# the generic options that shape metadata: a compiled backend must agree with SGLang's resolved ones; the backend's own
# options (CompileOptions.backend) are compared beside them as one typed value
AGREE = ("page_size", "max_context_len", "num_heads", "num_kv_heads", "num_draft_tokens", "topk", "num_steps",
         "sm_count", "sliding_window", "window_pool")


def _own(o: CompileOptions, like: CompileOptions):
    """``o``'s backend options, their class's defaults where ``o`` left them None and ``like`` did not."""
    if o.backend is not None or like.backend is None:
        return o.backend
    return type(like.backend)()


def check_agrees(have: CompileOptions, want: CompileOptions, what: str = "the compiled backend",
                 agree: tuple[str, ...] = AGREE, how: str = "attnmeta.integrations.sglang.compile_options") -> None:
    """``have`` (compiled) against ``want`` (what SGLang resolved): every disagreement of the generic options in
    ``agree`` and of the backend's own options (one value: each field that differs is named) with both values,
    or nothing. A missing mode and a smaller ``max_bs`` are disagreements too; ``how`` names what derives the
    right options."""
    bad = [f"{n}: compiled {getattr(have, n)}, SGLang {getattr(want, n)}" for n in agree
           if getattr(have, n) != getattr(want, n)]
    mine, theirs = _own(have, want), _own(want, have)
    if mine != theirs:
        if type(mine) is type(theirs) and attrs.has(type(mine)):
            bad += [f"{f.name}: compiled {getattr(mine, f.name)}, SGLang {getattr(theirs, f.name)}"
                    for f in attrs.fields(type(mine)) if getattr(mine, f.name) != getattr(theirs, f.name)]
        else:
            bad.append(f"the backend's options: compiled {mine!r}, SGLang {theirs!r}")
    missing = sorted(m.name.lower() for m in set(want.modes) - set(have.modes))
    if missing:
        bad.append(f"modes {missing} are not compiled")
    if have.max_bs < want.max_bs:
        bad.append(f"max_bs: compiled {have.max_bs}, SGLang captures up to {want.max_bs}")
    if bad:
        raise OptionsError(f"{what} does not match this SGLang server (" + "; ".join(bad) + "); compile it with "
                           f"the server's options ({how}, or let the registry compile at start: unset "
                           "ATTNMETA_ARTIFACT)")


class CompiledModes:
    """Mixin: SGLang's backend of this kind, its captured modes' metadata from ``self.attnmeta``."""

    spec_name: str = ""
    agree: tuple[str, ...] = AGREE  # the options a compiled artifact must share with SGLang's resolved ones
    options_from: str = "attnmeta.integrations.sglang.compile_options"  # what derives them, for the error

    # --- set-up (called by the subclass's __init__, after SGLang's) ---
    def _attach(self, compiled, wanted: CompileOptions, req_to_token, device, **pools) -> None:
        why = self.unserved()
        if why:
            raise OptionsError(f"attnmeta's {self.spec_name} metadata does not plan " + ", ".join(why) +
                               f"; serve this configuration with SGLang's own backend (--attention-backend "
                               f"{self.sglang_name})")
        if compiled is None:
            compiled = compile_backend(self.spec_name, wanted)
        elif compiled.spec.name != self.spec_name:
            raise OptionsError(f"{type(self).__name__} serves attnmeta's {self.spec_name!r} spec; got a backend "
                               f"compiled from {compiled.spec.name!r}")
        else:
            check_agrees(compiled.options, wanted, "the compiled artifact", self.agree, self.options_from)
        self.attnmeta = compiled.instantiate(req_to_token, device=device, pools=pools or None)
        self._view = BatchView(wanted.num_draft_tokens)  # draft extend: how many query rows a request has
        self._ours = None  # the batch whose metadata attnmeta staged last (in_graph must follow it)
        self._shaped: dict[tuple, tuple] = {}  # (mode, bs) -> (bound fields, SGLang's metadata object)
        # (SGLang's mode, bs) -> the bound plan whose step replays a captured graph on SGLang's own buffers
        self._replays: dict[tuple, object] = {}
        self._too_big_logged = False
        # SGLang's scheduler, under spec v2's overlap, copies each round's lengths to the host and waits for the
        # round before to publish them, unless every backend of the round declares it reads none
        # (SGLang's decide_needs_cpu_seq_lens): a kind whose steps read none says so; only ever turned off
        self._said_no_host_lengths = getattr(self, "needs_cpu_seq_lens", True) and not self._reads_host_lengths()
        if self._said_no_host_lengths:
            self.needs_cpu_seq_lens = False

    sglang_name = ""  # SGLang's own --attention-backend name of this kind

    def _reads_host_lengths(self) -> bool:
        """Whether a batch attnmeta serves needs ``seq_lens_cpu`` (else SGLang's scheduler may hand it none, and a
        batch that goes to SGLang's own code gets them from ``_host_lengths``). Kept as SGLang's class says
        unless the kind knows better."""
        return True

    def _host_lengths(self, fb, in_capture: bool = False):
        """A batch going to SGLang's own code, which reads the host lengths this backend told the scheduler it
        needs none of: copied back here (a rare step: larger than compiled, or a mode attnmeta does not serve)."""
        if self._said_no_host_lengths and not in_capture and getattr(fb, "seq_lens_cpu", 0) is None \
                and getattr(fb, "seq_lens", None) is not None:
            fb.seq_lens_cpu = fb.seq_lens.cpu()
            fb.seq_lens_sum = int(fb.seq_lens_cpu.sum())
        return fb

    def unserved(self) -> list[str]:
        """What of this SGLang backend's configuration the spec does not plan (each by name)."""
        return []

    # --- routing ---
    def _serves(self, fb) -> bool:
        mode = MODES.get(getattr(fb.forward_mode, "name", None))
        if mode not in CAPTURED or mode.graph_key not in self.attnmeta.compiled.generic:
            return False
        if fb.batch_size > self.attnmeta.max_bs:  # SGLang runs these eagerly; so does its own code here
            if not self._too_big_logged:
                log.info("%s batches larger than the compiled max_bs=%d run SGLang's own metadata code",
                         mode.name.lower(), self.attnmeta.max_bs)
                self._too_big_logged = True
            return False
        return True

    # --- SGLang's graph-runner hooks ---
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
        if max_bs > self.attnmeta.max_bs:
            raise OptionsError(f"SGLang captures batches up to {max_bs} but the {self.spec_name} backend was "
                               f"compiled for max_bs={self.attnmeta.max_bs}; compile with max_bs >= {max_bs}")
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        self._shaped.clear()  # SGLang's scratch buffers the metadata objects hold were just made
        self._replays.clear()

    def glue_target_verify_metadata(self) -> str:
        return "attnmeta plans this metadata"  # SGLang's metadata glue graph stays off

    def glue_draft_metadata(self) -> str:
        return "attnmeta plans this metadata"

    # --- the contract ---
    def init_forward_metadata(self, forward_batch) -> None:
        if not self._serves(forward_batch):
            self._ours = None
            return super().init_forward_metadata(self._host_lengths(forward_batch))
        self.init_forward_metadata_out_graph(forward_batch)
        self.init_forward_metadata_in_graph(forward_batch)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        if not in_capture:  # a replay on the buffers SGLang's runner captured on: nothing to stage or copy
            b = self._replays.get((forward_batch.forward_mode, forward_batch.batch_size))
            if b is not None and b.step is not None and b.step(forward_batch):
                return
        if not self._serves(forward_batch):
            self._ours = None
            return super().init_forward_metadata_out_graph(self._host_lengths(forward_batch, in_capture), in_capture)
        v = self._view.fill(forward_batch)
        self._before_staging(v, in_capture)
        self.attnmeta.init_forward_metadata_out_graph(v, in_capture)
        m, key = self.attnmeta.forward_metadata, (v.forward_mode, v.batch_size)
        hit = self._shaped.get(key)
        if hit is None or hit[0] is not m:  # the first step of this plan, or its buffers were bound again
            hit = self._shaped[key] = (m, self._shape(m, v))
        self._per_step(hit[1], m, v, in_capture)
        self._publish(hit[1])
        self._ours = forward_batch
        if in_capture:
            self._remember_replay(forward_batch, v, hit[1])

    def _remember_replay(self, fb, v: BatchView, shaped) -> None:
        """At capture: if the graph reads SGLang's buffers in place (runtime/engine.py), a later step on the
        same buffers (and the same per-step objects the kind requires) is a replay with nothing to do but
        publish: the plan's step, for SGLang's own batches (where its fields sit on them: ``ENGINE_PATHS``)."""
        key = (fb.forward_mode, fb.batch_size)
        extra = self._replay_requires(v)
        b = self.attnmeta.bound(v.forward_mode, v.batch_size)
        self._replays.pop(key, None)
        if extra is None:
            return
        view, bs, mode = self._view, v.batch_size, v.forward_mode

        def publish(batch, shaped=shaped):
            view.batch_size, view.forward_mode = bs, mode
            self._publish(shaped)
            self._ours = batch

        if self.attnmeta.engine_step(b, fb, Sources(ENGINE_PATHS, self.fed), extra, publish) is not None:
            self._replays[key] = b

    # which views SGLang's runner of this kind fed (its buffers hold their values) while handing its own tensors
    # (runtime/engine.py ``Fed``); None: its runner always hands the buffers it captured on
    fed: Fed | None = None

    def _replay_requires(self, v: BatchView) -> tuple | None:
        """What else a replay with nothing to do requires of SGLang's batch, as (path, tensor) pairs (a buffer the
        engine writes in place); None when this mode always has per-step work."""
        return ()

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        if self._ours is None:
            if self._serves(forward_batch):  # SGLang's own in_graph would leave this batch's metadata unbuilt
                raise ContractError("init_forward_metadata_in_graph before init_forward_metadata_out_graph for this "
                                    "batch; call out_graph first (SGLang's runners do), then in_graph on it")
            return super().init_forward_metadata_in_graph(forward_batch)
        # SGLang may hand in_graph another object than out_graph (a view of the same batch): the pair must
        # agree on what the captured kernel was staged for
        if forward_batch.batch_size != self._view.batch_size or \
                MODES.get(getattr(forward_batch.forward_mode, "name", None)) is not self._view.forward_mode:
            raise ContractError(f"init_forward_metadata_in_graph got a {forward_batch.forward_mode} batch of "
                                f"{forward_batch.batch_size} rows after init_forward_metadata_out_graph staged "
                                f"{self._view.forward_mode.name} x {self._view.batch_size}; call them in pairs on "
                                "the same batch")
        self.attnmeta.init_forward_metadata_in_graph(self._view)

    # --- what each kind supplies ---
    def _before_staging(self, v: BatchView, in_capture: bool) -> None:
        """Work before the batch is staged (the verify mask where a planner packs it)."""

    def _shape(self, m, v: BatchView):
        """SGLang's metadata object of this kind over the bound fields ``m`` (once per plan)."""
        raise NotImplementedError

    def _per_step(self, meta, m, v: BatchView, in_capture: bool) -> None:
        """Per-step updates of the shaped object (fields that are not static buffers)."""

    def _publish(self, shaped) -> None:
        """Where the shaped metadata goes for the code that reads it: this backend's ``forward_metadata``."""
        self.forward_metadata = shaped
