// The weight types of quant.wgsl's products (appended to it, whose bindings, fetches and unpacking they share),
// and the row lookup. kvckpt_web.model.kernels specialises the module to one type: IS_<type> 1, BLOCKED 1 unless
// the type is Q4_1 or Q8_0, HAS_MIN 1 if its weights add a term (Q4_1's m, a K-quant's -dmin * m), UNIT its blocks
// per unit, TEXELS and WORDS its data texels and scale words per unit
// (as layout.wgsl lays them out). The products read a 32-weight block of a row as the type's Weights
// (`read_weights`) and multiply it by the block's activations (`weights_dot`): Q4_1 and Q8_0 as quant.wgsl describes,
// the other types as Blocks.
//
// A block unpacked (Block): its 32 integers q (weights 0-15 in q0-q3, weights 16-31 in q4-q7, the latter times 16
// for the types stored as nibbles: hi16 in quant.wgsl; Q8_0: the int8; F16 / BF16: the values themselves), the
// offset `off` they are stored with (0 unless the high half is times 16), the scale a and the added term m of each
// half (0 where there is none). Weight i is a * (q_i - off), plus m where the type has one (high half:
// a * (q_i - 16 off) + m): in f32, in the order gguf.quants.dequantize computes it (its d * q - dm is d * q + (-dm),
// the same bits; a product of a and the integers rounds once, exact as it is for most types), so `rows` gives
// gguf's bits, the sign of a zero included (a type without m adds nothing: SwiftShader's x + -0.0 loses a -0). The products sum a block as a * dot(q, x) + (m - a * off) * sum(x) per half: the offset and m
// cost one term per half, not one per weight.
//
// Entry rows (every type, through `unpack`): bindings 0-1 as the products, then
//   2  storage, read        ids     token ids
//   3  storage, read_write  out     out[t * blocks * 32 + k] = row ids[t] of the matrix, dequantized
// one invocation per (token, block, 4 weights), on a 2-D grid of 256-invocation workgroups.

struct Block {
  a: vec2<f32>,
  m: vec2<f32>,
  off: f32,
  q0: vec4<f32>, q1: vec4<f32>, q2: vec4<f32>, q3: vec4<f32>,
  q4: vec4<f32>, q5: vec4<f32>, q6: vec4<f32>, q7: vec4<f32>,
}

const NO_MIN = vec2<f32>(0.0);

// Data texel p of unit u of row j of invocation l of tile t.
fn data(t: u32, l: u32, u: u32, p: u32, j: u32) -> vec4<u32> {
  return texel(((t * (params.blocks / UNIT) + u) * TEXELS + p) * 64u + 8u * j + l);
}

// The scale texels of the rows of invocation l of tile t at unit u: word 0 of rows 0-3 and 4-7 (low0, high0), word
// 1 (low1, high1); zero where the type has fewer words.
struct Scales {
  low0: vec4<u32>, high0: vec4<u32>, low1: vec4<u32>, high1: vec4<u32>,
}

fn scales(t: u32, l: u32, u: u32) -> Scales {
  let s = params.scale_base + (t * (params.blocks / UNIT) + u) * WORDS * 16u + l;
  var sc = Scales(vec4<u32>(0u), vec4<u32>(0u), vec4<u32>(0u), vec4<u32>(0u));
  if (WORDS > 0u) {
    sc.low0 = texel(s);
    sc.high0 = texel(s + 8u);
  }
  if (WORDS > 1u) {
    sc.low1 = texel(s + 16u);
    sc.high1 = texel(s + 24u);
  }
  return sc;
}

// Scale word w of row j.
fn scale_word(sc: Scales, w: u32, j: u32) -> u32 {
  return select(scale_of(sc.low0, sc.high0, j), scale_of(sc.low1, sc.high1, j), w == 1u);
}

// Bits 0-3 of h as 16 * bit (a 5th bit of 4 weights), without vector shifts.
fn bits16(h: u32) -> vec4<f32> {
  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(h) & vec4<u32>(1u, 2u, 4u, 8u))) * vec4<f32>(16.0, 8.0, 4.0, 2.0);
}

