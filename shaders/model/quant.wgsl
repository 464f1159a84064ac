// Quantized weight kernels: matrix-vector products (one per token) and row lookups over Q4_1 / Q8_0 weights.
//
// A weight matrix of `rows` x (blocks * 32) is held as two textures (kvckpt_web.model.weights):
//   scales  r32uint     texel i = r * blocks + b: Q4_1 pack2x16float(d, m); Q8_0 pack2x16float(d, 0)
//   quants  rgba32uint  Q4_1: texel i = r * blocks + b, 16 bytes of nibbles as in GGUF (byte j: weight j in
//                       the low nibble, weight 16 + j in the high one); Q8_0: texels 2i and 2i + 1, 32 int8
// Texel i of a texture 2^shift texels wide lies at (i & (2^shift - 1), i >> shift). Weights:
//   Q4_1 w = d * q + m (q in 0..15), Q8_0 w = d * q (q in -128..127).
//
// Bindings (group 0), products (q4_1_matvec, q8_0_matvec, q4_1_gated, and for several tokens q4_1_matmul,
// q4_1_gated_matmul):
//   0  uniform              Params
//   1  texture_2d<u32>      scales
//   2  texture_2d<u32>      quants
//   3  uniform              x       a 64 KiB window of the activations, its token t at vec4 t * x_stride
//   4  storage, read_write  y       y[T * rows + r] = (accumulate ? y[T * rows + r] : 0) + (W x'_t)[r],
//                                   T = token_base + t (y is not windowed)
//   5  uniform              norm    the RMSNorm weight (64 KiB bound; read only when normalize = 1)
//   6  texture_2d<u32>      scales of the up matrix (q4_1_gated: y = silu(W x') * (U x'), W the gate)
//   7  texture_2d<u32>      quants of the up matrix
// x' is x_t, or with normalize = 1 RMSNorm(x_t) = x_t * norm / sqrt(mean(x_t^2) + eps): the products fold in
// the norm that precedes them, computed by each invocation (x_t * norm enters the sums, the 1 / rms factor
// scales each finished row sum).
// Invocation gid.x computes rows ROWS * gid.x .. + ROWS - 1 of token workgroup_id.y (the matmul entries: rows
// 4 * gid.x .. + 3 of tokens TILE * workgroup_id.y .. + TILE - 1); each row's sum runs over
// the blocks in order, each block's as d * dot(q, x') + m * sum(x') (Q4_1) or d * dot(q, x') (Q8_0), with
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
  normalize: u32,      // 1: RMSNorm x first (see above)
  eps: f32,
  pad0: u32,
  pad1: u32,
}

const ROWS: u32 = 8u;  // rows per invocation (they share the activation loads and block sums)
const TILE: u32 = 4u;  // tokens per invocation of the tiled products (q4_1_matmul, q4_1_gated_matmul)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var scales: texture_2d<u32>;
@group(0) @binding(2) var quants: texture_2d<u32>;
@group(0) @binding(3) var<uniform> x: array<vec4<f32>, 4096>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> norm: array<vec4<f32>, 4096>;
@group(0) @binding(6) var up_scales: texture_2d<u32>;
@group(0) @binding(7) var up_quants: texture_2d<u32>;
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

// The 32 activations of one block (times the norm weight when normalizing), and their sum.
struct Acts {
  v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>,
  v4: vec4<f32>, v5: vec4<f32>, v6: vec4<f32>, v7: vec4<f32>,
  sum: f32,
}

// x's vec4 xb + k, times the norm weight's vec4 nb + k when normalizing.
fn weighted(k: u32, xb: u32, nb: u32) -> vec4<f32> {
  return x[xb + k] * select(vec4<f32>(1.0), norm[nb + k], params.normalize == 1u);
}

