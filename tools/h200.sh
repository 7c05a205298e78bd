#!/usr/bin/env bash
# Set up a fresh lent H200 for attnmeta's GPU tier and SGLang's engine, then run the given command.
#   run(command="bash tools/h200.sh pytest -m cuda tests/gpu", carry=[".whl", ".sgl"])
# .whl: FlashInfer's wheels (fetch-wheels.sh) and FlashMLA's (pip download --no-deps sgl-flash-mla; built on
# torch's stable ABI, it loads on the machine's torch 2.11); .sgl: SGLang's Python code and its import-time
# wheels (pack-sglang.sh). SGLang's kernel package is stood in by tests/gpu/standin (torch-only bodies for what a
# dense model calls; everything else raises when called).
set -euo pipefail
mkdir -p /tmp/sgl
[ -d .sgl ] && tar -xJf .sgl/sglang_py.tar.xz -C /tmp/sgl
# SGLang's JIT kernel sources (its engine compiles them with the machine's nvcc): a tarball beside the .py one,
#   tar -cf - sglang/kernels/jit/include sglang/kernels/jit/csrc | xz > .sgl/sglang_jit.tar.xz  (from its wheel)
[ -f .sgl/sglang_jit.tar.xz ] && tar -xJf .sgl/sglang_jit.tar.xz -C /tmp/sgl
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl $( [ -d .sgl ] && echo .sgl/whl/*.whl ) 2>&1 | grep -v "^WARNING" || true
export PYTHONPATH="$PWD/tests/gpu/standin:/tmp/sgl:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING" || true
export PYTHONUNBUFFERED=1 SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
exec "$@"
