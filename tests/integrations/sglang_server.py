"""SGLang's serving flow on a CPU, built from SGLang's own classes, for the integration tests.

``Server(flags)`` starts where a user starts: the command-line flags, parsed by SGLang's own
``prepare_server_args`` and resolved by its resolution pipeline (model-dependent EAGLE defaults,
capture sizes, page size), the runtime config published as a scheduler process publishes it,
``ModelConfig`` read from a small local ``config.json``, SGLang's own request and KV pools and its
``KVIndexTranslator``, and a real ``ModelRunner`` object carrying them. The attention backends are
then built by SGLang's own setup code (``get_attention_backend``: its registry, hybrid
prefill/decode) and, with EAGLE, its ``DraftBackendFactory`` on a draft runner. ``own(kind)`` is
SGLang's own backend of the same kind on the same runner: the oracle.

What stands in for a GPU server: the flags add ``--device cuda`` (so SGLang resolves its CUDA
defaults) while the pools live on the CPU; the model's weights are never loaded (attention
metadata needs none); the pools' rows are filled as SGLang's allocator fills them (whole pages, row
0 reserved) rather than by running its allocator.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from contextlib import contextmanager
from types import SimpleNamespace

import torch
from sglang.srt.configs.model_config import AttentionArch, ModelConfig
from sglang.srt.mem_cache.allocation_sizing import get_req_to_token_extra_context_len
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_executor.model_runner_components.attention_backend_setup import (
    get_attention_backend,
    resolve_attention_backend_strs,
)
from sglang.srt.runtime_context import create_context, get_spec, use_context
from sglang.srt.server_args import prepare_server_args
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from attnmeta.integrations.sglang import register

# a Llama small enough for a CPU: 8 query / 2 KV heads of 64, a 1024-token context
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
         "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
         "vocab_size": 1024, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "torch_dtype": "bfloat16", "hidden_act": "silu", "tie_word_embeddings": False}
# a DeepSeek-V2 (MLA: a compressed KV of 512 plus a rope key of 64, one KV head) small enough for a CPU
DEEPSEEK = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 512,
            "intermediate_size": 1024, "moe_intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": None,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 4,
            "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 2, "vocab_size": 1024,
            "max_position_embeddings": 1024,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "torch_dtype": "bfloat16", "hidden_act": "silu",
            "tie_word_embeddings": False}
# DeepSeek-V3's 128 query heads: where a kernel's schedule depends on the heads (FlashMLA's part count)
MODELS = {"llama": LLAMA, "deepseek": DEEPSEEK, "deepseek-h128": {**DEEPSEEK, "num_attention_heads": 128,
                                                                  "num_key_value_heads": 128}}
ROWS = 24  # request rows of the pools (the first reserved); every row's whole width has KV slots of its own


def model_dir(context: int = 1024, model: str = "llama") -> str:
    d = os.path.join(tempfile.gettempdir(), f"attnmeta-sglang-{model}-{context}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({**MODELS[model], "max_position_embeddings": context}, f)
    return d


def capture_list(most: int) -> list[int]:
    """The batch sizes the test servers capture, through SGLang's own ``--cuda-graph-bs-decode``: one row (no
    padding), a small and a middle size, and the request pool's size, so a random batch replays a graph its own
    size or one padded up by 1 to 14 rows. SGLang's default list for a 23-row pool is 16 sizes (1..8, then every
    second); each capture runs every kernel of both backends in Triton's interpreter, and more sizes exercise the
    same bucketing and padding again (CI's long pole)."""
    return sorted({s for s in (1, 3, 8) if s < most} | {most})


class Server:
    """One SGLang server's state, from its flags (``flags``: what a user types after
    ``python -m sglang.launch_server``, without ``--model-path``)."""

    def __init__(self, flags: list[str], seed: int = 0, device: str = "cpu", rows: int = ROWS, context: int = 1024,
                 model: str = "llama", window: int | None = None, window_pool: bool = False, chunk: int | None = None):
        """``window``: the sliding window SGLang resolved from the model (its runner's ``sliding_window_size``);
        ``window_pool``: the window layers' KV in a pool of its own (SGLang's ``SWAKVPool``: layer 0 windowed,
        the rest full) reached through a full-to-window slot table, else one plain pool. ``chunk``: chunked local
        attention's chunk (a Llama 4 config's ``attention_chunk_size``: SGLang's model config then says it is a
        local-attention model)."""
        register()
        self.window, self.window_pool, self.chunk = window, window_pool, chunk
        self.device, self.rows, self.hidden = device, rows, MODELS[model]["hidden_size"]
        path = model_dir(context, model)
        args = ["--model-path", path, "--skip-tokenizer-init", "--load-format", "dummy", "--device", "cuda", *flags]
        if "--speculative-algorithm" in flags and "--speculative-draft-model-path" not in flags:
            args += ["--speculative-draft-model-path", path]
        if not any(f.startswith("--cuda-graph-") and "-bs" in f for f in flags):
            args += ["--cuda-graph-bs-decode", *map(str, capture_list(rows - 1))]
        self.args = prepare_server_args(args)
        self.context = create_context(self.args, role="scheduler")  # SGLang resolves the flags here
        with self.active():
            self.model_config = ModelConfig.from_server_args(self.args)
            if chunk:  # as SGLang's ModelConfig reads a Llama 4 config (its architecture, its attention_chunk_size)
                self.model_config.is_local_attention_model, self.model_config.attention_chunk_size = True, chunk
            self.spec = get_spec()
            self.speculative = self.spec.speculative_algorithm is not None
            self.runner = self._runner(seed)
            from attnmeta.integrations.sglang.options import capture_sizes

            self.sizes = capture_sizes(self.runner)  # what SGLang's decode graph runner captures
            self.backend = self._build(self.runner)
            self.draft_runner = self.draft_decode = self.draft_extend = None
            if self.speculative:
                from sglang.srt.speculative.draft_utils import DraftBackendFactory

                self.draft_runner = self._draft_runner()
                f = DraftBackendFactory(self.draft_runner, self.spec.speculative_eagle_topk,
                                        self.spec.speculative_num_steps)
                self.draft_decode = f.create_decode_backend()
                self.draft_extend = f.create_draft_extend_backend()

    @contextmanager
    def active(self):
        """This server's published config (SGLang's is per process; tests hold several servers)."""
        with use_context(self.context):
            yield self

    # --- the runner, as ModelRunner's own set-up leaves it ---
    def _runner(self, seed: int) -> ModelRunner:
        mc, r = self.model_config, object.__new__(ModelRunner)
        from sglang.srt.runtime_context import get_parallel, get_schedule

        P, tp = get_schedule().page_size or 1, get_parallel().attn_tp_size
        r.server_args, r.model_config, r.device, r.gpu_id, r.tp_rank = self.args, mc, self.device, 0, 0
        r.is_draft_worker, r.draft_attention_backend = False, None
        r.spec_algorithm = SpeculativeAlgorithm.from_string(self.spec.speculative_algorithm)
        r.page_size, r.sliding_window_size, r.init_new_workspace = P, self.window, False
        r.attention_chunk_size = self.chunk  # ModelRunner copies it from the model config
        r.max_running_requests = self.rows - 1  # the request pool's rows, as SGLang sizes it from the flag
        r.model = torch.nn.Module()  # no weights are loaded: a model without layers (TRT-LLM MHA scans its modules)
        # fp32 on a CPU: Triton's interpreter computes bf16 attention wrong (SGLang's own kernels too)
        dt = torch.float32 if self.device == "cpu" else torch.bfloat16
        r.use_mla_backend, r.kv_cache_dtype, r.dtype = mc.attention_arch is AttentionArch.MLA, dt, dt
        r.kv_cache_dtype_str = "auto"  # SGLang's resolved --kv-cache-dtype (FlashAttention's __init__ reads it)
        dev, width = self.device, mc.context_len + get_req_to_token_extra_context_len()
        slots = self.slots = (self.rows * -(-width // P) + 1) * P
        r.req_to_token_pool = ReqToTokenPool(self.rows - 1, width, dev, False)
        r.token_to_kv_pool = MLATokenToKVPool(slots, P, r.kv_cache_dtype, mc.kv_lora_rank, mc.qk_rope_head_dim,
                                              mc.num_hidden_layers, dev, False) if r.use_mla_backend else \
            MHATokenToKVPool(slots, P, r.kv_cache_dtype, mc.get_num_kv_heads(tp), mc.head_dim, mc.num_hidden_layers,
                             dev, False) if not self.window_pool else self._window_pool(slots, P, r.kv_cache_dtype, tp)
        r.token_to_kv_pool_allocator = (
            TokenToKVPoolAllocator(slots, r.kv_cache_dtype, dev, r.token_to_kv_pool, False) if P == 1 else
            PagedTokenToKVPoolAllocator(slots, P, r.kv_cache_dtype, dev, r.token_to_kv_pool, False))
        r.init_kv_index_translator()
        fill_pool(r.req_to_token_pool.req_to_token, P, seed, slots)
        return r

    def _window_pool(self, slots: int, P: int, dtype, tp: int):
        """SGLang's two-pool layout for sliding-window models: layer 0's KV in a window pool of its own, the rest
        in the full pool, and the allocator's full-to-window slot table (here a seeded permutation of the window
        pool's slots, with SGLang's trailing -1) registered on the pool as SGLang's allocator registers it."""
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

        mc, layers = self.model_config, self.model_config.num_hidden_layers
        pool = SWAKVPool(size=slots, size_swa=slots, page_size=P, dtype=dtype, head_num=mc.get_num_kv_heads(tp),
                         head_dim=mc.head_dim, swa_attention_layer_ids=[0], full_attention_layer_ids=list(
                             range(1, layers)), device=self.device)
        g = torch.Generator().manual_seed(slots)
        table = torch.cat([torch.randperm(slots + P, generator=g) % slots, torch.tensor([-1])]).to(self.device)
        pool.register_mapping(table)
        return pool

    def _draft_runner(self) -> ModelRunner:
        """EAGLE's draft runner: the target's pools (SGLang shares them), its own backend choice."""
        d = object.__new__(ModelRunner)
        d.__dict__.update(self.runner.__dict__)
        d.is_draft_worker = True
        if self.chunk:  # the draft model is a plain Llama (Llama 4's EAGLE heads are): no chunked layers
            import copy

            d.model_config = copy.copy(self.model_config)
            d.model_config.is_local_attention_model, d.model_config.attention_chunk_size = False, None
            d.attention_chunk_size = None
        from sglang.srt.model_executor.model_runner import resolve_draft_attention_backend

        # its backend as SGLang's runner resolves it: --speculative-draft-attention-backend, else the target's
        d.draft_attention_backend = resolve_draft_attention_backend(draft_attention_backend=None, is_draft_worker=True)
        d.init_kv_index_translator()
        return d

    @staticmethod
    def _build(runner):
        resolved = resolve_attention_backend_strs(model_runner=runner)
        runner.prefill_attention_backend_str, runner.decode_attention_backend_str = resolved.prefill, resolved.decode
        return get_attention_backend(model_runner=runner)

    def own(self, kind: str, runner=None):
        """SGLang's own backend of ``kind`` on the same runner (pools, config): the oracle."""
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        with self.active():
            return ATTENTION_BACKENDS[kind](runner or self.runner)

    def own_drafters(self, kind: str):
        """SGLang's own draft decode and draft extend backends of ``kind`` on the draft runner."""
        from sglang.srt.speculative.draft_utils import DraftBackendFactory

        with self.active():
            d = object.__new__(ModelRunner)
            d.__dict__.update(self.draft_runner.__dict__)
            d.draft_attention_backend = kind
            f = DraftBackendFactory(d, self.spec.speculative_eagle_topk, self.spec.speculative_num_steps)
            return f.create_decode_backend(), f.create_draft_extend_backend()


def fill_pool(req_to_token: torch.Tensor, P: int, seed: int, slots: int) -> None:
    """Each request row a random list of whole pages (page 0 unused), as SGLang's paged allocator
    hands them out: token j of a row sits at slot ``page * P + j % P``. Row 0 stays all zeros."""
    rows, width = req_to_token.shape
    g = torch.Generator().manual_seed(seed)
    pages_per_row = -(-width // P)
    pages = torch.randperm(slots // P - 1, generator=g)[: (rows - 1) * pages_per_row] + 1
    pages = pages[: (rows - 1) * pages_per_row].view(rows - 1, pages_per_row)
    slots = (pages.repeat_interleave(P, dim=1) * P + torch.arange(pages_per_row * P) % P)[:, :width]
    req_to_token[1:] = slots.to(torch.int32).to(req_to_token.device)


# --- batches, as SGLang's scheduler and workers hand them to the backend ---
def _batch(server: Server, runner, mode: ForwardMode, rows: list[int], seq: list[int], tokens: int, spec=None,
           **extra) -> ForwardBatch:
    n, dev = len(rows), server.device
    seq_t = torch.tensor(seq, dtype=torch.int64)
    extra = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in extra.items()}
    fb = ForwardBatch(forward_mode=mode, batch_size=n, input_ids=torch.zeros(tokens, dtype=torch.int64, device=dev),
                      req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=dev), seq_lens=seq_t.to(dev),
                      out_cache_loc=torch.arange(1, tokens + 1, dtype=torch.int64, device=dev),
                      seq_lens_sum=int(seq_t.sum()), seq_lens_cpu=seq_t.clone(),
                      positions=torch.zeros(tokens, dtype=torch.int64, device=dev), spec_info=spec, **extra)
    plan = runner.kv_index_translator.own_plan(fb)  # as ForwardBatch.init_new binds it
    plan.bind(fb, runner.kv_index_translator, cols=None)
    return fb


def prefill(server: Server, rows: list[int], prefix: list[int], new: list[int], mixed: bool = False):
    """A prefill (or chunked-prefill) batch: ``new`` tokens after ``prefix`` cached ones per request."""
    seq = [p + e for p, e in zip(prefix, new, strict=True)]
    ext = dict(extend_seq_lens=torch.tensor(new, dtype=torch.int32), extend_seq_lens_cpu=list(new),
               extend_prefix_lens=torch.tensor(prefix, dtype=torch.int32), extend_prefix_lens_cpu=list(prefix),
               extend_num_tokens=sum(new),
               extend_start_loc=torch.tensor([0, *torch.tensor(new).cumsum(0)[:-1].tolist()], dtype=torch.int32),
               extend_logprob_start_lens_cpu=[0] * len(rows))
    mode = ForwardMode.MIXED if mixed else ForwardMode.EXTEND
    return _batch(server, server.runner, mode, rows, seq, sum(new), **ext)


def decode(server: Server, rows: list[int], seq: list[int], idle: bool = False):
    if idle:
        return _batch(server, server.runner, ForwardMode.IDLE, [], [], 0)
    return _batch(server, server.runner, ForwardMode.DECODE, rows, seq, len(rows))


def tree_mask(seq: list[int], D: int, rng: random.Random) -> torch.Tensor:
    """A drafter's tree mask as SGLang lays it out (request i: D rows of seq_i + D, back to back):
    every row sees its prefix and itself, and a random subset of the other drafts."""
    parts = []
    for s in seq:
        m = torch.zeros(D, s + D, dtype=torch.bool)
        m[:, :s] = True
        for t in range(D):
            m[t, s + t] = True
            for u in range(t):
                m[t, s + u] = rng.random() < 0.5
        parts.append(m.flatten())
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)


def verify(server: Server, rows: list[int], seq: list[int], rng: random.Random):
    """TARGET_VERIFY: D drafted tokens per request, with the drafter's tree mask."""
    from sglang.srt.speculative.eagle_info import EagleVerifyInput
    from sglang.srt.speculative.spec_info import SpecInputType  # noqa: F401 - the input's type is SGLang's

    D, K = server.spec.speculative_num_draft_tokens, server.spec.speculative_eagle_topk
    n = len(rows)
    spec = EagleVerifyInput(draft_token=torch.zeros(n * D, dtype=torch.int64),
                            custom_mask=tree_mask(seq, D, rng).to(server.device),
                            positions=torch.zeros(n * D, dtype=torch.int64), retrieve_index=None,
                            retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
                            spec_steps=server.spec.speculative_num_steps, topk=K, draft_token_num=D,
                            capture_hidden_mode=None, seq_lens_sum=sum(seq), seq_lens_cpu=torch.tensor(seq))
    return _batch(server, server.runner, ForwardMode.TARGET_VERIFY, rows, seq, n * D, spec=spec)


def draft_decode(server: Server, rows: list[int], seq: list[int]):
    """The drafter's round: a DECODE batch whose spec_info is EAGLE's draft input; each branch's
    position is its request's length (the first drafted token's), as EAGLE's worker sets it."""
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    K, n = server.spec.speculative_eagle_topk, len(rows)
    spec = EagleDraftInput(topk_p=torch.zeros(n, K), topk_index=torch.zeros(n, K, dtype=torch.int64),
                           hidden_states=torch.zeros(n, server.hidden))
    fb = _batch(server, server.draft_runner, ForwardMode.DECODE, rows, seq, n * K, spec=spec)
    fb.positions = torch.tensor(seq, dtype=torch.int64, device=server.device).repeat_interleave(K)
    # every branch's S draft slots in a row (``[bs, topk, S]``), as EAGLE's worker hands them: the slots it wrote
    # into the request's row for that branch, a page-aligned region after the prefix's whole pages, its first
    # seq % P columns the copied partial page (page size 1: from column seq + k * S)
    P, S = server.runner.page_size, server.spec.speculative_num_steps
    table = server.draft_runner.req_to_token_pool.req_to_token
    loc = []
    for row, q in zip(rows, seq, strict=True):
        last = q % P
        stride = -(-(last + S) // P) * P
        loc += [int(table[row, q - last + k * stride + last + t]) for k in range(K) for t in range(S)]
    fb.out_cache_loc = torch.tensor(loc, dtype=torch.int64, device=server.device)
    return fb


def draft_extend(server: Server, rows: list[int], prefix: list[int]):
    """DRAFT_EXTEND_V2 as EAGLE's v2 worker prepares it (``prepare_for_draft_extend``): every request
    extends by the D draft slots after its ``prefix`` (the accepted tokens first), so the extend
    lengths are all D, the prefix lengths the old lengths and ``seq_lens`` counts the D slots."""
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    D, n = server.spec.speculative_num_draft_tokens, len(rows)
    full = torch.full((n,), D, dtype=torch.int32, device=server.device)
    spec = EagleDraftExtendInput(hidden_states=torch.zeros(n * D, server.hidden), num_correct_drafts=full - 1,
                                 num_accept_tokens=full, num_accept_tokens_cpu=[D] * n, num_tokens_per_req=D)
    seq = [p + D for p in prefix]
    return _batch(server, server.draft_runner, ForwardMode.DRAFT_EXTEND_V2, rows, seq, n * D, spec=spec,
                  extend_seq_lens=torch.full((n,), D, dtype=torch.int32), extend_seq_lens_cpu=[D] * n,
                  extend_prefix_lens=torch.tensor(prefix, dtype=torch.int32), extend_prefix_lens_cpu=list(prefix))


__all__ = ["LLAMA", "ROWS", "Runners", "Server", "SimpleNamespace", "decode", "decode_view", "draft_decode",
           "draft_decode_view", "draft_extend", "draft_extend_view", "fill_pool", "padded", "prefill", "rows_read",
           "tree_mask", "verify", "without_host_lengths"]


def without_host_lengths(fb):
    """``fb`` as SGLang's scheduler hands it to backends that declare ``needs_cpu_seq_lens = False`` (FlashMLA,
    TRT-LLM MLA and MHA): no host mirror of the lengths, no host sum."""
    fb.seq_lens_cpu, fb.seq_lens_sum = None, None
    if getattr(fb, "spec_info", None) is not None and hasattr(fb.spec_info, "seq_lens_cpu"):
        fb.spec_info.seq_lens_cpu = None
    return fb


# the runners and the comparison live beside (tests/integrations/sglang_runners.py); these names stay importable here
from tests.integrations.sglang_runners import (  # noqa: E402
    Runners,
    decode_view,
    draft_decode_view,
    draft_extend_view,
    padded,
    rows_read,
)
