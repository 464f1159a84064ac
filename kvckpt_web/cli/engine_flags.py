"""The engine a command runs: the ``desktop`` preset (:data:`~kvckpt_web.engine.PRESETS`) with the fields its
flags give replaced (``--prefill-chunk`` is ``prefill_chunk``), checked before the model loads as
:class:`~kvckpt_web.engine.EngineConfig` checks them, the error naming the flag."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from ..engine import PRESETS, EngineConfig
from ..errors import FieldError

__all__ = ["DESKTOP", "engine_config"]

DESKTOP = PRESETS["desktop"]
"""The preset the commands start from."""


def engine_config(args: argparse.Namespace, fields: Iterable[str], base: EngineConfig = DESKTOP) -> EngineConfig:
    """``base`` with each of ``fields`` replaced by its flag's value, when given; FieldError naming the flag."""
    try:
        return base.replace(**{name: getattr(args, name) for name in fields})
    except FieldError as exc:
        raise FieldError("--" + exc.field.replace("_", "-"), exc.expected, exc.got) from None
