"""What a generation saves with its K/V: the ``app_state`` of each checkpoint (generation/APP_STATE.md), and
its stop rules, written and read back.

The model is the test double of ``lm_double.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvckpt_web import MemoryStore, list_generations
from kvckpt_web.durable.catalog import load_manifest
from kvckpt_web.errors import FieldError, FormatError
from kvckpt_web.generation.app_state import APP_FORMAT, APP_VERSION, StopRules
from kvckpt_web.generation.autosave import Autosave

from lm_double import EOS, DoubleLM
from runs import PROMPT, TOP_P, start
from support.kvmodel import run


def test_each_save_records_the_kv_length_of_its_checkpoint_and_the_pending_tokens(make_cache):
    store = MemoryStore()
    model = DoubleLM()
    gen = start(model, make_cache(model), TOP_P, autosave=Autosave(store, "chat", every=3, keep=100))
    run(gen.run())
    infos = run(list_generations(store, "chat"))
    assert len(infos) > 5
    for info in infos:
        state = info.app_state
        tokens = state["prompt_tokens"] + state["generated_tokens"]
        assert state["kv_length"] == info.seq_length < len(tokens)
        if state["generated_tokens"]:
            assert state["kv_length"] == len(tokens) - 1  # only the last picked token is pending
        picks = len(state["generated_tokens"])
        assert state["sampler"]["counter"] == picks  # one draw per sampled token: the state after the last
    assert infos[-1].app_state["finish_reason"] == "length"
    assert infos[-1].app_state["generated_tokens"] == list(gen.generated_tokens)


def test_app_state_carries_format_version_model_sampler_and_stop_rules(make_cache):
    store = MemoryStore()
    model = DoubleLM()
    stop = StopRules(12, (EOS,), ("zz",))
    gen = start(model, make_cache(model), TOP_P, stop=stop, autosave=Autosave(store, "chat", every=4))
    run(gen.run())
    manifest, _ = run(load_manifest(store, "chat"))
    state = manifest.app_state
    assert (state["format"], state["version"], state["model"]) == (APP_FORMAT, APP_VERSION, model.identity)
    assert state["prompt_tokens"] == PROMPT and state["prefill_chunk"] == 8
    assert state["sampler"]["settings"] == dataclasses.asdict(TOP_P)
    assert state["stop"] == {"max_tokens": 12, "eos_ids": [EOS], "stop_strings": ["zz"]}


@pytest.mark.parametrize("kwargs, field", [(dict(max_tokens=0), "max_tokens"), (dict(eos_ids=(-1,)), "eos_ids[0]"),
                                           (dict(stop_strings=("",)), "stop_strings[0]"),
                                           (dict(stop_strings="ab"), "stop_strings")])
def test_bad_stop_rules_are_a_field_error(kwargs, field):
    with pytest.raises(FieldError) as info:
        StopRules(**{"max_tokens": 5, **kwargs})
    assert info.value.field == field


@pytest.mark.parametrize("stop, field", [(dict(max_tokens=5, eos_ids=2), "app_state.stop.eos_ids"),
                                         (dict(max_tokens=5, stop_strings=None), "app_state.stop.stop_strings"),
                                         (dict(max_tokens="5"), "app_state.stop.max_tokens")],
                         ids=["eos_ids=int", "stop_strings=null", "max_tokens=str"])
def test_stop_rules_of_the_wrong_type_in_a_saved_app_state_are_a_format_error(stop, field):
    with pytest.raises(FormatError) as info:
        StopRules.from_json(stop, "app_state.stop")
    assert info.value.field == field

