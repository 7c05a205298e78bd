"""The names the command line offers before it imports the compiler (``attnmeta --help`` and
``attnmeta inspect`` answer without loading torch). ``tests/test_cli.py`` checks each list against the
compiler's own, so they cannot drift."""

# the compiler's passes, in pipeline order (attnmeta.compiler.GENERIC_PASSES, then PER_BS_PASSES)
PASSES = ["verify", "infer-shapes", "hoist-upgrades", "dce", "cse", "pass-through", "pack-inputs", "guard-inputs",
          "plan-buffers", "specialize-batch", "check-split", "fuse"]
MODES = ["decode", "idle", "target_verify", "draft_extend", "extend"]
# attnmeta's own backends (attnmeta.backends.SPECS); compile also takes any installed or user spec
BACKENDS = sorted([
    "cutedsl_mla", "dsv4", "flashattention", "flashattention_draft", "flashinfer", "flashinfer_mla", "flashmla",
    "multistep_flashinfer", "multistep_flashinfer_mla", "multistep_triton", "tbo_cutedsl_mla", "tbo_flashattention",
    "tbo_flashinfer", "tbo_flashinfer_mla", "tbo_flashmla", "tbo_triton", "tbo_trtllm_mha", "tbo_trtllm_mla",
    "triton", "trtllm_mha", "trtllm_mla",
])
