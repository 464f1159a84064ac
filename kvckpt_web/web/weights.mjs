// Model weights kept in the browser, so that a reload or a crash does not download the model again.
//
// A file fetched once is kept in the Cache API (cache "kvckpt-weights") under its URL, with the validators the server
// gave for it: ETag, Last-Modified and Content-Length. On the next load a HEAD request asks the server for them:
// the same, and the kept copy is read (no download); any of them different (the file changed at that URL), and the
// file is fetched anew and kept in place of the old copy. A server that gives neither an ETag nor a Last-Modified
// cannot be checked: its file is fetched each time and not kept. A server that cannot be reached (offline) gives the
// kept copy, and the result says so.

export const WEIGHTS_CACHE = "kvckpt-weights";
const VALIDATORS = ["etag", "last-modified", "content-length"];

const validatorsOf = (headers) => Object.fromEntries(VALIDATORS.map((k) => [k, headers.get(k)]));
const checkable = (v) => Boolean(v.etag || v["last-modified"]);
const same = (a, b) => VALIDATORS.every((k) => a[k] === b[k]);

function unavailable(url, got) {
  const error = new Error(`model: expected the file at ${url}, got ${got}`);
  return Object.assign(error, { name: "ModelUnavailableError", field: "model", expected: url, got });
}

// The body of `response` as bytes, reporting progress(done, total) about every MiB; an Error if fewer bytes arrive
// than its Content-Length says.
async function readBody(response, url, progress) {
  const total = Number(response.headers.get("content-length")) || 0;
  const parts = [];
  let done = 0, told = 0;
  const reader = response.body.getReader();
  for (;;) {
    const { done: end, value } = await reader.read();
    if (end) break;
    parts.push(value);
    done += value.length;
    if (done - told >= 1 << 20) { told = done; progress(done, total); }
  }
  if (total && done !== total) throw unavailable(url, `${done} of its ${total} bytes`);
  progress(done, done);
  if (parts.length === 1) return parts[0];
  const bytes = new Uint8Array(done);
  let at = 0;
  for (const part of parts) { bytes.set(part, at); at += part.length; }
  return bytes;
}

async function openCache(name) {
  try { return globalThis.caches ? await caches.open(name) : null; } catch { return null; }
}

// Whether a copy of the model file at `url` (resolved against this module's location) is kept in this browser, to be
// read instead of downloaded if the server still gives the same validators for it (checked when it is loaded).
export async function keptWeights(url, { cacheName = WEIGHTS_CACHE } = {}) {
  const cache = await openCache(cacheName);
  return cache !== null && (await cache.match(new URL(url, import.meta.url).href)) !== undefined;
}

// The bytes of the model file at `url` (resolved against this module's location): {bytes, source: "cache" |
// "network", kept (whether a copy is kept for next time), note (why not, or why a kept copy was used unchecked)}.
// progress({source, done, total}) hears of the bytes read. Rejects with an Error named "ModelUnavailableError"
// (field "model", expected the URL, got what the server answered) when there is no file to load.
export async function loadWeights(url, { progress = () => {}, cacheName = WEIGHTS_CACHE } = {}) {
  const href = new URL(url, import.meta.url).href;
  let head = null, offline = null;
  try {
    head = await fetch(href, { method: "HEAD", cache: "no-store" });
  } catch (error) {
    offline = error;
  }
  if (head && !head.ok) throw unavailable(href, `HTTP ${head.status}`);
  const cache = await openCache(cacheName);
  const kept = cache ? await cache.match(href) : undefined;
  if (kept && (offline || (checkable(validatorsOf(head.headers)) &&
                           same(validatorsOf(head.headers), validatorsOf(kept.headers))))) {
    const bytes = await readBody(kept, href, (done, total) => progress({ source: "cache", done, total }));
    const note = offline ? `the server could not be reached (${offline.message}): the kept copy is used unchecked` : "";
    return { bytes, source: "cache", kept: true, note };
  }
  if (offline) throw unavailable(href, `no answer (${offline.message})`);
  const response = await fetch(href, { cache: "no-store" });
  if (!response.ok) throw unavailable(href, `HTTP ${response.status}`);
  const validators = validatorsOf(response.headers);
  const bytes = await readBody(response, href, (done, total) => progress({ source: "network", done, total }));
  let note = "";
  if (!checkable(validators)) {
    note = "the server gives no ETag or Last-Modified to check a kept copy against: not kept";
  } else if (!cache) {
    note = "no Cache API here: not kept";
  } else {
    const headers = Object.fromEntries(Object.entries(validators).filter(([, v]) => v !== null));
    try {
      const kept = new Response(bytes, { headers: { ...headers, "content-type": "application/octet-stream" } });
      await cache.put(href, kept);
    } catch (error) {
      note = `not kept (${error.name}: ${error.message})`;
    }
  }
  return { bytes, source: "network", kept: note === "", note };
}
