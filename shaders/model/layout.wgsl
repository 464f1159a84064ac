// The device layout of a quantized matrix (kvckpt_web.model.weights), made on the device from its GGUF bytes.
//
// A matrix of `rows` x (units * U) weights in GGUF blocks (a unit: U = 32 weights, or U = 256 for the K-quants)
// becomes one rgba32uint texture, 2^shift texels wide (texel i at (i & (2^shift - 1), i >> shift)). Rows are cut
// into tiles of 64: row r = 64 T + 8 l + j (j < 8) is row j of invocation l of tile T, as the products read them
// (quant.wgsl). Each unit of a row is P data texels and S scale words (P, S per type: weights.DEVICE_FORMS). Per
// tile and unit, the texels of its 64 rows lie together, so the 8 invocations of a tile read 8 neighbouring
// texels at each step:
//   data     texel (((T * units + u) * P + p) * 8 + j) * 8 + l: data texel p of unit u of row r
//   scales   texel scale_base + (((T * units + u) * S + s) * 2 + h) * 8 + l, from scale_base = tiles * units * 64 *
//            P: scale word s of rows j = 4h .. 4h + 3 (x .. w)
// "Nibbles" below are 16 bytes of 4-bit values, byte k holding weight k low and weight 16 + k high (Q4_1's order):
//   Q4_1  P 1 nibbles, S 1 pack2x16float(d, m)          Q8_0  P 2 the 32 int8, S 1 (d, 0)
//   Q4_0  P 1 nibbles, S 1 (d, 0)                        Q5_0  P 1 nibbles, S 2: (d, 0), qh (bit k: weight k's 5th)
//   F16, BF16  P 4: the 32 values as in GGUF, S 0
//   Q4_K  P 9: texel 0 the GGUF header (d, dmin, 12 bytes of 6-bit scales and mins), texel 1 + i the nibbles of
//         sub-block i (weights 32 i .. 32 i + 31), S 0
//   Q5_K  P 11: as Q4_K, then 2 texels of 8 words: word i bit k = the 5th bit of weight k of sub-block i, S 0
//   Q6_K  P 13: texel 0 the 16 int8 scales, texel 1 + i the low 4 bits of sub-block i as nibbles, then 4 texels of
//         16 words: word 2 i + g the high 2 bits of weights 16 g .. 16 g + 15 of sub-block i, weight 16 g + 4 w + k
//         at bit 8 k + 2 w; S 1 (d, 0)
// Texels of rows past `rows` are zero.
//
// Bindings (group 0), entry `tile`, one invocation per texel (2-D grid of 256-invocation workgroups), each
// dispatch writing the texels of one piece of rows (whole tiles, or the rest), the others left as they are:
//   0  uniform                  Params
//   1  storage, read            raw  the GGUF bytes of rows first .. first + count - 1, back to back (padded to
//                                    whole words)
//   2  storage texture, write   out

