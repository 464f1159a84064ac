// Quantized weight kernels: matrix-vector products (one token an invocation) and tiled products (TILE tokens an
// invocation) over weights in the device layout of layout.wgsl, of one type (quant_types.wgsl, appended to this,
// unpacks each type's blocks).
//
// Specialised by kvckpt_web.specialize with ROWS = 8 (rows an invocation: a tile of 64 rows is one workgroup
// of 8 invocations, as the layout puts them), TILE (tokens an invocation of the tiled products), SAMPLED (1:
// the textures are bound as sampled textures, 0: as read-only storage textures, whichever the adapter fetches
// faster), MASKED (how nibbles and bytes are unpacked, below) and the weight type (quant_types.wgsl); lines
// tagged "each j < ROWS" are repeated per row j, so the sums live in registers.
//
// A weight matrix of `rows` x (blocks * 32) is one texture (layout.wgsl): row r = 64 T + 8 l + j is row j of
// invocation l of workgroup T; data texel p of its unit u (a block, or a K-quant's 8) at (((T * units + u) * P +
// p) * 8 + j) * 8 + l (P = 1 for Q4_1, 2 for Q8_0), scale word s of its rows 4h .. 4h + 3 at scale_base +
// (((T * units + u) * S + s) * 2 + h) * 8 + l. Weights: Q4_1 w = d * q + m (q in 0..15; a texel's byte k holds
// weight k low, weight 16 + k high), Q8_0 w = d * q (q in -128..127); the other types: quant_types.wgsl.
//
// Activations x are f32 in the texels of an rgba32uint texture (their bits): token t's features 4i .. 4i + 3 in
// texel (i, t). On a CPU adapter a texel fetch loads 16 bytes a lane; the uniform buffers they were read from
// before gathered each float lane by lane (the same values for every lane).
//
// Bindings (group 0), products (matvec, q4_1_gated, and for several tokens matmul, q4_1_gated_matmul; the Q8_0
// forms of the products q8_0_matvec and q8_0_matmul):
//   0  uniform                  Params
//   1  texture (SAMPLED = 1: texture_2d<u32>, else read-only storage), weights
//   2  texture (as binding 1)   x
//   3  storage, read_write      y       y[t * rows + r] = (accumulate ? y[t * rows + r] : 0) + (W x_t)[r]
//      (the gated products:) storage texture, write  hidden  row r of token t = silu(W x_t)[r] * (U x_t)[r],
//                                       W the gate, U the up matrix
//   4  texture (as binding 1)   up      (the gated products) U
// Each row's sum runs over the blocks in order, each block's as d * dq + m * sum(x) (Q4_1) or d * dq (Q8_0),
// dq the dot products of the block's vec4s in a fixed order (Q4_1: the high nibbles taken as 16 q, their dot
// products' sum times 1/16, which is exact; the other types: quant_types.wgsl): the same inputs give the same
// bits, one token an invocation or TILE. The row lookup (rows) is in quant_types.wgsl.

