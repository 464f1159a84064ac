"""Cutting a reply where the browser tests and the browser benchmark choose, never after a sleep: a page script that
runs the engine's worker as ``held_worker.mjs`` (the shipped ``engine-worker.mjs`` with a hold its driver sets; no
page of the package loads it), and gives the page ``window.kvckptHold``: ``hold(tokens)`` holds the next reply once
it holds ``tokens`` tokens (0: before its prefill; its autosaves until then done), ``release()`` lets it go on,
``held`` is ``{conversation, tokens}`` once it holds (null from ``hold`` until then). A held reply stays held until
released or its worker is terminated (a crash, a killed browser, a reload); a cancelled stream stops without waiting
for it."""

from __future__ import annotations

import json
from pathlib import Path

HELD_WORKER = (Path(__file__).resolve().parent / "held_worker.mjs").read_text()


def _hold_replies() -> str:
    """The page script of :data:`HOLD_REPLIES`, with :data:`HELD_WORKER` in it."""
    return """(() => {
  const source = WORKER_SOURCE;
  const workers = [];
  window.kvckptHold = {
    held: null,
    hold(tokens) {
      this.held = null;
      for (const worker of workers) worker.postMessage({ kvckptHold: "hold", tokens });
    },
    release() { for (const worker of workers) worker.postMessage({ kvckptHold: "release" }); },
  };
  window.Worker = class extends window.Worker {
    constructor(url, options) {
      const href = new URL(url, location.href).href;
      if (!href.endsWith("/engine-worker.mjs")) {
        super(url, options);
        return;
      }
      const module = source.replace('"./engine-worker.mjs"', JSON.stringify(href));
      super(URL.createObjectURL(new Blob([module], { type: "text/javascript" })), options);
      workers.push(this);
      this.addEventListener("message", (e) => {   // before the engine's own handler, which never sees it
        if (e.data?.kvckptHold !== "held") return;
        e.stopImmediatePropagation();
        window.kvckptHold.held = { conversation: e.data.conversation, tokens: e.data.tokens };
      });
    }
  };
})();""".replace("WORKER_SOURCE", json.dumps(HELD_WORKER))


HOLD_REPLIES = _hold_replies()
"""Page script (``page.add_init_script``): the page's engine workers hold replies where ``window.kvckptHold`` says."""
