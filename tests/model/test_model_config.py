"""A model's configuration as kvckpt_web.model.config reads it from GGUF metadata: each architecture's features,
Gemma 3's layer kinds, the RoPE rates per layer, and the refusals of what the runner does not implement, each
naming the GGUF key, the expected and the got value."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tiny_archs import write_tiny_arch  # noqa: E402
from tiny_llama import write_tiny_llama  # noqa: E402

from kvckpt_web.errors import FormatError  # noqa: E402
from kvckpt_web.model.config import LlamaConfig  # noqa: E402
from kvckpt_web.model.gguf import open_gguf  # noqa: E402
from kvckpt_web.model.llama_tensors import rope_rates  # noqa: E402


def config_of(path: Path) -> LlamaConfig:
    return LlamaConfig.from_gguf(open_gguf(path))


@pytest.mark.parametrize("kind, features", [
    ("llama3", dict(architecture="llama", permuted_qk=True, qkv_bias=False, qk_norm=False, post_norms=False,
                    activation="silu", embedding_scale=1.0, sliding_window=0)),
    ("qwen2", dict(architecture="qwen2", permuted_qk=False, qkv_bias=True, qk_norm=False, post_norms=False,
                   activation="silu", embedding_scale=1.0, sliding_window=0)),
    ("qwen3", dict(architecture="qwen3", permuted_qk=False, qkv_bias=False, qk_norm=True, post_norms=False,
                   activation="silu", embedding_scale=1.0, sliding_window=0, head_dim=48)),
    ("gemma3", dict(architecture="gemma3", permuted_qk=False, qkv_bias=False, qk_norm=True, post_norms=True,
                    activation="gelu_tanh", embedding_scale=math.sqrt(192), sliding_window=5, head_dim=64)),
])
def test_each_architecture_reads_as_its_features(tmp_path, kind, features):
    path, _, _ = write_tiny_arch(tmp_path / "m.gguf", kind)
    c = config_of(path)
    assert {name: getattr(c, name) for name in features} == features


def test_gemma3_layers_slide_but_every_sixth_with_the_local_rope_base():
    c = LlamaConfig(num_layers=18, hidden=640, ffn=2048, num_qo_heads=4, num_kv_heads=1, head_dim=256,
                    rope_theta=1e6, rms_eps=1e-6, max_context=32768, vocab=8, architecture="gemma3",
                    sliding_window=512, sliding_pattern=6, rope_scaling="linear", rope_scale=0.125)
    assert [i for i in range(18) if not c.sliding(i)] == [5, 11, 17]
    assert (c.layer_rope(0), c.layer_rope(5)) == ((10000.0, 1.0), (1e6, 0.125))
    rates = rope_rates(c)
    assert rates[0][1] == pytest.approx(10000.0 ** (-2 / 256))
    assert rates[5][1] == pytest.approx(0.125 * 1e6 ** (-2 / 256))


def test_linear_rope_scaling_scales_positions_by_one_over_its_factor(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", metadata={"rope.scaling.type": "linear", "rope.scaling.factor": 4.0})
    c = config_of(path)
    assert (c.rope_scaling, c.rope_scale) == ("linear", 0.25)
    assert rope_rates(c)[0][0] == 0.25


def test_llama3_frequency_factors_divide_the_rates():
    c = LlamaConfig(num_layers=2, hidden=64, ffn=64, num_qo_heads=2, num_kv_heads=2, head_dim=32, rope_theta=500000.0,
                    rms_eps=1e-5, max_context=64, vocab=8)
    factors = [1.0 + i for i in range(16)]
    assert rope_rates(c, factors)[1][3] == pytest.approx(500000.0 ** (-6 / 32) / 4.0)


def test_an_unknown_architecture_is_refused_naming_it(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", arch="mistral")
    with pytest.raises(FormatError, match=r"general\.architecture: expected 'llama' or 'qwen2' or 'qwen3' or "
                                          r"'gemma3', got 'mistral'"):
        config_of(path)


@pytest.mark.parametrize("kind, metadata, message", [
    ("gemma3", {"attention.sliding_window": 0}, r"gemma3\.attention\.sliding_window: expected an integer >= 1, got 0"),
    ("qwen3", {"attention.value_length": 32}, r"qwen3\.attention\.value_length: expected the key length 48, got 32"),
    ("qwen3", {"rope.dimension_count": 32}, r"qwen3\.rope\.dimension_count: expected the head dimension 48"),
    ("qwen2", {"rope.scaling.type": "yarn"}, r"qwen2\.rope\.scaling\.type: expected 'none' or 'linear', got 'yarn'"),
    ("llama3", {"rope.scaling.type": "linear", "rope.scaling.factor": 0.0},
     r"llama\.rope\.scaling\.factor: expected a finite positive number, got 0\.0"),
])
def test_what_the_runner_does_not_implement_is_refused_naming_the_key(tmp_path, kind, metadata, message):
    path, _, _ = write_tiny_arch(tmp_path / "m.gguf", kind, metadata=metadata)
    with pytest.raises(FormatError, match=message):
        config_of(path)


def test_the_real_gemma3_files_configuration(gemma_path):
    c = config_of(gemma_path)
    assert (c.architecture, c.num_layers, c.hidden, c.ffn, c.num_qo_heads, c.num_kv_heads, c.head_dim, c.vocab) == \
        ("gemma3", 18, 640, 2048, 4, 1, 256, 262144)
    assert (c.sliding_window, [i for i in range(18) if not c.sliding(i)]) == (512, [5, 11, 17])
    assert (c.layer_rope(0), c.layer_rope(5)) == ((10000.0, 1.0), (1e6, 1.0))
    assert (c.qk_norm, c.post_norms, c.activation, c.qkv_bias) == (True, True, "gelu_tanh", False)
    assert (c.embedding_scale, c.attention_scale) == (math.sqrt(640), 1 / 16)
    assert c.rms_eps == pytest.approx(1e-6)