struct Params {
  rows: u32,
  blocks: u32,         // 32-weight blocks per row
  tokens: u32,
  accumulate: u32,     // 1: add the product to y
  shift: u32,          // log2 of the weight texture's width
  scale_base: u32,     // texel where the scales start
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var weights: texture_storage_2d<rgba32uint, read>;  // unless SAMPLED
@group(0) @binding(1) var weights: texture_2d<u32>;  // if SAMPLED
@group(0) @binding(2) var x: texture_storage_2d<rgba32uint, read>;  // unless SAMPLED
@group(0) @binding(2) var x: texture_2d<u32>;  // if SAMPLED
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var hidden: texture_storage_2d<rgba32uint, write>;
@group(0) @binding(4) var up: texture_storage_2d<rgba32uint, read>;  // unless SAMPLED
@group(0) @binding(4) var up: texture_2d<u32>;  // if SAMPLED
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

fn at(i: u32) -> vec2<u32> {
  return vec2<u32>(i & ((1u << params.shift) - 1u), i >> params.shift);
}

fn texel(i: u32) -> vec4<u32> { return textureLoad(weights, at(i)); }  // unless SAMPLED
fn texel(i: u32) -> vec4<u32> { return textureLoad(weights, at(i), 0); }  // if SAMPLED
fn up_texel(i: u32) -> vec4<u32> { return textureLoad(up, at(i)); }  // unless SAMPLED
fn up_texel(i: u32) -> vec4<u32> { return textureLoad(up, at(i), 0); }  // if SAMPLED

// Texel p of block b of the rows of invocation l of tile T (a texel of Q4_1, P = 1, or Q8_0, P = 2), row 0 of 8.
fn first_texel(tile: u32, l: u32, b: u32, p: u32, texels_per_block: u32) -> u32 {
  return ((tile * params.blocks + b) * texels_per_block + p) * 64u + l;
}

// The scale texel of rows 0-3 of invocation l of tile T at block b (rows 4-7: the texel 8 further).
fn scale_texel(tile: u32, l: u32, b: u32) -> u32 {
  return params.scale_base + (tile * params.blocks + b) * 16u + l;
}

// Unpacking, two ways with the same values. MASKED = 0: each byte shifted down, masked, converted. MASKED = 1:
// each byte masked in place, converted (exact: a byte times 2^8k has at most 12 significant bits) and scaled by
// 2^-8k (exact), for compilers that shift vectors lane by lane (SwiftShader's: its shifts by a vector of amounts).
// Conversions are from signed integers: cheaper than from unsigned ones where the compiler cannot see that the
// values are small.
const SCALES = vec4<f32>(1.0, 0.00390625, 0.0000152587890625, 5.9604644775390625e-8);  // 2^-8k

// The low nibbles of a word's bytes.
fn lo(word: u32) -> vec4<f32> { return vec4<f32>(bitcast<vec4<i32>>((vec4<u32>(word) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u))); }  // unless MASKED
fn lo(word: u32) -> vec4<f32> { return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) & vec4<u32>(0xfu, 0xf00u, 0xf0000u, 0xf000000u))) * SCALES; }  // if MASKED

// The high nibbles of a word's bytes, times 16 (byte 3's shifted first: masked in place its top bit is the sign).
fn hi16(word: u32) -> vec4<f32> { return vec4<f32>(bitcast<vec4<i32>>((vec4<u32>(word) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(240u))); }  // unless MASKED
fn hi16(word: u32) -> vec4<f32> { return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word, word, word, word >> 4u) & vec4<u32>(0xf0u, 0xf000u, 0xf00000u, 0xf000000u))) * (SCALES * vec4<f32>(1.0, 1.0, 1.0, 16.0)); }  // if MASKED

// A word's bytes as signed integers (masked: byte 3 in place carries its sign, bytes 0-2 from 128 up wrap by 256).
fn int8s(word: u32) -> vec4<f32> { return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u)); }  // unless MASKED
fn int8s(word: u32) -> vec4<f32> { return wrap(vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) & vec4<u32>(0xffu, 0xff00u, 0xff0000u, 0xff000000u))) * SCALES); }  // if MASKED

fn wrap(u: vec4<f32>) -> vec4<f32> {
  return u - select(vec4<f32>(0.0), vec4<f32>(256.0, 256.0, 256.0, 0.0), u >= vec4<f32>(128.0));
}

// The 32 activations of one block, and their sum.
struct Acts {
  v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>,
  v4: vec4<f32>, v5: vec4<f32>, v6: vec4<f32>, v7: vec4<f32>,
  sum: f32,
}

fn x_at(i: u32, t: u32) -> vec4<f32> { return bitcast<vec4<f32>>(textureLoad(x, vec2<u32>(i, t))); }  // unless SAMPLED
fn x_at(i: u32, t: u32) -> vec4<f32> { return bitcast<vec4<f32>>(textureLoad(x, vec2<u32>(i, t), 0)); }  // if SAMPLED