// Block b of token t.
fn acts(t: u32, b: u32) -> Acts {
  let xb = t * params.x_stride + b * 8u;
  let nb = b * 8u;
  let v0 = weighted(0u, xb, nb);
  let v1 = weighted(1u, xb, nb);
  let v2 = weighted(2u, xb, nb);
  let v3 = weighted(3u, xb, nb);
  let v4 = weighted(4u, xb, nb);
  let v5 = weighted(5u, xb, nb);
  let v6 = weighted(6u, xb, nb);
  let v7 = weighted(7u, xb, nb);
  return Acts(v0, v1, v2, v3, v4, v5, v6, v7, dot(((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)), vec4<f32>(1.0)));
}

// The factor of each row sum of token t: 1 / rms(x_t) when normalizing, else 1.
fn row_scale(t: u32) -> f32 {
  if (params.normalize != 1u) {
    return 1.0;
  }
  var squares = vec4<f32>(0.0);
  for (var k = 0u; k < params.blocks * 8u; k = k + 1u) {
    let v = x[t * params.x_stride + k];
    squares = squares + v * v;
  }
  return 1.0 / sqrt(dot(squares, vec4<f32>(1.0)) / f32(params.blocks * 32u) + params.eps);
}

// A Q4_1 block's weights: (d, m) and its 32 q as floats, q0 = weights 0-3 .. q7 = weights 28-31.
struct Q4 {
  dm: vec2<f32>,
  q0: vec4<f32>, q1: vec4<f32>, q2: vec4<f32>, q3: vec4<f32>,
  q4: vec4<f32>, q5: vec4<f32>, q6: vec4<f32>, q7: vec4<f32>,
}

fn q4_1_weights(s: texture_2d<u32>, q: texture_2d<u32>, i: u32) -> Q4 {
  let n = texel(q, i, params.quant_shift);
  return Q4(unpack2x16float(texel(s, i, params.scale_shift).x),
            lo(n.x), lo(n.y), lo(n.z), lo(n.w), hi(n.x), hi(n.y), hi(n.z), hi(n.w));
}

fn q4_1_dot(w: Q4, a: Acts) -> f32 {
  let dq = dot(w.q0, a.v0) + dot(w.q1, a.v1) + dot(w.q2, a.v2) + dot(w.q3, a.v3)
         + dot(w.q4, a.v4) + dot(w.q5, a.v5) + dot(w.q6, a.v6) + dot(w.q7, a.v7);
  return w.dm.x * dq + w.dm.y * a.sum;
}

// Block i of a Q4_1 matrix times the block's activations a.
fn q4_1_block(s: texture_2d<u32>, q: texture_2d<u32>, i: u32, a: Acts) -> f32 {
  return q4_1_dot(q4_1_weights(s, q, i), a);
}

// Block i of a Q4_1 matrix times the block's activations of four tokens (the weights fetched once).
fn q4_1_tile(s: texture_2d<u32>, q: texture_2d<u32>, i: u32, a0: Acts, a1: Acts, a2: Acts, a3: Acts) -> vec4<f32> {
  let w = q4_1_weights(s, q, i);
  return vec4<f32>(q4_1_dot(w, a0), q4_1_dot(w, a1), q4_1_dot(w, a2), q4_1_dot(w, a3));
}

// Block i of a Q8_0 matrix times the block's activations a.
fn q8_0_block(i: u32, a: Acts) -> f32 {
  let d = unpack2x16float(texel(scales, i, params.scale_shift).x).x;
  let p = texel(quants, 2u * i, params.quant_shift);
  let q = texel(quants, 2u * i + 1u, params.quant_shift);
  let dq = dot(int8s(p.x), a.v0) + dot(int8s(p.y), a.v1) + dot(int8s(p.z), a.v2) + dot(int8s(p.w), a.v3)
         + dot(int8s(q.x), a.v4) + dot(int8s(q.y), a.v5) + dot(int8s(q.z), a.v6) + dot(int8s(q.w), a.v7);
  return d * dq;
}

// Four rows' blocks: q4_1_block of each block index in i.
fn q4_1_rows(s: texture_2d<u32>, q: texture_2d<u32>, i: vec4<u32>, a: Acts) -> vec4<f32> {
  return vec4<f32>(q4_1_block(s, q, i.x, a), q4_1_block(s, q, i.y, a), q4_1_block(s, q, i.z, a),
                   q4_1_block(s, q, i.w, a));
}