// Bits 0-1 of each byte of h as 16 * value (the high 2 bits of 4 Q6_K weights).
fn bits2x16(h: u32) -> vec4<f32> {
  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(h) & vec4<u32>(3u, 0x300u, 0x30000u, 0x3000000u)))
         * vec4<f32>(16.0, 0.0625, 0.000244140625, 9.5367431640625e-7);
}

// A block of 32 4-bit q (nibbles n) with 5th bits h (bit k: weight k; 0: none), scales a, terms m, offset off.
fn nibble_block(n: vec4<u32>, h: u32, a: vec2<f32>, m: vec2<f32>, off: f32) -> Block {
  return Block(a, m, off, lo(n.x) + bits16(h), lo(n.y) + bits16(h >> 4u), lo(n.z) + bits16(h >> 8u),
               lo(n.w) + bits16(h >> 12u), hi16(n.x) + 16.0 * bits16(h >> 16u), hi16(n.y) + 16.0 * bits16(h >> 20u),
               hi16(n.z) + 16.0 * bits16(h >> 24u), hi16(n.w) + 16.0 * bits16(h >> 28u));
}

fn unpack_q4_0(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block {
  let d = unpack2x16float(scale_word(sc, 0u, j)).x;
  return nibble_block(data(t, l, b, 0u, j), 0u, vec2<f32>(d, d * 0.0625), NO_MIN, 8.0);
}

fn unpack_q4_1(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block {
  let dm = unpack2x16float(scale_word(sc, 0u, j));
  return nibble_block(data(t, l, b, 0u, j), 0u, vec2<f32>(dm.x, dm.x * 0.0625), dm.yy, 0.0);
}

fn unpack_q5_0(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block {
  let d = unpack2x16float(scale_word(sc, 0u, j)).x;
  return nibble_block(data(t, l, b, 0u, j), scale_word(sc, 1u, j), vec2<f32>(d, d * 0.0625), NO_MIN, 16.0);
}

fn unpack_q8_0(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block {
  let d = unpack2x16float(scale_word(sc, 0u, j)).x;
  let p = data(t, l, b, 0u, j);
  let q = data(t, l, b, 1u, j);
  return Block(vec2<f32>(d), NO_MIN, 0.0, int8s(p.x), int8s(p.y), int8s(p.z), int8s(p.w), int8s(q.x), int8s(q.y),
               int8s(q.z), int8s(q.w));
}

// A K-quant's sub-block i: (d * sc, dmin * m) of its header texel (get_scale_min of gguf's Q4_K).
fn k_scales(header: vec4<u32>, i: u32) -> vec2<f32> {
  let k = 8u * (i % 4u);
  let low = vec2<u32>(header.y >> k, header.z >> k);
  let scale_min = select(((vec2<u32>(header.w >> k) >> vec2<u32>(0u, 4u)) & vec2<u32>(15u)) | ((low >> vec2<u32>(2u)) & vec2<u32>(0x30u)),
                         low & vec2<u32>(63u), i < 4u);
  return unpack2x16float(header.x) * vec2<f32>(bitcast<vec2<i32>>(scale_min));
}

fn unpack_q4_k(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block {
  let s = k_scales(data(t, l, b / 8u, 0u, j), b % 8u);
  return nibble_block(data(t, l, b / 8u, 1u + b % 8u, j), 0u, vec2<f32>(s.x, s.x * 0.0625), -s.yy, 0.0);
}

fn unpack_q5_k(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block {
  let s = k_scales(data(t, l, b / 8u, 0u, j), b % 8u);
  let h = data(t, l, b / 8u, 9u + (b % 8u) / 4u, j)[b % 4u];
  return nibble_block(data(t, l, b / 8u, 1u + b % 8u, j), h, vec2<f32>(s.x, s.x * 0.0625), -s.yy, 0.0);
}

fn unpack_q6_k(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block {
  let i = b % 8u;
  let u = b / 8u;
  let d = unpack2x16float(scale_word(sc, 0u, j)).x;
  let scales = data(t, l, u, 0u, j)[i / 2u] >> (16u * (i % 2u));
  let k = vec2<f32>(bitcast<vec2<i32>>(vec2<u32>(scales << 24u, scales << 16u)) >> vec2<u32>(24u));
  let a = vec2<f32>(d * k.x, d * k.y * 0.0625);
  let n = data(t, l, u, 1u + i, j);
  let hw = data(t, l, u, 9u + i / 2u, j);
  let h0 = hw[2u * (i % 2u)];
  let h1 = hw[2u * (i % 2u) + 1u];
  return Block(a, NO_MIN, 32.0, lo(n.x) + bits2x16(h0), lo(n.y) + bits2x16(h0 >> 2u), lo(n.z) + bits2x16(h0 >> 4u),
               lo(n.w) + bits2x16(h0 >> 6u), hi16(n.x) + 16.0 * bits2x16(h1), hi16(n.y) + 16.0 * bits2x16(h1 >> 2u),
               hi16(n.z) + 16.0 * bits2x16(h1 >> 4u), hi16(n.w) + 16.0 * bits2x16(h1 >> 6u));
}

fn halves16(w: vec4<u32>) -> array<vec4<f32>, 2> {
  return array<vec4<f32>, 2>(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
                             vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));
}

fn bf16s(w: vec4<u32>) -> array<vec4<f32>, 2> {
  return array<vec4<f32>, 2>(bitcast<vec4<f32>>(vec4<u32>(w.x << 16u, w.x & 0xffff0000u, w.y << 16u, w.y & 0xffff0000u)),
                             bitcast<vec4<f32>>(vec4<u32>(w.z << 16u, w.z & 0xffff0000u, w.w << 16u, w.w & 0xffff0000u)));
}

// 8 values of a texel of F16 or BF16.
fn floats8(w: vec4<u32>) -> array<vec4<f32>, 2> { return halves16(w); }  // if IS_F16
fn floats8(w: vec4<u32>) -> array<vec4<f32>, 2> { return bf16s(w); }  // unless IS_F16

fn unpack_floats(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block {
  let p0 = floats8(data(t, l, b, 0u, j));
  let p1 = floats8(data(t, l, b, 1u, j));
  let p2 = floats8(data(t, l, b, 2u, j));
  let p3 = floats8(data(t, l, b, 3u, j));
  return Block(vec2<f32>(1.0), NO_MIN, 0.0, p0[0], p0[1], p1[0], p1[1], p2[0], p2[1], p3[0], p3[1]);
}

// Block b of row j of invocation l of tile t (scale texels sc), of the module's type.
fn unpack(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block { return unpack_q4_0(t, l, b, j, sc); }  // if IS_Q4_0
fn unpack(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block { return unpack_q4_1(t, l, b, j, sc); }  // if IS_Q4_1
fn unpack(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block { return unpack_q5_0(t, l, b, j, sc); }  // if IS_Q5_0
fn unpack(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block { return unpack_q8_0(t, l, b, j, sc); }  // if IS_Q8_0
fn unpack(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block { return unpack_q4_k(t, l, b, j, sc); }  // if IS_Q4_K
fn unpack(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block { return unpack_q5_k(t, l, b, j, sc); }  // if IS_Q5_K
fn unpack(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block { return unpack_q6_k(t, l, b, j, sc); }  // if IS_Q6_K
fn unpack(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block { return unpack_floats(t, l, b, j, sc); }  // if IS_F16
fn unpack(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Block { return unpack_floats(t, l, b, j, sc); }  // if IS_BF16

// Q8_0 as the products read it: d, the 32 q.
struct Q8 {
  d: f32,
  q0: vec4<f32>, q1: vec4<f32>, q2: vec4<f32>, q3: vec4<f32>,
  q4: vec4<f32>, q5: vec4<f32>, q6: vec4<f32>, q7: vec4<f32>,
}

// The 16 int8 of a texel (one int8s each word).
struct Int8x16 {
  q0: vec4<f32>, q1: vec4<f32>, q2: vec4<f32>, q3: vec4<f32>,
}

fn int8s4(w: vec4<u32>) -> Int8x16 {
  return Int8x16(int8s(w.x), int8s(w.y), int8s(w.z), int8s(w.w));
}

fn q8_0(p: vec4<u32>, q: vec4<u32>, scale: u32) -> Q8 {
  let low = int8s4(p);
  let high = int8s4(q);
  return Q8(unpack2x16float(scale).x, low.q0, low.q1, low.q2, low.q3, high.q0, high.q1, high.q2, high.q3);
}

// A block's dot product dq in two halves: weights 0-15 (`low`), then on from it weights 16-31.
fn q8_0_low(q: Int8x16, v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>) -> f32 {
  return dot(q.q0, v0) + dot(q.q1, v1) + dot(q.q2, v2) + dot(q.q3, v3);
}

fn q8_0_high(low: f32, q: Int8x16, v4: vec4<f32>, v5: vec4<f32>, v6: vec4<f32>, v7: vec4<f32>) -> f32 {
  return low + dot(q.q0, v4) + dot(q.q1, v5) + dot(q.q2, v6) + dot(q.q3, v7);
}

fn q8_0_dot(w: Q8, a: Acts) -> f32 {
  return w.d * q8_0_high(q8_0_low(Int8x16(w.q0, w.q1, w.q2, w.q3), a.v0, a.v1, a.v2, a.v3),
                         Int8x16(w.q4, w.q5, w.q6, w.q7), a.v4, a.v5, a.v6, a.v7);
}

// The products' view of block b of row j of invocation l of tile t (scale texels sc), and its product with the
// block's activations a (half sums h).
alias Weights = Q4;  // if IS_Q4_1
alias Weights = Q8;  // if IS_Q8_0
alias Weights = Block;  // if BLOCKED
fn read_weights(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Weights { return q4_1(data(t, l, b, 0u, j), scale_word(sc, 0u, j)); }  // if IS_Q4_1
fn read_weights(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Weights { return q8_0(data(t, l, b, 0u, j), data(t, l, b, 1u, j), scale_word(sc, 0u, j)); }  // if IS_Q8_0
fn read_weights(t: u32, l: u32, b: u32, j: u32, sc: Scales) -> Weights { return unpack(t, l, b, j, sc); }  // if BLOCKED
fn weights_dot(w: Weights, a: Acts, h: vec2<f32>) -> f32 { return q4_1_dot(w, a); }  // if IS_Q4_1
fn weights_dot(w: Weights, a: Acts, h: vec2<f32>) -> f32 { return q8_0_dot(w, a); }  // if IS_Q8_0
fn weights_dot(w: Weights, a: Acts, h: vec2<f32>) -> f32 { return block_dot(w, a, h); }  // if BLOCKED

// The sums of the halves of a block's activations.
fn half_sums(a: Acts) -> vec2<f32> {
  return vec2<f32>(dot((a.v0 + a.v1) + (a.v2 + a.v3), vec4<f32>(1.0)), dot((a.v4 + a.v5) + (a.v6 + a.v7), vec4<f32>(1.0)));
}

// A block times its activations a (half sums h).
fn block_dot(w: Block, a: Acts, h: vec2<f32>) -> f32 {
  let low = dot(w.q0, a.v0) + dot(w.q1, a.v1) + dot(w.q2, a.v2) + dot(w.q3, a.v3);
  let high = dot(w.q4, a.v4) + dot(w.q5, a.v5) + dot(w.q6, a.v6) + dot(w.q7, a.v7);
  let c = w.m - w.off * (w.a * vec2<f32>(1.0, 16.0));
  return dot(vec4<f32>(w.a, c), vec4<f32>(low, high, h));
}

@compute @workgroup_size(256)
fn rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  let words = params.blocks * 8u;
  if (i >= params.tokens * words) {
    return;
  }
  let r = ids[i / words];
  let v = i % 8u;
  let b = (i % words) / 8u;
  let w = unpack(r / 64u, (r % 64u) / 8u, b, r % 8u, scales(r / 64u, (r % 64u) / 8u, b / UNIT));
  var q = array<vec4<f32>, 8>(w.q0, w.q1, w.q2, w.q3, w.q4, w.q5, w.q6, w.q7);
  let g = v / 4u;
  let p = w.a[g] * (q[v] - w.off * select(1.0, 16.0, g == 1u));
  out[i] = p + w.m[g];  // if HAS_MIN
  out[i] = p;  // unless HAS_MIN
}