// Block b of token t.
fn acts(t: u32, b: u32) -> Acts {
  let v0 = x_at(8u * b, t);
  let v1 = x_at(8u * b + 1u, t);
  let v2 = x_at(8u * b + 2u, t);
  let v3 = x_at(8u * b + 3u, t);
  let v4 = x_at(8u * b + 4u, t);
  let v5 = x_at(8u * b + 5u, t);
  let v6 = x_at(8u * b + 6u, t);
  let v7 = x_at(8u * b + 7u, t);
  return Acts(v0, v1, v2, v3, v4, v5, v6, v7, dot(((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)), vec4<f32>(1.0)));
}

// A Q4_1 block's weights: (d, m), its 16 low q (q0-q3: weights 0-15) and 16 high q times 16 (h4-h7: 16-31).
struct Q4 {
  dm: vec2<f32>,
  q0: vec4<f32>, q1: vec4<f32>, q2: vec4<f32>, q3: vec4<f32>,
  h4: vec4<f32>, h5: vec4<f32>, h6: vec4<f32>, h7: vec4<f32>,
}

fn q4_1(n: vec4<u32>, scale: u32) -> Q4 {
  return Q4(unpack2x16float(scale), lo(n.x), lo(n.y), lo(n.z), lo(n.w), hi16(n.x), hi16(n.y), hi16(n.z), hi16(n.w));
}

fn q4_1_dot(w: Q4, a: Acts) -> f32 {
  let dq = dot(w.q0, a.v0) + dot(w.q1, a.v1) + dot(w.q2, a.v2) + dot(w.q3, a.v3)
         + (dot(w.h4, a.v4) + dot(w.h5, a.v5) + dot(w.h6, a.v6) + dot(w.h7, a.v7)) * 0.0625;
  return w.dm.x * dq + w.dm.y * a.sum;
}

// Block b of the rows of invocation l of tile T in the gate and up matrices (same shape): their first texel (the
// same in both) and the scale texels of rows 0-3 and 4-7 of each.
struct GatedBlock {
  w: u32,
  low: vec4<u32>,
  high: vec4<u32>,
  up_low: vec4<u32>,
  up_high: vec4<u32>,
}

fn gated_block(tile: u32, l: u32, b: u32) -> GatedBlock {
  let s = scale_texel(tile, l, b);
  return GatedBlock(first_texel(tile, l, b, 0u, 1u), texel(s), texel(s + 8u), up_texel(s), up_texel(s + 8u));
}

// Row j's scale word from the scale texels of rows 0-3 and 4-7.
fn scale_of(low: vec4<u32>, high: vec4<u32>, j: u32) -> u32 {
  return select(high, low, j < 4u)[j % 4u];
}

// Store the sum of row r of token t.
fn store(r: u32, t: u32, sum: f32) {
  if (r < params.rows) {
    let k = t * params.rows + r;
    y[k] = select(0.0, y[k], params.accumulate == 1u) + sum;
  }
}

// Store silu(g) * u of rows r0 .. r0 + 7 (r0 a multiple of 8) of token t in two texels of hidden.
fn store_hidden(r0: u32, t: u32, g0: vec4<f32>, g1: vec4<f32>, u0: vec4<f32>, u1: vec4<f32>) {
  textureStore(hidden, vec2<u32>(r0 / 4u, t), bitcast<vec4<u32>>(silu(g0) * u0));
  textureStore(hidden, vec2<u32>(r0 / 4u + 1u, t), bitcast<vec4<u32>>(silu(g1) * u1));
}

fn silu(v: vec4<f32>) -> vec4<f32> {
  return v / (1.0 + exp(-v));
}

// The products of one token: workgroup (T, t) is tile T of rows and token t, invocation l its rows 64 T + 8 l + j.

@compute @workgroup_size(8)
fn matvec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let r0 = 64u * wg.x + 8u * lid.x;
  if (r0 >= params.rows) {
    return;
  }
  var s{j} = 0.0;  // each j < ROWS
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let a = acts(wg.y, b);
    let h = half_sums(a);
    let sc = scales(wg.x, lid.x, b / UNIT);
    s{j} += weights_dot(read_weights(wg.x, lid.x, b, {j}u, sc), a, h);  // each j < ROWS
  }
  store(r0 + {j}u, wg.y, s{j});  // each j < ROWS
}

