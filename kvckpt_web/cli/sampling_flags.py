"""The sampling flags ``kvckpt generate`` and ``kvckpt chat`` share."""

from __future__ import annotations

import argparse

__all__ = ["add_sampling_flags"]


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--temperature``, ``--top-k``, ``--top-p`` and ``--repetition-penalty`` to ``parser`` (each None
    unless given; the help says the default the command applies)."""
    parser.add_argument("--temperature", type=float, help="0 picks the most likely token (default 0)")
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens (default 0: off)")
    parser.add_argument("--top-p", type=float, help="sample among the most likely tokens holding this much "
                        "probability (default 1: off)")
    parser.add_argument("--repetition-penalty", type=float, help="penalty of tokens already seen (default 1: off)")
