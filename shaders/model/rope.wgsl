// RoPE and K/V write of one layer's forward: rotate Q in place, rotate K and write K and V into the cache pages.
//
// Bindings (group 0):
//   0  uniform              Params
//   1  storage, read_write  qkv       f32 [num_tokens, num_qo_heads + 2 * num_kv_heads, head_dim]: per token its
//                                     Q heads, then K heads, then V heads. Q is rotated in place; K and V are read.
//   2  storage, read_write  pages     one layer of the cache, float16 [num_total_pages, 2, num_kv_heads, page_size,
//                                     head_dim] as u32 words of two halves (element 2w in the low half of word w)
//   3  storage, read        tokens    per token: vec4(position in its sequence, cache slot = page_id * page_size
//                                     + slot in page, offset of its sequence's page table, unused)
//   4  storage, read        inv_freq  f32: per layer head_dim / 2 rates, rotary_scale / rotary_theta^(2i / head_dim)
//                                     (each divided by a frequency factor where the model has them); this layer's
//                                     from rates_at
//
// RoPE is TVM's rope_mode "normal" (rotate-half, as Hugging Face llama): for i < head_dim / 2 and angle
// a = position * inv_freq[i], x'[i] = x[i] cos a - x[i + half] sin a and x'[i + half] = x[i + half] cos a + x[i] sin a.
// The angle is reduced to [-pi, pi] before cos and sin (WGSL bounds their error only there).
// Invocation i handles one (token, head, j < head_dim / 2): for a Q head the pair (j, j + half) in place; for a K or
// V head the output word j (elements 2j and 2j + 1), packed with pack2x16float. head_dim is even.

struct Params {
  num_tokens: u32,
  num_qo_heads: u32,
  num_kv_heads: u32,
  head_dim: u32,
  page_size: u32,
  rates_at: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> pages: array<u32>;
@group(0) @binding(3) var<storage, read> tokens: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> inv_freq: array<f32>;

// 2 pi as 6.28125 (exact with few bits, so k * TWO_PI_HI is exact for |k| < 2^16) plus the rest.
const TWO_PI_HI: f32 = 6.28125;
const TWO_PI_LO: f32 = 0.0019353071795864769;
const INV_TWO_PI: f32 = 0.15915494309189535;

// (cos a, sin a) for a = position * inv_freq[i].
fn rotation(position: u32, i: u32) -> vec2<f32> {
  let a = f32(position) * inv_freq[params.rates_at + i];
  let k = round(a * INV_TWO_PI);
  let r = (a - k * TWO_PI_HI) - k * TWO_PI_LO;
  return vec2<f32>(cos(r), sin(r));
}

// Element d of K head row `base` (in qkv), rotated.
fn rotated(base: u32, d: u32, position: u32) -> f32 {
  let half = params.head_dim / 2u;
  let i = d % half;
  let cs = rotation(position, i);
  var other = qkv[base + d - half];
  if (d < half) {
    other = -qkv[base + d + half];
  }
  return qkv[base + d] * cs.x + other * cs.y;
}

@compute @workgroup_size(256)
fn rope_append(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  let half = params.head_dim / 2u;
  let heads = params.num_qo_heads + 2u * params.num_kv_heads;
  if (i >= params.num_tokens * heads * half) {
    return;
  }
  let j = i % half;
  let head = (i / half) % heads;
  let t = i / (half * heads);
  let token = tokens[t];
  let base = (t * heads + head) * params.head_dim;
  if (head < params.num_qo_heads) {
    let cs = rotation(token.x, j);
    let x0 = qkv[base + j];
    let x1 = qkv[base + j + half];
    qkv[base + j] = x0 * cs.x - x1 * cs.y;
    qkv[base + j + half] = x1 * cs.x + x0 * cs.y;
    return;
  }
  var which = 0u;  // 0 = K, 1 = V
  var kv_head = head - params.num_qo_heads;
  if (kv_head >= params.num_kv_heads) {
    which = 1u;
    kv_head -= params.num_kv_heads;
  }
  var pair = vec2<f32>(qkv[base + 2u * j], qkv[base + 2u * j + 1u]);
  if (which == 0u) {
    pair = vec2<f32>(rotated(base, 2u * j, token.x), rotated(base, 2u * j + 1u, token.x));
  }
  let page = token.y / params.page_size;
  let slot = token.y % params.page_size;
  let row = ((page * 2u + which) * params.num_kv_heads + kv_head) * params.page_size + slot;
  pages[row * half + j] = pack2x16float(pair);
}
