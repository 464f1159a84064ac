"""WGSL sources specialised to sizes known when a kernel is built: constants, and lines repeated per index.

llvmpipe (lavapipe) keeps a kernel's private arrays in registers only where every index is a constant; a loop
over a vector's parts with a variable index makes each access a per-lane gather or scatter, and every loop
iteration counts against its 65535-iteration budget. A kernel can instead write such a loop as one line
tagged ``// each x < BOUND`` (or ``// each x < BOUND, y < BOUND2``): :func:`specialize` repeats the line for
x = 0 .. BOUND - 1 (and each y), with ``{x}`` replaced by the value; BOUND names one of the constants. A line
tagged ``// if NAME`` is kept only where the constant NAME is not 0, one tagged ``// unless NAME`` only where it
is 0: two variants of a kernel may then bind different resources at one binding.
"""

from __future__ import annotations

import itertools
import re

from ..errors import DeviceError

_EACH = re.compile(r"\s*//\s*each\s+(\w+\s*<\s*\w+(?:\s*,\s*\w+\s*<\s*\w+)*)\s*$")
_RANGE = re.compile(r"^(\w+)\s*<\s*(\w+)$")
_IF = re.compile(r"\s*//\s*(if|unless)\s+(\w+)\s*$")


def specialize(source: str, constants: dict[str, int]) -> str:
    """``source`` with ``const NAME: u32 = value;`` for each of ``constants`` first and its tagged lines expanded."""
    lines = [f"const {name}: u32 = {value}u;" for name, value in constants.items()]
    for line in source.splitlines():
        condition = _IF.search(line)
        if condition is not None:
            kind, name = condition.groups()
            if name not in constants:
                raise DeviceError(f"shader line {line.strip()!r}: expected '{kind} NAME' with NAME one of "
                                  f"{sorted(constants)}, got {name!r}")
            if (constants[name] != 0) == (kind == "if"):
                lines.append(line[:condition.start()])
            continue
        tag = _EACH.search(line)
        if tag is None:
            lines.append(line)
            continue
        names, bounds = [], []
        for part in tag.group(1).split(","):
            found = _RANGE.match(part.strip())
            if found is None or found.group(2) not in constants:
                raise DeviceError(f"shader line {line.strip()!r}: expected 'each x < BOUND' with BOUND one of "
                                  f"{sorted(constants)}, got {part.strip()!r}")
            names.append(found.group(1))
            bounds.append(range(constants[found.group(2)]))
        body = line[:tag.start()]
        for values in itertools.product(*bounds):
            text = body
            for name, value in zip(names, values):
                text = text.replace("{" + name + "}", str(value))
            lines.append(text)
    return "\n".join(lines) + "\n"
