// Quantized weight kernels: matrix-vector products (one per token) and row lookups over Q4_1 / Q8_0 weights.
//
// A weight matrix of `rows` x (blocks * 32) is held as two textures (kvckpt_web.model.weights):
//   scales  r32uint     texel i = r * blocks + b: Q4_1 pack2x16float(d, m); Q8_0 pack2x16float(d, 0)
//   quants  rgba32uint  Q4_1: texel i = r * blocks + b, 16 bytes of nibbles as in GGUF (byte j: weight j in
//                       the low nibble, weight 16 + j in the high one); Q8_0: texels 2i and 2i + 1, 32 int8
// Texel i of a texture 2^shift texels wide lies at (i & (2^shift - 1), i >> shift). Weights:
//   Q4_1 w = d * q + m (q in 0..15), Q8_0 w = d * q (q in -128..127).
//
// Bindings (group 0), matrix-vector entries (q4_1_matvec, q8_0_matvec, q4_1_gated):
//   0  uniform              Params
//   1  texture_2d<u32>      scales
//   2  texture_2d<u32>      quants
//   3  uniform              x       a 64 KiB window of the activations, its token t at vec4 t * x_stride
//   4  storage, read_write  y       y[T * rows + r] = (accumulate ? y[T * rows + r] : 0) + (W x_t)[r],
//                                   T = token_base + t (y is not windowed)
//   5  texture_2d<u32>      scales of the up matrix (q4_1_gated: y = silu(W x) * (U x), W the gate)
//   6  texture_2d<u32>      quants of the up matrix
// Invocation gid.x computes rows ROWS * gid.x .. + ROWS - 1 of token workgroup_id.y; each row's sum runs over
// the blocks in order, each block's as d * dot(q, x) + m * sum(x) (Q4_1) or d * dot(q, x) (Q8_0), with
// dot products of vec4s in a fixed order: the same inputs give the same bits.
// Row lookup (q8_0_rows, the token embedding): bindings 0-2 as above, then
//   3  storage, read        ids     token ids
//   4  storage, read_write  out     out[t * blocks * 32 + k] = row ids[t] of the matrix, dequantized
// one invocation per (token, block, word of 4 weights), on a 2-D grid of 256-invocation workgroups.

struct Params {
  rows: u32,
  blocks: u32,         // 32-weight blocks per row
  tokens: u32,
  accumulate: u32,     // 1: add the product to y
  scale_shift: u32,    // log2 of the scales texture's width
  quant_shift: u32,    // log2 of the quants texture's width
  x_stride: u32,       // vec4s between tokens in x
  token_base: u32,     // token of y that token 0 of this window is
}

const ROWS: u32 = 4u;  // rows per invocation (they share the x loads and block sums); named a0..a3 below

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var scales: texture_2d<u32>;
@group(0) @binding(2) var quants: texture_2d<u32>;
@group(0) @binding(3) var<uniform> x: array<vec4<f32>, 4096>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var up_scales: texture_2d<u32>;
@group(0) @binding(6) var up_quants: texture_2d<u32>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;

fn texel(t: texture_2d<u32>, i: u32, shift: u32) -> vec4<u32> {
  return textureLoad(t, vec2<u32>(i & ((1u << shift) - 1u), i >> shift), 0);
}

fn lo(word: u32) -> vec4<f32> {
  return vec4<f32>((vec4<u32>(word) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u));
}

fn hi(word: u32) -> vec4<f32> {
  return vec4<f32>((vec4<u32>(word) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u));
}

