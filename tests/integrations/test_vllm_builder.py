"""attnmeta's vLLM metadata builder against vLLM 0.33's real classes: its ``AttentionMetadataBuilder``
base and ``AttentionCGSupport`` levels, ``CommonAttentionMetadata`` batches over a persistent block
table, and vLLM's own page-index kernel (``_copy_page_indices_kernel``, read from vLLM's source and
run in Triton's interpreter) plus its last-page formula as the oracle."""

import ast
import importlib.util
import os
import pathlib
import random
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch

try:
    import vllm.v1.attention.backend as vllm_backend
except ImportError as e:  # make test installs vLLM in the engines' venv: there, missing is a failure
    if os.environ.get("ATTNMETA_SGLANG_VENV") == "1":
        raise
    pytest.skip(f"vLLM is not installed here ({e})", allow_module_level=True)
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

from attnmeta.compiler.ir.errors import OptionsError  # noqa: E402
from attnmeta.runtime import BatchError  # noqa: E402

L, MAX_BS, SIZES = 1024, 16, [1, 4, 8, 16]


def vllm_page_kernel():
    """vLLM's FlashInfer builder's page-index kernel, from its source file (importing that module
    needs FlashInfer's GPU stack; the kernel itself is plain Triton)."""
    import triton
    import triton.language as tl

    path = pathlib.Path(importlib.util.find_spec("vllm").origin).parent / "v1/attention/backends/flashinfer.py"
    src = path.read_text()
    name = "_copy_page_indices_kernel"
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == name)
    code = "\n".join(src.splitlines()[fn.decorator_list[0].lineno - 1 : fn.end_lineno])
    out = pathlib.Path(tempfile.mkdtemp()) / "vllm_page_kernel.py"  # Triton's JIT reads a function's file
    out.write_text("import triton\nimport triton.language as tl\n\n" + code + "\n")
    spec = importlib.util.spec_from_file_location("vllm_page_kernel", out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert callable(mod._copy_page_indices_kernel[(1,)]), (triton, tl)  # a Triton kernel, launched by a grid
    return mod._copy_page_indices_kernel


def vllm_oracle(kernel, table, seq: np.ndarray, P: int):
    """What vLLM's FlashInfer builder computes (``_compute_flashinfer_kv_metadata``)."""
    n = len(seq)
    blocks = (seq + P - 1) // P
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(blocks, dtype=np.int32, out=indptr[1:])
    out = torch.zeros(max(int(indptr[-1]), 1), dtype=torch.int32)
    if n:
        kernel[(n,)](out, table, table.stride(0), torch.from_numpy(indptr), BLOCK_SIZE=1024)
    last = seq % P
    last = np.where((last == 0) & (seq != 0), P, last)
    return indptr, out[: indptr[-1]], last


def config(P):
    """vLLM's config fields the builder reads (building a real VllmConfig needs vLLM's server stack)."""
    vllm_config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=L),
                                  scheduler_config=SimpleNamespace(max_num_seqs=MAX_BS),
                                  compilation_config=SimpleNamespace(cudagraph_capture_sizes=SIZES),
                                  speculative_config=None,
                                  parallel_config=SimpleNamespace(decode_context_parallel_size=1))
    return vllm_config, FullAttentionSpec(block_size=P, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)


def common(seq: list[int], table_full, query_lens=None):
    n = len(seq)
    q = query_lens or [1] * n
    qsl = torch.tensor([0, *np.cumsum(q)], dtype=torch.int32)
    s = torch.tensor(seq, dtype=torch.int32)
    return vllm_backend.CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=s, num_reqs=n, num_actual_tokens=int(sum(q)),
        max_query_len=max(q, default=0), max_seq_len=max(seq, default=0), block_table_tensor=table_full[:n],
        slot_mapping=torch.zeros(int(sum(q)), dtype=torch.int64), seq_lens_cpu_upper_bound=s.clone())