fn q8_0_rows4(i: vec4<u32>, a: Acts) -> vec4<f32> {
  return vec4<f32>(q8_0_block(i.x, a), q8_0_block(i.y, a), q8_0_block(i.z, a), q8_0_block(i.w, a));
}

// Index of block 0 of rows r .. r + 3, each clamped to the last row (its sum is then computed, not stored).
fn first_blocks(r: u32) -> vec4<u32> {
  return min(vec4<u32>(r) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(params.rows - 1u)) * params.blocks;
}

// Store the sums of rows r0 .. r0 + 3 (low) and r0 + 4 .. r0 + 7 (high) of token t.
fn store(r0: u32, t: u32, low: vec4<f32>, high: vec4<f32>) {
  for (var j = 0u; j < 8u; j = j + 1u) {
    if (r0 + j < params.rows) {
      let k = (params.token_base + t) * params.rows + r0 + j;
      let sum = select(high[j & 3u], low[j & 3u], j < 4u);
      y[k] = select(0.0, y[k], params.accumulate == 1u) + sum;
    }
  }
}

fn silu(v: vec4<f32>) -> vec4<f32> {
  return v / (1.0 + exp(-v));
}

// The products: ROWS = 8 rows per invocation, their sums in two vec4 accumulators (low and high four rows).

@compute @workgroup_size(64)
fn q4_1_matvec(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r0 = gid.x * ROWS;
  if (r0 >= params.rows) {
    return;
  }
  let il = first_blocks(r0);
  let ih = first_blocks(r0 + 4u);
  var low = vec4<f32>(0.0);
  var high = vec4<f32>(0.0);
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let a = acts(gid.y, b);
    low = low + q4_1_rows(scales, quants, il + b, a);
    high = high + q4_1_rows(scales, quants, ih + b, a);
  }
  let f = row_scale(gid.y);
  store(r0, gid.y, low * f, high * f);
}

@compute @workgroup_size(64)
fn q4_1_gated(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r0 = gid.x * ROWS;
  if (r0 >= params.rows) {
    return;
  }
  let il = first_blocks(r0);
  let ih = first_blocks(r0 + 4u);
  var gate_low = vec4<f32>(0.0);
  var gate_high = vec4<f32>(0.0);
  var up_low = vec4<f32>(0.0);
  var up_high = vec4<f32>(0.0);
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let a = acts(gid.y, b);
    gate_low = gate_low + q4_1_rows(scales, quants, il + b, a);
    gate_high = gate_high + q4_1_rows(scales, quants, ih + b, a);
    up_low = up_low + q4_1_rows(up_scales, up_quants, il + b, a);
    up_high = up_high + q4_1_rows(up_scales, up_quants, ih + b, a);
  }
  let f = row_scale(gid.y);
  store(r0, gid.y, silu(gate_low * f) * (up_low * f), silu(gate_high * f) * (up_high * f));
}

@compute @workgroup_size(64)
fn q8_0_matvec(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r0 = gid.x * ROWS;
  if (r0 >= params.rows) {
    return;
  }
  let il = first_blocks(r0);
  let ih = first_blocks(r0 + 4u);
  var low = vec4<f32>(0.0);
  var high = vec4<f32>(0.0);
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let a = acts(gid.y, b);
    low = low + q8_0_rows4(il + b, a);
    high = high + q8_0_rows4(ih + b, a);
  }
  let f = row_scale(gid.y);
  store(r0, gid.y, low * f, high * f);
}

// The tiled products (prefill): 4 rows x TILE tokens per invocation, gid.y the tile; the weights of a block
// are fetched once for the tile's tokens. Per (row, token) the same sums as the products above.

// Tokens of tile g, each clamped to the last token (its sums are then computed, not stored).
fn tile_tokens(g: u32) -> vec4<u32> {
  return min(vec4<u32>(g * TILE) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(params.tokens - 1u));
}

