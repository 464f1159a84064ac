// Causal grouped-query attention of one layer's forward over the paged cache, split over key ranges: each
// invocation writes partial softmax sums that attention_merge.wgsl combines (prefill chunks and decode alike).
//
// Specialised by kvckpt_web.specialize with QUADS = head_dim / 4 (head_dim a multiple of 8), WORDS = QUADS / 2,
// GROUP = num_qo_heads / num_kv_heads, ROWS = query tokens per tile and N = ROWS * GROUP: lines tagged
// "each n < N" are repeated per row n, so Q, the sums and the K/V words of a key live in registers; WG is the
// workgroup size (small: lavapipe gives each workgroup to one thread, and a forward has few invocations). With
// DIRECT = 1 (a forward whose keys form one range) binding 6 is the output itself (see attention_merge.wgsl):
// each row is written finished, acc / total, the bits the merge of a single split gives, and no merge runs.
//
// Bindings (group 0):
//   0  uniform              Params
//   1  storage, read        qkv         f32 [num_tokens, num_qo_heads + 2 * num_kv_heads, head_dim] as vec4: Q
//                                       (already rotated) is the first num_qo_heads heads of each token
//   2  storage, read        pages       one layer of the cache, float16 [num_total_pages, 2, num_kv_heads, page_size,
//                                       head_dim] as vec4<u32> of eight halves (element 2w in the low half of word w)
//   3  storage, read        tokens      per token: vec4(position in its sequence, cache slot, offset of its
//                                       sequence's page table in page_table, its sequence's keys per split)
//   4  storage, read        page_table  u32: the page tables of the forward's sequences, back to back
//   5  storage, read        tiles       per tile: vec2(first token, rows): up to ROWS consecutive tokens of one
//                                       sequence
//   6  storage, read_write  partial     per (token, query head, split) a record of QUADS + 1 vec4: the unnormalised
//                                       weighted sum of V, then vec4(running maximum, sum of weights, 0, 0);
//      with DIRECT = 1: storage texture, write  out  the output as attention_merge.wgsl writes it
//
// The K/V of every token of the forward are in the pages already (rope.wgsl writes them first), so a token at
// position p attends to positions 0..p of its sequence, read through its page table; in a sliding-window layer
// only to those of p - window + 1..p (the pages keep every key; older ones are masked, and skipped by the loop
// where the whole tile's window begins later). Split s covers key positions
// [s * keys_per_split, (s + 1) * keys_per_split), keys_per_split its sequence's (chosen from that sequence alone,
// so a row's sums are the same whatever else the forward runs); a token at position p has p / keys_per_split + 1
// splits, num_splits the most any token has.
// Invocation i computes, for one (tile, KV head, split), all ROWS x GROUP (token, query head) rows of the tile
// that read that KV head: each K and V word is loaded once for all of them. Keys are visited in position order,
// with a running maximum and f32 sums; no atomics, no reductions across invocations, so the result is the same
// bits on every run. An invocation whose split starts past the tile's last position writes nothing.
//
// Loop budget: llvmpipe ends a shader invocation's loops after 65535 iterations of all its loops together; the
// key loop is the only loop, and the host keeps keys_per_split below that (see attention.py).

