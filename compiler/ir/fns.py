"""The elementwise and comparison functions ops take by name (``ewise``, ``outer``, ``compare``),
with their torch reference: one table the op rules, the reference and the kernels share."""

from __future__ import annotations

import torch

EWISE = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "ceildiv": lambda a, b: -torch.div(-a, b, rounding_mode="floor"),  # for a positive divisor
    "mod": torch.remainder,  # floor modulo: the result has the divisor's sign
    "min": torch.minimum,
    "max": torch.maximum,
}
CMP = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}
REDUCE = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}
