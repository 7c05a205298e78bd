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
    _lazy_tuple_types()
    _light_block_types()


def _light_block_types() -> None:
    """A block type is made for nearly every value a kernel computes; its constructor checks the shape (powers of
    two, under Triton's limit) and formats its name each time. The check's result is kept per shape (a shape it
    refuses is refused as before, every time) and the name formatted when first read."""
    bt = tl.core.block_type
    if hasattr(bt.__init__, "original"):
        return
    from triton._utils import validate_block_shape

    original, numels = bt.__init__, {}

    def init(self, element_ty, shape):
        self.element_ty = element_ty
        assert isinstance(shape, (list, tl.core.tuple))  # Triton's check: core.py's ``tuple`` is its own class
        dims = tuple(tl.core._unwrap_shape(shape))
        self.shape = tl.core.tuple(dims)  # Triton's own tuple, as its constructor makes (core.py shadows the name)
        if not dims:
            raise TypeError("0d block_type is forbidden")
        numel = numels.get(dims)
        if numel is None:
            numel = numels[dims] = validate_block_shape(dims)
        self.numel = numel
        self._name = None

    init.original = original
    bt.__init__ = init
    bt.name = _when_read("_name", lambda self: f"<{self.shape}, {self.element_ty}>")


def _when_read(slot: str, make) -> property:
    """An attribute kept in ``slot``, made by ``make(self)`` when first read while it is None; set as before."""

    def get(self):
        if getattr(self, slot) is None:
            setattr(self, slot, make(self))
        return getattr(self, slot)

    return property(get, lambda self, value: setattr(self, slot, value))


def _lazy_tuple_types() -> None:
    """Every tensor the interpreter makes carries its shape as a ``tl.tuple``, whose constructor builds the
    tuple's type (a ``constexpr_type`` per dimension, names and all): millions of times a test file, read almost
    never (a third of the interpreter's time in the engine-modes tests). The type is built when first read
    instead, from the same values (the one mutator, ``_setitem``, reads it and sets a new one, as before)."""
    tup = tl.core.tuple
    if isinstance(vars(tup).get("type"), property):
        return  # patched already

    def init(self, args, type=None):
        self.values = list(args)
        if isinstance(type, tl.core.tuple_type):
            self._type = type
        elif type is not None:  # a list of types (Triton's deserialization)
            self._type = tl.core.tuple_type(type)
        else:
            self._type = None

    init.original = tup.__init__
    tup.__init__ = init
    tup.type = _when_read("_type", lambda self: tl.core._type_for_tuple_values(self.values))
