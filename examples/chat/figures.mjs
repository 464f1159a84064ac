// The page's figures: sizes and times as people read them, the prefill rate this device has shown, and the lines
// that report a reply, a restore and the reload's timeline. Every figure comes from work that has finished: the
// engine's usage (timed once the GPU had run), chunks as they arrived (each one's token was read back), or a
// measurement asked for.

export const kib = (n) => (n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : `${(n / 1024).toFixed(0)} KiB`);
export const ms = (x) => (x >= 10000 ? `${(x / 1000).toFixed(1)} s` : `${x.toFixed(0)} ms`);
const rate = (x) => (x >= 10 ? x.toFixed(0) : x.toFixed(2));

const PREFILL_KEY = (identity) => `kvckpt-chat:prefill:${identity}`;
const LEAST_PREFILL = 8;   // fewer prefilled tokens say little about the rate

// The prefill rate (tokens/s) this device has shown for the model `identity`: its latest prefill of some length
// (kept in localStorage), or null before any.
export function shownPrefillRate(identity) {
  const seen = JSON.parse(localStorage.getItem(PREFILL_KEY(identity)) ?? "null");
  return seen && seen.seconds > 0 ? seen.tokens / seen.seconds : null;
}

// Remember a prefill of `tokens` that took `seconds` as the rate this device shows.
export function notePrefill(identity, tokens, seconds) {
  if (tokens < LEAST_PREFILL || !(seconds > 0)) return;
  localStorage.setItem(PREFILL_KEY(identity), JSON.stringify({ tokens, seconds }));
}

// What a finished reply cost, prefill and decode apart: the engine's usage of the call.
export function replyLine(usage) {
  const t = usage.timings;
  const cached = usage.prompt_tokens_details.cached_tokens;
  const parts = [`prompt ${usage.prompt_tokens} tokens (${cached} from the cache or the store`];
  if (t.restore_s > 0) parts[0] += `, read in ${ms(t.restore_s * 1e3)}`;
  parts[0] += ")";
  const prefilled = usage.prompt_tokens - cached;
  if (prefilled > 0 && usage.completion_tokens === 0) {
    parts.push(`stopped before the first token, during the prefill of ${prefilled} tokens`);
  } else if (prefilled > 0) {
    parts.push(`prefill ${prefilled} tokens in ${ms(t.prefill_s * 1e3)}` +
               (t.prefill_tokens_per_s ? `: ${rate(t.prefill_tokens_per_s)} tokens/s` : ""));
  }
  parts.push(`reply ${usage.completion_tokens} tokens` + (t.decode_tokens_per_s
    ? `, decode ${rate(t.decode_tokens_per_s)} tokens/s` : ""));
  return parts.join(" · ");
}

// Decode speed while a reply streams: tokens after the first over the time since it arrived.
export function liveLine(tokens, firstAt, lastAt) {
  const per = tokens > 1 && lastAt > firstAt ? (tokens - 1) / ((lastAt - firstAt) / 1000) : null;
  return `${tokens} tokens` + (per ? ` · decode ${rate(per)} tokens/s` : "");
}

// How a resumed reply's K/V came back, and what re-running them would cost on this device: estimated from the prefill
// rate it has shown (saying so), or measured when asked (`measured`: {tokens, ms}).
export function restoredLine(restored, identity, measured = null) {
  const how = restored.kv_restored
    ? `restored ${restored.tokens} tokens of K/V in ${ms(restored.restore_ms)} (generation ${restored.generation})`
    : `the checkpoint's K/V could not be used (${restored.reason}: ${restored.message}); its ${restored.tokens} ` +
      `tokens were run again in ${ms(restored.replay_ms)}`;
  if (!restored.kv_restored) return how;
  if (measured) {
    return `${how} · a re-prefill of the same ${measured.tokens} tokens took ${ms(measured.ms)} here, measured now: ` +
           `${(measured.ms / Math.max(restored.restore_ms, 1)).toFixed(0)}x the restore`;
  }
  const perS = shownPrefillRate(identity);
  if (perS === null) return `${how} · this device has not shown a prefill rate yet to compare with`;
  const estimate = (restored.tokens / perS) * 1e3;
  return `${how} · a re-prefill would take about ${ms(estimate)} at the ${rate(perS)} tokens/s prefill this device ` +
         `has shown (an estimate): ${(estimate / Math.max(restored.restore_ms, 1)).toFixed(0)}x the restore`;
}

// The reload's way to the first resumed token, stage by stage (each {label, ms}), and the whole.
export function timelineLine(timeline) {
  const parts = timeline.stages.map(({ label, ms: t }) => `${label} ${ms(t)}`);
  return `reload to the first resumed token: ${ms(timeline.total_ms)} (${parts.join(" · ")})`;
}
