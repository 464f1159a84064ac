// The engine's worker as the browser tests and benchmark run it: engine-worker.mjs (imported, it runs the engine
// here) holding a reply where their driver chose. The page's Worker is replaced by holding.py's HOLD_REPLIES, which
// starts this module (from a blob, the import below made absolute) wherever the page starts engine-worker.mjs, and
// drives it with {kvckptHold: "hold", tokens} (the next reply holds once it holds `tokens` tokens: 0, before its
// prefill; its autosaves until then done) and {kvckptHold: "release"}; it answers {kvckptHold: "held", conversation,
// tokens}.
import { engineWorker } from "./engine-worker.mjs";

let holdAt = null;    // the next reply holds once it holds this many tokens
let release = null;   // ends the hold in place

engineWorker.beforeChunk = ({ conversation, tokens }) => {
  if (holdAt === null || tokens < holdAt) return null;
  holdAt = null;
  self.postMessage({ kvckptHold: "held", conversation, tokens });
  return new Promise((resolve) => { release = resolve; });
};

const serve = self.onmessage;
self.onmessage = (message) => {
  const { kvckptHold, tokens } = message.data;
  if (kvckptHold === undefined) return serve(message);
  if (kvckptHold === "hold") {
    holdAt = tokens;
  } else {
    holdAt = null;
    release?.();
    release = null;
  }
  return null;
};