fn tile_scales(t: vec4<u32>) -> vec4<f32> {
  return vec4<f32>(row_scale(t.x), row_scale(t.y), row_scale(t.z), row_scale(t.w));
}

// Store row r's sums of the tokens of tile g.
fn store_tile(r: u32, g: u32, sums: vec4<f32>) {
  if (r >= params.rows) {
    return;
  }
  for (var j = 0u; j < TILE; j = j + 1u) {
    let t = g * TILE + j;
    if (t < params.tokens) {
      let k = (params.token_base + t) * params.rows + r;
      y[k] = select(0.0, y[k], params.accumulate == 1u) + sums[j];
    }
  }
}

@compute @workgroup_size(64)
fn q4_1_matmul(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r0 = gid.x * 4u;
  if (r0 >= params.rows) {
    return;
  }
  let t = tile_tokens(gid.y);
  let i = first_blocks(r0);
  var s0 = vec4<f32>(0.0);  // row r0 + j: s_j over the tile's tokens
  var s1 = vec4<f32>(0.0);
  var s2 = vec4<f32>(0.0);
  var s3 = vec4<f32>(0.0);
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let a0 = acts(t.x, b);
    let a1 = acts(t.y, b);
    let a2 = acts(t.z, b);
    let a3 = acts(t.w, b);
    s0 = s0 + q4_1_tile(scales, quants, i.x + b, a0, a1, a2, a3);
    s1 = s1 + q4_1_tile(scales, quants, i.y + b, a0, a1, a2, a3);
    s2 = s2 + q4_1_tile(scales, quants, i.z + b, a0, a1, a2, a3);
    s3 = s3 + q4_1_tile(scales, quants, i.w + b, a0, a1, a2, a3);
  }
  let f = tile_scales(t);
  store_tile(r0, gid.y, s0 * f);
  store_tile(r0 + 1u, gid.y, s1 * f);
  store_tile(r0 + 2u, gid.y, s2 * f);
  store_tile(r0 + 3u, gid.y, s3 * f);
}

@compute @workgroup_size(64)
fn q4_1_gated_matmul(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r0 = gid.x * 4u;
  if (r0 >= params.rows) {
    return;
  }
  let t = tile_tokens(gid.y);
  let i = first_blocks(r0);
  var g0 = vec4<f32>(0.0);
  var g1 = vec4<f32>(0.0);
  var g2 = vec4<f32>(0.0);
  var g3 = vec4<f32>(0.0);
  var u0 = vec4<f32>(0.0);
  var u1 = vec4<f32>(0.0);
  var u2 = vec4<f32>(0.0);
  var u3 = vec4<f32>(0.0);
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let a0 = acts(t.x, b);
    let a1 = acts(t.y, b);
    let a2 = acts(t.z, b);
    let a3 = acts(t.w, b);
    g0 = g0 + q4_1_tile(scales, quants, i.x + b, a0, a1, a2, a3);
    g1 = g1 + q4_1_tile(scales, quants, i.y + b, a0, a1, a2, a3);
    g2 = g2 + q4_1_tile(scales, quants, i.z + b, a0, a1, a2, a3);
    g3 = g3 + q4_1_tile(scales, quants, i.w + b, a0, a1, a2, a3);
    u0 = u0 + q4_1_tile(up_scales, up_quants, i.x + b, a0, a1, a2, a3);
    u1 = u1 + q4_1_tile(up_scales, up_quants, i.y + b, a0, a1, a2, a3);
    u2 = u2 + q4_1_tile(up_scales, up_quants, i.z + b, a0, a1, a2, a3);
    u3 = u3 + q4_1_tile(up_scales, up_quants, i.w + b, a0, a1, a2, a3);
  }
  let f = tile_scales(t);
  store_tile(r0, gid.y, silu(g0 * f) * (u0 * f));
  store_tile(r0 + 1u, gid.y, silu(g1 * f) * (u1 * f));
  store_tile(r0 + 2u, gid.y, silu(g2 * f) * (u2 * f));
  store_tile(r0 + 3u, gid.y, silu(g3 * f) * (u3 * f));
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
