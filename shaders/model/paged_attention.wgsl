// Causal grouped-query attention of one layer's forward over the paged cache, split over key ranges: each
// invocation writes partial softmax sums that attention_merge.wgsl combines (prefill chunks and decode alike).
//
// The host prepends three constants: QUADS = head_dim / 4 (head_dim a multiple of 8), GROUP = num_qo_heads /
// num_kv_heads, ROWS = query tokens per tile.
//
// Bindings (group 0):
//   0  uniform              Params
//   1  storage, read        qkv         f32 [num_tokens, num_qo_heads + 2 * num_kv_heads, head_dim] as vec4: Q
//                                       (already rotated) is the first num_qo_heads heads of each token
//   2  storage, read        pages       one layer of the cache, float16 [num_total_pages, 2, num_kv_heads, page_size,
//                                       head_dim] as vec4<u32> of eight halves (element 2w in the low half of word w)
//   3  storage, read        tokens      per token: vec4(position in its sequence, cache slot, offset of its
//                                       sequence's page table in page_table, unused)
//   4  storage, read        page_table  u32: the page tables of the forward's sequences, back to back
//   5  storage, read        tiles       per tile: vec2(first token, rows): up to ROWS consecutive tokens of one sequence
//   6  storage, read_write  partial     per (token, query head, split) a record of QUADS + 1 vec4: the unnormalised
//                                       weighted sum of V, then vec4(running maximum, sum of weights, 0, 0)
//
// The K/V of every token of the forward are in the pages already (rope.wgsl writes them first), so a token at
// position p attends to positions 0..p of its sequence, read through its page table. Split s covers key positions
// [s * keys_per_split, (s + 1) * keys_per_split); a token at position p has p / keys_per_split + 1 splits.
// Invocation i computes, for one (tile, KV head, split), all ROWS x GROUP (token, query head) rows of the tile
// that read that KV head: each K and V word is loaded once for all of them. Keys are visited in position order,
// with a running maximum and f32 sums; no atomics, no reductions across invocations, so the result is the same
// bits on every run. An invocation whose split starts past the tile's last position writes nothing.
//
// Loop budget: llvmpipe ends a shader invocation's loops after 65535 iterations of all its loops together, so
// the host bounds keys_per_split (see attention.py).

struct Params {
  num_tiles: u32,
  num_qo_heads: u32,
  num_kv_heads: u32,
  page_size: u32,
  keys_per_split: u32,
  num_splits: u32,
  scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> pages: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> tokens: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> page_table: array<u32>;
@group(0) @binding(5) var<storage, read> tiles: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> partial: array<vec4<f32>>;

const N: u32 = ROWS * GROUP;  // (row, head) pairs of an invocation: n = row * GROUP + head in group
const LOWEST: f32 = -3.4028234e38;

fn halves(w: vec2<u32>) -> vec4<f32> {
  return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

@compute @workgroup_size(256)
fn attend(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i >= params.num_tiles * params.num_kv_heads * params.num_splits) {
    return;
  }
  let split = i % params.num_splits;
  let kv_head = (i / params.num_splits) % params.num_kv_heads;
  let tile = tiles[i / (params.num_splits * params.num_kv_heads)];
  let first = tokens[tile.x];
  let key_begin = split * params.keys_per_split;
  let last_position = first.x + tile.y - 1u;
  if (key_begin > last_position) {
    return;
  }
  let key_end = min(key_begin + params.keys_per_split, last_position + 1u);
  let heads = params.num_qo_heads + 2u * params.num_kv_heads;
  var q: array<array<vec4<f32>, QUADS>, N>;
  var acc: array<array<vec4<f32>, QUADS>, N>;
  var running_max: array<f32, N>;
  var total: array<f32, N>;
  for (var n = 0u; n < N; n++) {
    let row = min(n / GROUP, tile.y - 1u);  // rows past the tile's end repeat its last one, unwritten
    let q_at = ((tile.x + row) * heads + kv_head * GROUP + n % GROUP) * QUADS;
    for (var c = 0u; c < QUADS; c++) {
      q[n][c] = qkv[q_at + c] * params.scale;
      acc[n][c] = vec4<f32>(0.0);
    }
    running_max[n] = LOWEST;
    total[n] = 0.0;
  }
  let row_quads = params.page_size * QUADS / 2u;  // one (kind, KV head) block of a page, in vec4<u32>
  let v_quads = params.num_kv_heads * row_quads;  // from a K row to its V row
  for (var key = key_begin; key < key_end; key++) {
    let page = page_table[first.z + key / params.page_size];
    let k_at = (page * 2u * params.num_kv_heads + kv_head) * row_quads + (key % params.page_size) * (QUADS / 2u);
    var score: array<f32, N>;
    for (var n = 0u; n < N; n++) {
      score[n] = 0.0;
    }
    for (var w = 0u; w < QUADS / 2u; w++) {
      let words = pages[k_at + w];
      let k0 = halves(words.xy);
      let k1 = halves(words.zw);
      for (var n = 0u; n < N; n++) {
        score[n] += dot(q[n][2u * w], k0) + dot(q[n][2u * w + 1u], k1);
      }
    }
    var rescale: array<f32, N>;
    var weight: array<f32, N>;
    for (var n = 0u; n < N; n++) {
      let live = key <= first.x + n / GROUP;  // causal: row r is at position first.x + r
      let new_max = select(running_max[n], max(running_max[n], score[n]), live);
      rescale[n] = exp(running_max[n] - new_max);
      weight[n] = select(0.0, exp(score[n] - new_max), live);
      total[n] = total[n] * rescale[n] + weight[n];
      running_max[n] = new_max;
    }
    for (var w = 0u; w < QUADS / 2u; w++) {
      let words = pages[k_at + v_quads + w];
      let v0 = halves(words.xy);
      let v1 = halves(words.zw);
      for (var n = 0u; n < N; n++) {
        acc[n][2u * w] = acc[n][2u * w] * rescale[n] + weight[n] * v0;
        acc[n][2u * w + 1u] = acc[n][2u * w + 1u] * rescale[n] + weight[n] * v1;
      }
    }
  }
  for (var n = 0u; n < N; n++) {
    let row = n / GROUP;
    if (row < tile.y && key_begin <= first.x + row) {
      let head = kv_head * GROUP + n % GROUP;
      let at = (((tile.x + row) * params.num_qo_heads + head) * params.num_splits + split) * (QUADS + 1u);
      for (var c = 0u; c < QUADS; c++) {
        partial[at + c] = acc[n][c];
      }
      partial[at + QUADS] = vec4<f32>(running_max[n], total[n], 0.0, 0.0);
    }
  }
}
