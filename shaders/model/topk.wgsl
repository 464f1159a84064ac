// Top-k over a vector of f32 (the logits), on the GPU, so the host reads back k (value, index) pairs.
//
// Order: larger values first; among equal values the lower index first (so k = 1 is argmax, lowest index
// winning ties): a total order, so the result depends neither on scheduling nor on the order of the offers.
// Two passes with the same insertion rule:
//   chunk_topk: invocation c keeps the top k of values[c * chunk .. (c + 1) * chunk) (scanned in index order; value
//               i is values[first + i]: one row of a buffer of several)
//               and writes them to candidates[c * k ..], best first (slots past the chunk's size: index
//               0xffffffff, which marks an empty slot; merge_topk skips them)
//   merge_topk: one invocation offers all candidates and writes the top k to `best`
// Bindings (group 0), candidates being (chunks * k) vec2<u32>: (bitcast<u32>(value), index):
//   chunk_topk: 0 uniform Params, 1 storage read values (n) f32,  2 storage read_write candidates
//   merge_topk: 0 uniform Params, 1 storage read candidates,      2 storage read_write best (k) vec2<u32>
// k is at most K_MAX.

struct Params {
  n: u32,
  k: u32,
  chunk: u32,
  chunks: u32,
  first: u32,
}

const K_MAX: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> values: array<f32>;
@group(0) @binding(2) var<storage, read_write> candidates: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read> offered: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> best: array<vec2<u32>>;

const EMPTY: u32 = 0xffffffffu;  // index of a slot that holds no value yet

var<private> top_value: array<f32, K_MAX>;
var<private> top_index: array<u32, K_MAX>;

fn clear_top() {
  for (var j = 0u; j < params.k; j = j + 1u) {
    top_value[j] = 0.0;
    top_index[j] = EMPTY;
  }
}

// Whether (v, i) ranks before what slot j holds (any value ranks before an empty slot).
fn before(v: f32, i: u32, j: u32) -> bool {
  return top_index[j] == EMPTY || v > top_value[j] || (v == top_value[j] && i < top_index[j]);
}

// Insert (v, i) where it ranks among the kept pairs (dropping the last) if it ranks before the last one.
fn offer(v: f32, i: u32) {
  let last = params.k - 1u;
  if (i == EMPTY || !before(v, i, last)) {
    return;
  }
  var j = last;
  while (j > 0u && before(v, i, j - 1u)) {
    top_value[j] = top_value[j - 1u];
    top_index[j] = top_index[j - 1u];
    j = j - 1u;
  }
  top_value[j] = v;
  top_index[j] = i;
}

@compute @workgroup_size(64)
fn chunk_topk(@builtin(global_invocation_id) gid: vec3<u32>) {
  let c = gid.x;
  if (c >= params.chunks) {
    return;
  }
  clear_top();
  let end = min(params.n, (c + 1u) * params.chunk);
  for (var i = c * params.chunk; i < end; i = i + 1u) {
    offer(values[params.first + i], i);
  }
  for (var j = 0u; j < params.k; j = j + 1u) {
    candidates[c * params.k + j] = vec2<u32>(bitcast<u32>(top_value[j]), top_index[j]);
  }
}

@compute @workgroup_size(1)
fn merge_topk() {
  clear_top();
  for (var i = 0u; i < params.chunks * params.k; i = i + 1u) {
    let candidate = offered[i];
    offer(bitcast<f32>(candidate.x), candidate.y);
  }
  for (var j = 0u; j < params.k; j = j + 1u) {
    best[j] = vec2<u32>(bitcast<u32>(top_value[j]), top_index[j]);
  }
}
