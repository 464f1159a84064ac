// Causal grouped-query attention of one layer's forward over the paged cache (prefill chunks and decode alike).
//
// Bindings (group 0):
//   0  uniform              Params
//   1  storage, read        qkv         f32 [num_tokens, num_qo_heads + 2 * num_kv_heads, head_dim]: Q (already
//                                       rotated) is the first num_qo_heads heads of each token
//   2  storage, read        pages       one layer of the cache, float16 [num_total_pages, 2, num_kv_heads, page_size,
//                                       head_dim] as u32 words of two halves (element 2w in the low half of word w)
//   3  storage, read        tokens      per token: vec4(position in its sequence, cache slot, offset of its
//                                       sequence's page table in page_table, unused)
//   4  storage, read        page_table  u32: the page tables of the forward's sequences, back to back
//   5  storage, read_write  out         f32 [num_tokens, num_qo_heads, head_dim]
//
// The K/V of every token of the forward are in the pages already (rope.wgsl writes them first), so a token at
// position p attends to positions 0..p of its sequence, all read through its page table: earlier chunks, the
// causal part of its own chunk, shared (forked) pages alike. Query head h reads KV head
// h / (num_qo_heads / num_kv_heads). Scores are scaled by `scale`; the softmax keeps a running maximum and f32
// sums. Invocation i computes one (token, query head) row, visiting keys in position order: no atomics, no
// reductions across invocations, so the result is the same bits on every run. head_dim is even, <= 2 * MAX_PAIRS.

struct Params {
  num_tokens: u32,
  num_qo_heads: u32,
  num_kv_heads: u32,
  head_dim: u32,
  page_size: u32,
  scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> pages: array<u32>;
@group(0) @binding(3) var<storage, read> tokens: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> page_table: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const MAX_PAIRS: u32 = 64u;
const LOWEST: f32 = -3.4028234e38;

@compute @workgroup_size(256)
fn attend(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i >= params.num_tokens * params.num_qo_heads) {
    return;
  }
  let head = i % params.num_qo_heads;
  let t = i / params.num_qo_heads;
  let kv_head = head / (params.num_qo_heads / params.num_kv_heads);
  let pairs = params.head_dim / 2u;
  let token = tokens[t];
  let q_base = (t * (params.num_qo_heads + 2u * params.num_kv_heads) + head) * params.head_dim;
  var q: array<vec2<f32>, MAX_PAIRS>;
  var acc: array<vec2<f32>, MAX_PAIRS>;
  for (var j = 0u; j < pairs; j++) {
    q[j] = vec2<f32>(qkv[q_base + 2u * j], qkv[q_base + 2u * j + 1u]);
    acc[j] = vec2<f32>(0.0);
  }
  let row_words = params.page_size * pairs;              // one (kind, kv head) block of a page, in words
  let v_words = params.num_kv_heads * row_words;         // from a K row to its V row
  var running_max = LOWEST;
  var total = 0.0;
  for (var key = 0u; key <= token.x; key++) {
    let page = page_table[token.z + key / params.page_size];
    let k_at = ((page * 2u) * params.num_kv_heads + kv_head) * row_words + (key % params.page_size) * pairs;
    var dot_qk = 0.0;
    for (var j = 0u; j < pairs; j++) {
      dot_qk += dot(q[j], unpack2x16float(pages[k_at + j]));
    }
    let score = dot_qk * params.scale;
    let new_max = max(running_max, score);
    let rescale = exp(running_max - new_max);
    let weight = exp(score - new_max);
    total = total * rescale + weight;
    for (var j = 0u; j < pairs; j++) {
      acc[j] = acc[j] * rescale + weight * unpack2x16float(pages[k_at + v_words + j]);
    }
    running_max = new_max;
  }
  let out_base = (t * params.num_qo_heads + head) * params.head_dim;
  for (var j = 0u; j < pairs; j++) {
    out[out_base + 2u * j] = acc[j].x / total;
    out[out_base + 2u * j + 1u] = acc[j].y / total;
  }
}
