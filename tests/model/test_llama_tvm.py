"""A checkpoint the llama runner autosaved mid-generation loads in Apache TVM 0.27's real PagedAttentionKVCache
(tests/support/tvm_reference.py), declares the model's RoPE and layout, and holds in TVM the K/V a float64 forward of
the un-permuted weights with rotate-half RoPE computes: the K/V a TVM build of the model would keep.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tvm", reason="Apache TVM is not installed (CI installs it)")

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from support import tvm_reference as ref  # noqa: E402
from reference import load_gguf, reference_forward  # noqa: E402
from tiny_llama import CONFIG  # noqa: E402

from kvckpt_web import MemoryStore, list_generations, restore  # noqa: E402
from kvckpt_web.durable.catalog import load_manifest  # noqa: E402
from kvckpt_web.generation.app_state import StopRules  # noqa: E402
from kvckpt_web.generation.autosave import Autosave  # noqa: E402
from kvckpt_web.generation.generator import Generator  # noqa: E402
from kvckpt_web.model.caches import new_cache  # noqa: E402
from kvckpt_web.model.loader import load_model  # noqa: E402
from kvckpt_web.model.sampler import SamplingSettings  # noqa: E402

NAME = "chat"


@pytest.fixture(scope="module")
def checkpoint(device, tiny_llama_path):  # type: ignore[no-untyped-def]
    """A checkpoint of the middle of a generation: (TVM metadata, page groups, app_state), read back through a
    fresh cache from the store the generator autosaved into."""
    loaded = load_model(tiny_llama_path, device)
    store = MemoryStore()

    async def generate() -> tuple[str, list[bytes], dict]:
        cache = new_cache(loaded.model, device, max_tokens=128, prefill_chunk=16, page_size=16, num_seqs=1)
        prompt = loaded.text.encode_chat([{"role": "user", "content": "what is the weather there?"}])
        gen = await Generator.start(loaded.model, cache, prompt, SamplingSettings(), stop=StopRules(24),
                                    autosave=Autosave(store, NAME, every=8))
        async with gen:
            await gen.run()
        cache.close()
        generations = await list_generations(store, NAME)
        middle = next(g.generation for g in generations if 0 < len(g.app_state["generated_tokens"]) < 24)
        manifest, _ = await load_manifest(store, NAME, middle)
        fresh = new_cache(loaded.model, device, max_tokens=128, prefill_chunk=16, page_size=16, num_seqs=1)
        await restore(store, NAME, fresh, generation=middle)
        groups = [bytes(g) for g in await fresh.export_groups(0)]
        metadata = fresh.get_checkpoint_metadata(0)
        fresh.close()
        return metadata, groups, manifest.app_state

    return asyncio.run(generate())


def test_the_checkpoint_declares_the_models_rope_and_layout(checkpoint, tiny_llama_path):
    meta = json.loads(checkpoint[0])
    assert (meta["rope_mode"], meta["rotary_theta"], meta["rotary_scale"], meta["dtype"]) == \
        ("normal", CONFIG.rope_theta, 1.0, "float16")
    assert (meta["num_layers"], meta["num_qo_heads"], meta["num_kv_heads"], meta["qk_head_dim"]) == \
        (CONFIG.num_layers, CONFIG.num_qo_heads, CONFIG.num_kv_heads, CONFIG.head_dim)
    assert meta["seq_length"] == checkpoint[2]["kv_length"]


def test_tvm_imports_the_checkpoint_and_reexports_it_byte_for_byte(checkpoint):
    metadata, groups, _ = checkpoint
    tvm = tvm_cache(metadata)
    tvm.import_checkpoint(metadata, groups)
    assert tvm.export_groups(0) == groups
    assert tvm.get_checkpoint_metadata(0) == metadata


def test_tvm_holds_the_kv_of_the_unpermuted_float64_reference(checkpoint, tiny_llama_path):
    metadata, groups, app_state = checkpoint
    tvm = tvm_cache(metadata)
    tvm.import_checkpoint(metadata, groups)
    n = app_state["kv_length"]
    k, v = tvm.debug_get_kv(0, 0, n)
    tokens = (app_state["prompt_tokens"] + app_state["generated_tokens"])[:n]
    _, kv = reference_forward(*load_gguf(tiny_llama_path), tokens)
    for layer, (ref_k, ref_v) in enumerate(kv):  # float16 values: one ulp where float32 and float64 round apart
        np.testing.assert_allclose(np.asarray(k[layer], np.float64), ref_k, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(np.asarray(v[layer], np.float64), ref_v, rtol=2e-3, atol=2e-3)


def tvm_cache(metadata: str) -> ref.TVMCache:
    """A TVM cache of the layout and limits ``metadata`` declares."""
    m = json.loads(metadata)
    return ref.TVMCache(page_size=m["page_size"], num_layers=m["num_layers"], num_qo_heads=m["num_qo_heads"],
                        num_kv_heads=m["num_kv_heads"], head_dim=m["qk_head_dim"], dtype=m["dtype"],
                        rope_mode=ref.ROPE_NORMAL, rotary_theta=m["rotary_theta"],
                        reserved_num_seqs=m["reserved_num_seqs"], max_total_seq_len=128,
                        prefill_chunk_size=m["prefill_chunk_size"])