struct Params {
  num_tiles: u32,
  num_qo_heads: u32,
  num_kv_heads: u32,
  page_size: u32,
  unused: u32,
  num_splits: u32,
  scale: f32,
  window: u32,  // keys a query sees at most, itself included (a sliding-window layer), else 0xffffffff
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> pages: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> tokens: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> page_table: array<u32>;
@group(0) @binding(5) var<storage, read> tiles: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> partial: array<vec4<f32>>;  // unless DIRECT
@group(0) @binding(6) var out: texture_storage_2d<rgba32uint, write>;  // if DIRECT

const LOWEST: f32 = -3.4028234e38;

fn halves(w: vec2<u32>) -> vec4<f32> {
  return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// Store vec4 k of a row's record (split partial sums) or, with DIRECT = 1, of its finished output (at is the row).
fn put(at: u32, token: u32, head: u32, k: u32, v: vec4<f32>) { partial[at + k] = v; }  // unless DIRECT
fn put(at: u32, token: u32, head: u32, k: u32, v: vec4<f32>) { textureStore(out, vec2<u32>(head * QUADS + k, token), bitcast<vec4<u32>>(v)); }  // if DIRECT

// What a row's V sum a is stored as: itself, or with DIRECT = 1 the finished a / total.
fn finish(a: vec4<f32>, total: f32) -> vec4<f32> {
  if (DIRECT == 1u) {
    return a / total;
  }
  return a;
}

@compute @workgroup_size(WG)
fn attend(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= params.num_tiles * params.num_kv_heads * params.num_splits) {
    return;
  }
  let split = i % params.num_splits;
  let kv_head = (i / params.num_splits) % params.num_kv_heads;
  let tile = tiles[i / (params.num_splits * params.num_kv_heads)];
  let first = tokens[tile.x];
  let keys_per_split = first.w;
  let key_begin = split * keys_per_split;
  let last_position = first.x + tile.y - 1u;
  if (key_begin > last_position) {
    return;
  }
  let key_end = min(key_begin + keys_per_split, last_position + 1u);
  // the first key any row of the tile sees (rows past the window's start are masked below)
  let key_start = max(key_begin, first.x - min(first.x, params.window - 1u));
  let heads = params.num_qo_heads + 2u * params.num_kv_heads;
  // Row n of the invocation: token tile.x + n / GROUP (rows past the tile's end repeat its last one, unwritten),
  // query head kv_head * GROUP + n % GROUP. Its Q (scaled) and V sum are WORDS pairs of vec4, the lo and hi halves
  // of the WORDS vec4<u32> words of a K/V row.
  let q_token{n} = tile.x + min({n}u / GROUP, tile.y - 1u);  // each n < N
  let q_at{n} = (q_token{n} * heads + kv_head * GROUP + {n}u % GROUP) * QUADS;  // each n < N
  let q{n}_{w}_lo = qkv[q_at{n} + 2u * {w}u] * params.scale;  // each n < N, w < WORDS
  let q{n}_{w}_hi = qkv[q_at{n} + 2u * {w}u + 1u] * params.scale;  // each n < N, w < WORDS
  var acc{n}_{w}_lo = vec4<f32>(0.0);  // each n < N, w < WORDS
  var acc{n}_{w}_hi = vec4<f32>(0.0);  // each n < N, w < WORDS
  var running_max{n} = LOWEST;  // each n < N
  var total{n} = 0.0;  // each n < N
  let row_words = params.page_size * WORDS;  // one (kind, KV head) block of a page, in vec4<u32>
  let v_words = params.num_kv_heads * row_words;  // from a K row to its V row
  for (var key = key_start; key < key_end; key++) {
    let page = page_table[first.z + key / params.page_size];
    let k_at = (page * 2u * params.num_kv_heads + kv_head) * row_words + (key % params.page_size) * WORDS;
    let k_word{w} = pages[k_at + {w}u];  // each w < WORDS
    let k{w}_lo = halves(k_word{w}.xy);  // each w < WORDS
    let k{w}_hi = halves(k_word{w}.zw);  // each w < WORDS
    var score{n} = 0.0;  // each n < N
    score{n} += dot(q{n}_{w}_lo, k{w}_lo) + dot(q{n}_{w}_hi, k{w}_hi);  // each n < N, w < WORDS
    let live{n} = key <= first.x + {n}u / GROUP && first.x + {n}u / GROUP - key < params.window;  // each n < N
    let new_max{n} = select(running_max{n}, max(running_max{n}, score{n}), live{n});  // each n < N
    let rescale{n} = exp(running_max{n} - new_max{n});  // each n < N
    let weight{n} = select(0.0, exp(score{n} - new_max{n}), live{n});  // each n < N
    total{n} = total{n} * rescale{n} + weight{n};  // each n < N
    running_max{n} = new_max{n};  // each n < N
    let v_word{w} = pages[k_at + v_words + {w}u];  // each w < WORDS
    let v{w}_lo = halves(v_word{w}.xy);  // each w < WORDS
    let v{w}_hi = halves(v_word{w}.zw);  // each w < WORDS
    acc{n}_{w}_lo = acc{n}_{w}_lo * rescale{n} + weight{n} * v{w}_lo;  // each n < N, w < WORDS
    acc{n}_{w}_hi = acc{n}_{w}_hi * rescale{n} + weight{n} * v{w}_hi;  // each n < N, w < WORDS
  }
  let written{n} = {n}u / GROUP < tile.y && key_begin <= first.x + {n}u / GROUP;  // each n < N
  let out_row{n} = (tile.x + {n}u / GROUP) * params.num_qo_heads + kv_head * GROUP + {n}u % GROUP;  // each n < N
  let token{n} = tile.x + {n}u / GROUP;  // each n < N
  let head{n} = kv_head * GROUP + {n}u % GROUP;  // each n < N
  let at{n} = (out_row{n} * params.num_splits + split) * (QUADS + 1u);  // each n < N
  if (written{n}) { put(at{n}, token{n}, head{n}, 2u * {w}u, finish(acc{n}_{w}_lo, total{n})); }  // each n < N, w < WORDS
  if (written{n}) { put(at{n}, token{n}, head{n}, 2u * {w}u + 1u, finish(acc{n}_{w}_hi, total{n})); }  // each n < N, w < WORDS
  if (written{n} && DIRECT == 0u) { put(at{n}, token{n}, head{n}, QUADS, vec4<f32>(running_max{n}, total{n}, 0.0, 0.0)); }  // each n < N
}
