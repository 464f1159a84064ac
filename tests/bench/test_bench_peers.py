"""``make bench-peers``' rows say the CPU's vector width: the widest of AVX2 and AVX-512, and llvmpipe's bits."""

from __future__ import annotations

from kvckpt_web.bench.peers import vector_width

LLVMPIPE = "llvmpipe (LLVM 15.0.6, 256 bits)"


def test_an_avx512_cpu_is_named_beside_llvmpipes_width_from_its_adapter_name():
    assert vector_width({"avx2", "avx512f", "sse4_2"}, LLVMPIPE) == "AVX-512, llvmpipe 256 bits"


def test_an_avx2_only_cpu_is_named_avx2():
    assert vector_width({"avx", "avx2"}, "llvmpipe (LLVM 17.0.6, 512 bits)") == "AVX2, llvmpipe 512 bits"


def test_an_adapter_that_is_not_llvmpipe_is_named_as_it_is():
    assert vector_width(set(), "NVIDIA H100") == "no AVX2, NVIDIA H100"