def test_the_builder_is_a_vllm_builder():
    from attnmeta.integrations.vllm import AttnmetaPagedMetadataBuilder

    assert issubclass(AttnmetaPagedMetadataBuilder, vllm_backend.AttentionMetadataBuilder)
    vc, kv = config(16)
    assert (AttnmetaPagedMetadataBuilder.get_cudagraph_support(vc, kv)
            is vllm_backend.AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
    b = AttnmetaPagedMetadataBuilder(kv, ["layer.0"], vc, torch.device("cpu"))
    assert b.compiled.options.sizes == tuple(SIZES) and b.compiled.options.page_size == 16
    assert b.compiled.summary()[0]["kernels"] == "1"


@pytest.mark.parametrize("P", [1, 16, 64])
def test_paged_metadata_equals_vllm(P):
    from attnmeta.integrations.vllm import AttnmetaPagedMetadataBuilder

    vc, kv = config(P)
    W = -(-L // P)
    g = torch.Generator().manual_seed(P)
    table = torch.randint(1, 10_000, (MAX_BS, W), generator=g, dtype=torch.int32)  # vLLM's persistent table
    b = AttnmetaPagedMetadataBuilder(kv, ["layer.0"], vc, torch.device("cpu"))
    kernel = vllm_page_kernel()
    b.build_for_cudagraph_capture(common([1] * 16, table))
    rng = random.Random(P)
    edges = sorted({0, 1, P - 1, P, P + 1, 2 * P, L - 1, L} - {-1})
    for step in range(25):
        n = rng.randint(1, MAX_BS)
        seq = [rng.choice(edges) if rng.random() < 0.5 else rng.randint(1, L) for _ in range(n)]
        q = [1] * n if step % 3 else [rng.randint(1, 5) for _ in range(n)]  # decodes, and mixed batches
        table[:n] = torch.randint(1, 10_000, (n, W), generator=g, dtype=torch.int32)  # vLLM rewrites rows in place
        m = b.build(0, common(seq, table, q))
        indptr, indices, last = vllm_oracle(kernel, table, np.array(seq, dtype=np.int64), P)
        assert m.paged_kv_indptr[: n + 1].tolist() == indptr.tolist()
        assert m.paged_kv_indices[: indptr[-1]].tolist() == indices.tolist()
        assert m.paged_kv_last_page_len[:n].tolist() == last.tolist()
        assert m.paged_kv_indptr_cpu[: n + 1].tolist() == indptr.tolist()
        assert m.paged_kv_last_page_len_cpu[:n].tolist() == last.tolist()
        assert m.num_actual_tokens == sum(q) and m.block_table.data_ptr() == table.data_ptr()


def test_the_builder_refuses_what_it_cannot_serve():
    from attnmeta.compiler import CompileOptions, compile_backend
    from attnmeta.integrations.vllm import AttnmetaPagedMetadataBuilder

    vc, kv = config(16)
    table = torch.ones(MAX_BS, L // 16, dtype=torch.int32)
    b = AttnmetaPagedMetadataBuilder(kv, ["layer.0"], vc, torch.device("cpu"))
    cm = common([5, 9], table)
    cm.seq_lens_cpu_upper_bound = None
    with pytest.raises(BatchError, match="no seq_lens_cpu_upper_bound"):
        b.build(0, cm)
    with pytest.raises(BatchError, match=f"a sequence of {L + 1} tokens exceeds {L}"):
        b.build(0, common([5, L + 1], table))
    with pytest.raises(BatchError, match="exceeds max_bs=16"):
        b.build(0, common([1] * 17, torch.ones(17, L // 16, dtype=torch.int32)))
    with pytest.raises(OptionsError, match="serves attnmeta's 'vllm_paged' spec"):
        AttnmetaPagedMetadataBuilder(kv, ["layer.0"], vc, torch.device("cpu"),
                                     compiled=compile_backend("triton", CompileOptions(max_bs=4)))
    assert b.build(0, common([5, 9], table)).paged_kv_indptr[:3].tolist() == [0, 1, 2]


@pytest.mark.parametrize("P", [1, 16])
def test_vllms_padded_block_table_width_is_read_as_is(P):
    """vLLM pads its persistent block table's rows to a multiple of 128 tokens (``get_block_table_width``
    in vllm/v1/worker/block_table.py: 64 columns at block size 16 for max_model_len 1000; its module
    does not import beside SGLang's pins, so the width is computed here as it computes it). The
    builder reads the first ceil(L / P) columns at vLLM's row stride; narrower, transposed or
    short tables are refused by name."""
    import math

    from attnmeta.integrations.vllm import AttnmetaPagedMetadataBuilder

    vc, kv = config(P)
    need = -(-L // P)
    align = 128 // math.gcd(128, P)
    width = -(-need // align) * align
    g = torch.Generator().manual_seed(3)
    table = torch.randint(1, 10_000, (MAX_BS, width), generator=g, dtype=torch.int32)
    b = AttnmetaPagedMetadataBuilder(kv, ["layer.0"], vc, torch.device("cpu"))
    seq = [L, 1, P + 1, 3 * P]
    m = b.build(0, common(seq, table))
    indptr, indices, last = vllm_oracle(vllm_page_kernel(), table, np.array(seq, dtype=np.int64), P)
    assert m.paged_kv_indices[: indptr[-1]].tolist() == indices.tolist()
    fresh = AttnmetaPagedMetadataBuilder(kv, ["layer.0"], vc, torch.device("cpu"))
    with pytest.raises(BatchError, match=f"a row must hold at least ceil\\(max_model_len / block_size\\) = {need}"):
        fresh.build(0, common([1], table[:, : need - 1]))
    with pytest.raises(BatchError, match="column stride"):
        fresh.build(0, common([1], torch.ones(need, MAX_BS, dtype=torch.int32).t()))
    with pytest.raises(BatchError, match=f"room for 2 rows, fewer than max_num_seqs = {MAX_BS}"):
        fresh.build(0, common([1], torch.ones(2, need, dtype=torch.int32)))