// matvec of Q8_0 weights, each block in halves: weights 0-15 of the 8 rows with activations 0-15, then weights
// 16-31 with activations 16-31, so that 4 of a block's 8 activation texels are live at a time (llvmpipe, given all
// 32 activations and 8 rows' weights at once, spilled registers: the Gemma head's product took 1.25x the CPU time,
// bench/notes/2026-12-07-gemma-head.md). The same sums as matvec's (q8_0_dot's halves, quant_types.wgsl).

@compute @workgroup_size(8)
fn q8_0_matvec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let r0 = 64u * wg.x + 8u * lid.x;
  if (r0 >= params.rows) {
    return;
  }
  var s{j} = 0.0;  // each j < ROWS
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let v0 = x_at(8u * b, wg.y);
    let v1 = x_at(8u * b + 1u, wg.y);
    let v2 = x_at(8u * b + 2u, wg.y);
    let v3 = x_at(8u * b + 3u, wg.y);
    let low{j} = q8_0_low(int8s4(data(wg.x, lid.x, b, 0u, {j}u)), v0, v1, v2, v3);  // each j < ROWS
    let v4 = x_at(8u * b + 4u, wg.y);
    let v5 = x_at(8u * b + 5u, wg.y);
    let v6 = x_at(8u * b + 6u, wg.y);
    let v7 = x_at(8u * b + 7u, wg.y);
    let sc = scales(wg.x, lid.x, b);
    s{j} += unpack2x16float(scale_word(sc, 0u, {j}u)).x * q8_0_high(low{j}, int8s4(data(wg.x, lid.x, b, 1u, {j}u)), v4, v5, v6, v7);  // each j < ROWS
  }
  store(r0 + {j}u, wg.y, s{j});  // each j < ROWS
}

@compute @workgroup_size(8)
fn q4_1_gated(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let r0 = 64u * wg.x + 8u * lid.x;
  if (r0 >= params.rows) {
    return;
  }
  var g{j} = 0.0;  // each j < ROWS
  var u{j} = 0.0;  // each j < ROWS
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let a = acts(wg.y, b);
    let k = gated_block(wg.x, lid.x, b);
    g{j} += q4_1_dot(q4_1(texel(k.w + 8u * {j}u), scale_of(k.low, k.high, {j}u)), a);  // each j < ROWS
    u{j} += q4_1_dot(q4_1(up_texel(k.w + 8u * {j}u), scale_of(k.up_low, k.up_high, {j}u)), a);  // each j < ROWS
  }
  store_hidden(r0, wg.y, vec4<f32>(g0, g1, g2, g3), vec4<f32>(g4, g5, g6, g7), vec4<f32>(u0, u1, u2, u3),
               vec4<f32>(u4, u5, u6, u7));
}

// The tiled products (prefill): workgroup (T, g) is tile T of rows and tokens TILE g .. TILE g + TILE - 1 (each
// clamped to the last token: its sums are then computed, not stored); each block's weights are fetched and
// unpacked once for the TILE tokens. Per (row, token) the same sums as the products above.

@compute @workgroup_size(8)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let r0 = 64u * wg.x + 8u * lid.x;
  if (r0 >= params.rows) {
    return;
  }
  let t{k} = min(wg.y * TILE + {k}u, params.tokens - 1u);  // each k < TILE
  var s{j}_{k} = 0.0;  // each j < ROWS, k < TILE
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let a{k} = acts(t{k}, b);  // each k < TILE
    let h{k} = half_sums(a{k});  // each k < TILE
    let sc = scales(wg.x, lid.x, b / UNIT);
    let w{j} = read_weights(wg.x, lid.x, b, {j}u, sc);  // each j < ROWS
    s{j}_{k} += weights_dot(w{j}, a{k}, h{k});  // each j < ROWS, k < TILE
  }
  if (wg.y * TILE + {k}u < params.tokens) { store(r0 + {j}u, t{k}, s{j}_{k}); }  // each j < ROWS, k < TILE
}