struct Params {
  rows: u32,
  units: u32,
  shift: u32,
  scale_base: u32,
  texels: u32,       // scale_base + the scale texels
  ggml_type: u32,
  first: u32,        // the piece's first row (a multiple of 64)
  count: u32,        // its rows
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> raw: array<u32>;
@group(0) @binding(2) var out: texture_storage_2d<rgba32uint, write>;

const Q4_0 = 2u;
const Q4_1 = 3u;
const Q5_0 = 6u;
const Q8_0 = 8u;
const Q4_K = 12u;
const Q5_K = 13u;
const Q6_K = 14u;

// Whether row r is in the piece.
fn in_piece(r: u32) -> bool {
  return r >= params.first && r < params.first + params.count;
}

// The 4 raw bytes from byte offset o (any alignment).
fn word_at(o: u32) -> u32 {
  let s = (o & 3u) * 8u;
  let low = raw[o >> 2u] >> s;
  return select(low | (raw[(o >> 2u) + 1u] << (32u - s)), low, s == 0u);
}

fn byte_at(o: u32) -> u32 {
  return (raw[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

// (P data texels, S scale words, bytes) of a unit of the type.
fn form() -> vec3<u32> {
  switch params.ggml_type {
    case 2u: { return vec3<u32>(1u, 1u, 18u); }
    case 3u: { return vec3<u32>(1u, 1u, 20u); }
    case 6u: { return vec3<u32>(1u, 2u, 22u); }
    case 8u: { return vec3<u32>(2u, 1u, 34u); }
    case 12u: { return vec3<u32>(9u, 0u, 144u); }
    case 13u: { return vec3<u32>(11u, 0u, 176u); }
    case 14u: { return vec3<u32>(13u, 1u, 210u); }
    default: { return vec3<u32>(4u, 0u, 64u); }  // F16, BF16: 32 values
  }
}

// Nibbles word w of the 32 weights whose low 4 bits are bits s .. s + 3 of bytes o .. o + 15 (weights 0-15) and
// o + 16 .. o + 31 (16-31).
fn nibbles(o: u32, s: u32, w: u32) -> u32 {
  return ((word_at(o + 4u * w) >> s) & 0x0f0f0f0fu) | (((word_at(o + 16u + 4u * w) >> s) & 0x0f0f0f0fu) << 4u);
}

// Q5_K's word i: bit k = bit i of byte k of its 32 bytes of high bits (from o).
fn q5_k_high(o: u32, i: u32) -> u32 {
  var v = 0u;
  for (var k = 0u; k < 32u; k++) {
    v |= ((byte_at(o + k) >> i) & 1u) << k;
  }
  return v;
}

// Q6_K's high-bits word e (2 i + g) of the block at o.
fn q6_k_high(o: u32, e: u32) -> u32 {
  let i = e / 2u;
  let base = o + 128u + 32u * (i / 4u) + 16u * (e % 2u);
  var v = 0u;
  for (var n = 0u; n < 16u; n++) {
    v |= ((byte_at(base + n) >> (2u * (i % 4u))) & 3u) << (8u * (n % 4u) + 2u * (n / 4u));
  }
  return v;
}

// Data word w of unit k.
fn data_word(k: u32, w: u32) -> u32 {
  let o = k * form().z;
  switch params.ggml_type {
    case 2u, 8u: { return word_at(o + 2u + 4u * w); }
    case 3u: { return word_at(o + 4u + 4u * w); }
    case 6u: { return word_at(o + 6u + 4u * w); }
    case 12u, 13u: {
      if (w < 4u) {
        return word_at(o + 4u * w);
      }
      if (w >= 36u) {
        return q5_k_high(o + 16u, w - 36u);
      }
      let i = (w - 4u) / 4u;
      return nibbles(o + select(16u, 48u, params.ggml_type == Q5_K) + 32u * (i / 2u), 4u * (i % 2u), w % 4u);
    }
    case 14u: {
      if (w < 4u) {
        return word_at(o + 192u + 4u * w);
      }
      if (w >= 36u) {
        return q6_k_high(o, w - 36u);
      }
      let i = (w - 4u) / 4u;
      return nibbles(o + 64u * (i / 4u) + 32u * (i % 2u), 4u * ((i % 4u) / 2u), w % 4u);
    }
    default: { return word_at(o + 4u * w); }
  }
}

// Scale word s of unit k.
fn scale_word(k: u32, s: u32) -> u32 {
  let o = k * form().z;
  switch params.ggml_type {
    case 3u: { return word_at(o); }
    case 6u: { return select(word_at(o) & 0xffffu, word_at(o + 2u), s == 1u); }
    case 14u: { return word_at(o + 208u) & 0xffffu; }
    default: { return word_at(o) & 0xffffu; }  // Q4_0, Q8_0
  }
}

@compute @workgroup_size(256)
fn tile(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i >= params.texels) {
    return;
  }
  let f = form();
  var v = vec4<u32>(0u);
  if (i < params.scale_base) {
    let l = i % 8u;
    let j = (i / 8u) % 8u;
    let p = (i / 64u) % f.x;
    let tu = i / (64u * f.x);
    let r = 64u * (tu / params.units) + 8u * l + j;
    if (!in_piece(64u * (tu / params.units))) {
      return;
    }
    if (r < params.rows) {
      let k = (r - params.first) * params.units + tu % params.units;
      v = vec4<u32>(data_word(k, 4u * p), data_word(k, 4u * p + 1u), data_word(k, 4u * p + 2u),
                    data_word(k, 4u * p + 3u));
    }
  } else {
    let n = i - params.scale_base;
    let l = n % 8u;
    let h = (n / 8u) % 2u;
    let s = (n / 16u) % f.y;
    let tu = n / (16u * f.y);
    let r0 = 64u * (tu / params.units) + 8u * l + 4u * h;
    if (!in_piece(64u * (tu / params.units))) {
      return;
    }
    for (var k = 0u; k < 4u; k++) {
      if (r0 + k < params.rows) {
        v[k] = scale_word((r0 + k - params.first) * params.units + tu % params.units, s);
      }
    }
  }
  textureStore(out, vec2<u32>(i & ((1u << params.shift) - 1u), i >> params.shift), v);
}
