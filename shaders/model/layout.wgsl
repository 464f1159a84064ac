// The device layout of a quantized matrix (kvckpt_web.model.weights), made on the device from its GGUF bytes.
//
// A matrix of `rows` x (blocks * 32) weights, GGUF Q4_1 (20-byte blocks: f16 d, f16 m, 16 bytes of nibbles) or
// Q8_0 (34-byte blocks: f16 d, 32 int8), becomes one rgba32uint texture, 2^shift texels wide (texel i at
// (i & (2^shift - 1), i >> shift)). Rows are cut into tiles of 64: row r = 64 T + 8 l + j (j < 8) is row j of
// invocation l of tile T, as the products read them (quant.wgsl). Per tile and block, the texels of its 64 rows
// lie together, so the 8 invocations of a tile read 8 neighbouring texels at each step:
//   weights  texel (((T * blocks + b) * P + p) * 8 + j) * 8 + l: texel p of block b of row r; P = 1 for Q4_1 (the
//            16 nibble bytes as in GGUF: byte k holds weight k low, weight 16 + k high), P = 2 for Q8_0 (the 32
//            int8, 16 in each texel)
//   scales   texel scale_base + ((T * blocks + b) * 2 + h) * 8 + l, from scale_base = tiles * blocks * 64 * P: the
//            scale words of rows j = 4h .. 4h + 3 (x .. w): Q4_1 pack2x16float(d, m), Q8_0 pack2x16float(d, 0)
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
  blocks: u32,
  shift: u32,
  scale_base: u32,
  texels: u32,       // scale_base + the scale texels
  q8_0: u32,         // 1: Q8_0 blocks, 0: Q4_1
  first: u32,        // the piece's first row (a multiple of 64)
  count: u32,        // its rows
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> raw: array<u32>;
@group(0) @binding(2) var out: texture_storage_2d<rgba32uint, write>;

// Whether row r is in the piece.
fn in_piece(r: u32) -> bool {
  return r >= params.first && r < params.first + params.count;
}

// 16-bit half h of the raw bytes.
fn half(h: u32) -> u32 {
  return (raw[h >> 1u] >> ((h & 1u) * 16u)) & 0xffffu;
}

// Word w of the weights of block k (Q8_0: 2 int8 halves; Q4_1: 8 nibbles).
fn weight_word(k: u32, w: u32) -> u32 {
  if (params.q8_0 == 1u) {
    let h = 17u * k + 1u + 2u * w;
    return half(h) | (half(h + 1u) << 16u);
  }
  return raw[5u * k + 1u + w];
}

fn scale_word(k: u32) -> u32 {
  if (params.q8_0 == 1u) {
    return half(17u * k);
  }
  return raw[5u * k];
}

@compute @workgroup_size(256)
fn tile(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i >= params.texels) {
    return;
  }
  var v = vec4<u32>(0u);
  if (i < params.scale_base) {
    let texels_per_block = 1u + params.q8_0;
    let l = i % 8u;
    let j = (i / 8u) % 8u;
    let p = (i / 64u) % texels_per_block;
    let tb = i / (64u * texels_per_block);
    let r = 64u * (tb / params.blocks) + 8u * l + j;
    if (!in_piece(64u * (tb / params.blocks))) {
      return;
    }
    if (r < params.rows) {
      let k = (r - params.first) * params.blocks + tb % params.blocks;
      v = vec4<u32>(weight_word(k, 4u * p), weight_word(k, 4u * p + 1u), weight_word(k, 4u * p + 2u),
                    weight_word(k, 4u * p + 3u));
    }
  } else {
    let s = i - params.scale_base;
    let l = s % 8u;
    let h = (s / 8u) % 2u;
    let tb = s / 16u;
    let r0 = 64u * (tb / params.blocks) + 8u * l + 4u * h;
    if (!in_piece(64u * (tb / params.blocks))) {
      return;
    }
    for (var k = 0u; k < 4u; k++) {
      if (r0 + k < params.rows) {
        v[k] = scale_word((r0 + k - params.first) * params.blocks + tb % params.blocks);
      }
    }
  }
  textureStore(out, vec2<u32>(i & ((1u << params.shift) - 1u), i >> params.shift), v);
}
