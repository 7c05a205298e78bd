"""Triton's interpreter as the suite runs it: for the test processes (tests/conftest.py) and the fuzzer's
(tests/fuzz.py)."""

import dataclasses
import inspect
import os

import triton.language as tl
from triton.runtime import interpreter

# Triton's interpreter redoes every int32 add, sub and mul in int64 and asserts it did not overflow (a debug
# check a GPU build runs without): about half of its time on the fused kernels. The suite runs without it,
# except the tests marked ``overflow_checked`` (the kernels' own tests); ATTNMETA_TRITON_SANITIZE=1 (the slow
# tier) keeps it on everywhere.
SANITIZE = os.environ.get("ATTNMETA_TRITON_SANITIZE") == "1"


def sanitize_overflow(on: bool) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    b = interpreter.interpreter_builder
    b.options = dataclasses.replace(b.options, sanitize_overflow=on)


def lighter_interpreter() -> None:
    """Two costs of Triton's interpreter that are bookkeeping, not computing, taken out (CI's time): its dtype
    conversion builds a dict on each of about a million calls (a pure function of a hashable dtype: memoized),
    and each launch lists ``triton.language``'s members by reflection to patch its builtins (the same list each
    time: read once per module, then patched and restored per launch as before). What a kernel computes is
    unchanged; the tests of the kernels run through the same interpreter."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    if not (hasattr(interpreter, "_get_np_dtype") and hasattr(interpreter, "_patch_builtin")):
        return  # another Triton: left as it is
    get_np_dtype, dtypes = interpreter._get_np_dtype, {}

    def np_dtype(tt_dtype):
        if type(tt_dtype) is not tl.dtype:  # pointers and blocks: unhashable; the scalar dtypes are most calls
            return get_np_dtype(tt_dtype)
        if tt_dtype not in dtypes:
            dtypes[tt_dtype] = get_np_dtype(tt_dtype)
        return dtypes[tt_dtype]

    np_dtype.original = get_np_dtype
    interpreter._get_np_dtype = np_dtype
    builtins: dict[object, list] = {}

    def patch_builtin(pkg, builder, scope):
        if pkg not in builtins:
            builtins[pkg] = [(n, m) for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
        found = builtins[pkg]
        if found and getattr(pkg, found[0][0]) is not found[0][1]:
            return  # a jitted function called from a kernel: its launch patched them already (Triton re-lists none)
        for name, member in found:
            interpreter._patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_builtin = patch_builtin