fn int8s(word: u32) -> vec4<f32> {
  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

// Block i of a Q4_1 matrix times the 32 activations from vec4 xb.
fn q4_1_block(s: texture_2d<u32>, q: texture_2d<u32>, i: u32, xb: u32) -> f32 {
  let dm = unpack2x16float(texel(s, i, params.scale_shift).x);
  let n = texel(q, i, params.quant_shift);
  let dq = dot(lo(n.x), x[xb]) + dot(lo(n.y), x[xb + 1u]) + dot(lo(n.z), x[xb + 2u]) + dot(lo(n.w), x[xb + 3u])
         + dot(hi(n.x), x[xb + 4u]) + dot(hi(n.y), x[xb + 5u]) + dot(hi(n.z), x[xb + 6u]) + dot(hi(n.w), x[xb + 7u]);
  let sum = dot(x[xb] + x[xb + 1u] + x[xb + 2u] + x[xb + 3u] + x[xb + 4u] + x[xb + 5u] + x[xb + 6u] + x[xb + 7u],
                vec4<f32>(1.0));
  return dm.x * dq + dm.y * sum;
}

// Block i of a Q8_0 matrix times the 32 activations from vec4 xb.
fn q8_0_block(i: u32, xb: u32) -> f32 {
  let d = unpack2x16float(texel(scales, i, params.scale_shift).x).x;
  let a = texel(quants, 2u * i, params.quant_shift);
  let b = texel(quants, 2u * i + 1u, params.quant_shift);
  let dq = dot(int8s(a.x), x[xb]) + dot(int8s(a.y), x[xb + 1u]) + dot(int8s(a.z), x[xb + 2u])
         + dot(int8s(a.w), x[xb + 3u]) + dot(int8s(b.x), x[xb + 4u]) + dot(int8s(b.y), x[xb + 5u])
         + dot(int8s(b.z), x[xb + 6u]) + dot(int8s(b.w), x[xb + 7u]);
  return d * dq;
}

// Row r0 + j of this invocation, clamped to the last row (its sum is then computed but not stored).
fn row(r0: u32, j: u32) -> u32 {
  return min(r0 + j, params.rows - 1u);
}

fn store(r0: u32, token: u32, acc: array<f32, ROWS>) {
  for (var j = 0u; j < ROWS; j = j + 1u) {
    if (r0 + j < params.rows) {
      let k = (params.token_base + token) * params.rows + r0 + j;
      y[k] = select(0.0, y[k], params.accumulate == 1u) + acc[j];
    }
  }
}

@compute @workgroup_size(64)
fn q4_1_matvec(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r0 = gid.x * ROWS;
  if (r0 >= params.rows) {
    return;
  }
  // four named accumulators, not an array: a private array indexed in a loop costs lane-by-lane memory accesses
  var a0 = 0.0;
  var a1 = 0.0;
  var a2 = 0.0;
  var a3 = 0.0;
  let i0 = row(r0, 0u) * params.blocks;
  let i1 = row(r0, 1u) * params.blocks;
  let i2 = row(r0, 2u) * params.blocks;
  let i3 = row(r0, 3u) * params.blocks;
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let xb = gid.y * params.x_stride + b * 8u;
    a0 = a0 + q4_1_block(scales, quants, i0 + b, xb);
    a1 = a1 + q4_1_block(scales, quants, i1 + b, xb);
    a2 = a2 + q4_1_block(scales, quants, i2 + b, xb);
    a3 = a3 + q4_1_block(scales, quants, i3 + b, xb);
  }
  store(r0, gid.y, array<f32, ROWS>(a0, a1, a2, a3));
}

@compute @workgroup_size(64)
fn q4_1_gated(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r0 = gid.x * ROWS;
  if (r0 >= params.rows) {
    return;
  }
  var g0 = 0.0;
  var g1 = 0.0;
  var g2 = 0.0;
  var g3 = 0.0;
  var u0 = 0.0;
  var u1 = 0.0;
  var u2 = 0.0;
  var u3 = 0.0;
  let i0 = row(r0, 0u) * params.blocks;
  let i1 = row(r0, 1u) * params.blocks;
  let i2 = row(r0, 2u) * params.blocks;
  let i3 = row(r0, 3u) * params.blocks;
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let xb = gid.y * params.x_stride + b * 8u;
    g0 = g0 + q4_1_block(scales, quants, i0 + b, xb);
    g1 = g1 + q4_1_block(scales, quants, i1 + b, xb);
    g2 = g2 + q4_1_block(scales, quants, i2 + b, xb);
    g3 = g3 + q4_1_block(scales, quants, i3 + b, xb);
    u0 = u0 + q4_1_block(up_scales, up_quants, i0 + b, xb);
    u1 = u1 + q4_1_block(up_scales, up_quants, i1 + b, xb);
    u2 = u2 + q4_1_block(up_scales, up_quants, i2 + b, xb);
    u3 = u3 + q4_1_block(up_scales, up_quants, i3 + b, xb);
  }
  store(r0, gid.y, array<f32, ROWS>(silu(g0) * u0, silu(g1) * u1, silu(g2) * u2, silu(g3) * u3));
}

fn silu(v: f32) -> f32 {
  return v / (1.0 + exp(-v));
}

@compute @workgroup_size(64)
fn q8_0_matvec(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r0 = gid.x * ROWS;
  if (r0 >= params.rows) {
    return;
  }
  var a0 = 0.0;
  var a1 = 0.0;
  var a2 = 0.0;
  var a3 = 0.0;
  let i0 = row(r0, 0u) * params.blocks;
  let i1 = row(r0, 1u) * params.blocks;
  let i2 = row(r0, 2u) * params.blocks;
  let i3 = row(r0, 3u) * params.blocks;
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let xb = gid.y * params.x_stride + b * 8u;
    a0 = a0 + q8_0_block(i0 + b, xb);
    a1 = a1 + q8_0_block(i1 + b, xb);
    a2 = a2 + q8_0_block(i2 + b, xb);
    a3 = a3 + q8_0_block(i3 + b, xb);
  }
  store(r0, gid.y, array<f32, ROWS>(a0, a1, a2, a3));
}

@compute @workgroup_size(256)
fn q8_0_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  let words = params.blocks * 8u;
  if (i >= params.tokens * words) {
    return;
  }
  let token = i / words;
  let word = i % words;
  let block = ids[token] * params.blocks + word / 8u;
  let d = unpack2x16float(texel(scales, block, params.scale_shift).x).x;
  let q = texel(quants, 2u * block + (word % 8u) / 4u, params.quant_shift);
  out[i] = d * int8s(q[word % 4u]);
}
