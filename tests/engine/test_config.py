"""An engine's settings: one checked EngineConfig, its presets, and what an engine runs with. (The prefill chunk a
resume relies on, saved with every reply, is in test_engine_reports.py.)"""

from __future__ import annotations

import pytest

from kvckpt_web.engine import PRESETS, Engine, EngineConfig
from kvckpt_web.errors import FieldError
from kvckpt_web.model.protocol import LoadedModel

from lm_double import DoubleLM, DoubleText


def refused(**fields) -> FieldError:
    with pytest.raises(FieldError) as caught:
        EngineConfig(**fields)
    return caught.value


def test_the_context_must_be_an_integer_of_at_least_two_tokens():
    error = refused(context=1)
    assert (error.field, error.expected, error.got) == ("context", "an integer >= 2", 1)


@pytest.mark.parametrize("field", ["sequences", "page_size", "prefill_chunk", "autosave_every", "keep",
                                   "chunk_tokens"])
def test_each_count_must_be_an_integer_of_at_least_one(field):
    error = refused(**{field: 0})
    assert (error.field, error.expected, error.got) == (field, "an integer >= 1", 0)


def test_a_bool_or_a_text_is_no_count():
    assert refused(sequences=True).got == "bool"
    assert refused(prefill_chunk="64").got == "str"


def test_the_cache_must_hold_at_least_one_whole_context():
    error = refused(context=512, cache_tokens=511)
    assert (error.field, error.expected, error.got) == ("cache_tokens", "an integer >= 512", 511)


def test_a_config_is_frozen():
    with pytest.raises(AttributeError):
        EngineConfig().context = 8  # type: ignore[misc]


def test_replace_changes_the_fields_given_keeps_those_given_none_and_checks_again():
    config = PRESETS["desktop"].replace(context=1024, autosave_every=None)
    assert (config.context, config.autosave_every) == (1024, PRESETS["desktop"].autosave_every)
    with pytest.raises(FieldError, match="prefill_chunk"):
        config.replace(prefill_chunk=0)


def test_replace_refuses_a_setting_there_is_none_of():
    with pytest.raises(FieldError) as caught:
        EngineConfig().replace(prefill=64)
    assert (caught.value.field, caught.value.got) == ("prefill", "an unknown setting")


def test_a_preset_is_had_by_its_name_and_an_unknown_name_is_refused():
    assert EngineConfig.preset("browser") is PRESETS["browser"]
    with pytest.raises(FieldError) as caught:
        EngineConfig.preset("laptop")
    assert (caught.value.field, caught.value.expected) == ("preset", "one of ['browser', 'desktop']")


def test_the_desktop_preset_is_what_a_config_is_unless_told():
    assert PRESETS["desktop"] == EngineConfig()


def test_an_engine_runs_with_its_config_fitted_to_the_model(make_engine):
    engine = make_engine(context=4096, cache_tokens=None)  # the double's context is 1024
    assert engine.config.context == engine.context == 1024
    assert engine.config.cache_tokens == engine.cache.limits.max_total_seq_len == 2048
    assert engine.cache.limits.prefill_chunk_size == engine.config.prefill_chunk
    assert engine.cache.layout.page_size == engine.config.page_size


def test_an_engine_refuses_settings_that_are_no_config(device):
    with pytest.raises(FieldError) as caught:
        Engine(LoadedModel(DoubleLM(max_context=1024), DoubleText()), device, config={"context": 512})
    assert (caught.value.field, caught.value.got) == ("config", "dict")
