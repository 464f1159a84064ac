"""`kvckpt bench chat` runs end to end on the tiny random llama GGUF (a short history; nothing here is timed)."""

from __future__ import annotations

import asyncio

from kvckpt_web.bench.chat import TITLES, bench_chat


def test_bench_chat_times_the_next_turn_from_the_cache_the_store_and_a_re_prefill(device, tiny_llama_path):
    lines: list[str] = []
    rows = asyncio.run(bench_chat(device, repeats=2, echo=lines.append, model=tiny_llama_path, history_tokens=120))
    by_path = {row.path: row for row in rows}
    assert list(by_path) == ["cache", "store", "prefill"]
    assert all(len(row.seconds) == len(row.ratios) == len(row.loads) == 2 for row in rows)
    history = by_path["cache"].cached[0]
    assert history >= 120 and set(by_path["cache"].cached) == set(by_path["store"].cached) == {history}
    assert by_path["prefill"].cached == [0, 0]  # cache_prompt=False: every token prefilled
    assert by_path["prefill"].prefilled[0] == history + by_path["cache"].prefilled[0]
    assert [line for line in lines if line.startswith("| history")] == [row.format(by_path["prefill"])
                                                                        for row in rows]
    assert [line.split(" | ")[0][2:] for line in lines if line.startswith("| history")] == list(TITLES.values())
    assert lines[-1].startswith("\nstore hit vs re-prefill of the ") and "(target >= 20x on lavapipe: " in lines[-1]