// matmul of Q8_0 weights, each block in halves as q8_0_matvec (the same sums as matmul's).

@compute @workgroup_size(8)
fn q8_0_matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let r0 = 64u * wg.x + 8u * lid.x;
  if (r0 >= params.rows) {
    return;
  }
  let t{k} = min(wg.y * TILE + {k}u, params.tokens - 1u);  // each k < TILE
  var s{j}_{k} = 0.0;  // each j < ROWS, k < TILE
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let v0_{k} = x_at(8u * b, t{k});  // each k < TILE
    let v1_{k} = x_at(8u * b + 1u, t{k});  // each k < TILE
    let v2_{k} = x_at(8u * b + 2u, t{k});  // each k < TILE
    let v3_{k} = x_at(8u * b + 3u, t{k});  // each k < TILE
    let p{j} = int8s4(data(wg.x, lid.x, b, 0u, {j}u));  // each j < ROWS
    let low{j}_{k} = q8_0_low(p{j}, v0_{k}, v1_{k}, v2_{k}, v3_{k});  // each j < ROWS, k < TILE
    let v4_{k} = x_at(8u * b + 4u, t{k});  // each k < TILE
    let v5_{k} = x_at(8u * b + 5u, t{k});  // each k < TILE
    let v6_{k} = x_at(8u * b + 6u, t{k});  // each k < TILE
    let v7_{k} = x_at(8u * b + 7u, t{k});  // each k < TILE
    let sc = scales(wg.x, lid.x, b);
    let q{j} = int8s4(data(wg.x, lid.x, b, 1u, {j}u));  // each j < ROWS
    let d{j} = unpack2x16float(scale_word(sc, 0u, {j}u)).x;  // each j < ROWS
    s{j}_{k} += d{j} * q8_0_high(low{j}_{k}, q{j}, v4_{k}, v5_{k}, v6_{k}, v7_{k});  // each j < ROWS, k < TILE
  }
  if (wg.y * TILE + {k}u < params.tokens) { store(r0 + {j}u, t{k}, s{j}_{k}); }  // each j < ROWS, k < TILE
}

@compute @workgroup_size(8)
fn q4_1_gated_matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let r0 = 64u * wg.x + 8u * lid.x;
  if (r0 >= params.rows) {
    return;
  }
  let t{k} = min(wg.y * TILE + {k}u, params.tokens - 1u);  // each k < TILE
  var g{j}_{k} = 0.0;  // each j < ROWS, k < TILE
  var u{j}_{k} = 0.0;  // each j < ROWS, k < TILE
  for (var b = 0u; b < params.blocks; b = b + 1u) {
    let a{k} = acts(t{k}, b);  // each k < TILE
    let k = gated_block(wg.x, lid.x, b);
    let w{j} = q4_1(texel(k.w + 8u * {j}u), scale_of(k.low, k.high, {j}u));  // each j < ROWS
    g{j}_{k} += q4_1_dot(w{j}, a{k});  // each j < ROWS, k < TILE
    let v{j} = q4_1(up_texel(k.w + 8u * {j}u), scale_of(k.up_low, k.up_high, {j}u));  // each j < ROWS
    u{j}_{k} += q4_1_dot(v{j}, a{k});  // each j < ROWS, k < TILE
  }
  if (wg.y * TILE + {k}u < params.tokens) { store_hidden(r0, t{k}, vec4<f32>(g0_{k}, g1_{k}, g2_{k}, g3_{k}), vec4<f32>(g4_{k}, g5_{k}, g6_{k}, g7_{k}), vec4<f32>(u0_{k}, u1_{k}, u2_{k}, u3_{k}), vec4<f32>(u4_{k}, u5_{k}, u6_{k}, u7_{k})); }  // each k < TILE
}
