"""kvckpt_web.gpu.specialize: constants first, tagged lines repeated per index."""

from __future__ import annotations

import pytest

from kvckpt_web import DeviceError
from kvckpt_web.gpu.specialize import specialize


def test_constants_come_first_as_u32():
    assert specialize("fn f() {}\n", dict(A=3, B=0)) == "const A: u32 = 3u;\nconst B: u32 = 0u;\nfn f() {}\n"


def test_a_tagged_line_is_repeated_per_index_with_the_tag_removed():
    text = specialize("  var x{i} = {i}u;  // each i < A\nlet y = 1u;\n", dict(A=3))
    assert text.splitlines()[1:] == ["  var x0 = 0u;", "  var x1 = 1u;", "  var x2 = 2u;", "let y = 1u;"]


def test_two_indices_expand_first_outer_then_inner():
    text = specialize("a{n}_{w};  // each n < N, w < W\n", dict(N=2, W=2))
    assert text.splitlines()[2:] == ["a0_0;", "a0_1;", "a1_0;", "a1_1;"]


def test_an_untagged_comment_that_starts_with_each_is_kept():
    assert specialize("// each word of a row\n", {}) == "// each word of a row\n"


def test_a_bound_that_is_not_a_constant_is_refused():
    with pytest.raises(DeviceError, match="'i < B'"):
        specialize("x{i};  // each i < B\n", dict(A=1))


def test_a_line_tagged_if_is_kept_only_where_its_constant_is_not_zero():
    source = "a;  // if D\nb;  // unless D\nc;\n"
    assert specialize(source, dict(D=1)).splitlines()[1:] == ["a;", "c;"]
    assert specialize(source, dict(D=0)).splitlines()[1:] == ["b;", "c;"]


def test_a_condition_on_a_name_that_is_not_a_constant_is_refused():
    with pytest.raises(DeviceError, match="'D'"):
        specialize("a;  // if D\n", dict(A=1))
