// The attention output from paged_attention.wgsl's partial sums: per (token, query head), its splits combined in
// split order (the same bits on every run).
//
// Specialised by kvckpt_web.specialize with QUADS = head_dim / 4 and WG, the workgroup size.
//
// Bindings (group 0):
//   0  uniform              Params
//   1  storage, read        partial  per (token, query head, split) QUADS + 1 vec4 (see paged_attention.wgsl)
//   2  storage, read        tokens   per token: vec4(position in its sequence, ..., keys per split) as in
//                                    paged_attention.wgsl
//   3  storage texture, write  out   row (token) t, texel head * QUADS + c: the output's vec4 c of that query head, as
//                                    f32 bits (the input of the o product: quant.wgsl)
//
// A token at position p has p / keys_per_split + 1 splits (its sequence's keys_per_split). Split s's record holds its maximum score m_s, its
// sum of weights l_s = sum exp(score - m_s) and its weighted V sum a_s; with m the maximum of the m_s, the output
// is sum a_s exp(m_s - m) / sum l_s exp(m_s - m). Invocation i writes one vec4 of one (token, query head) row.

struct Params {
  num_rows: u32,  // num_tokens * num_qo_heads
  num_qo_heads: u32,
  unused: u32,
  num_splits: u32,  // the most splits a token has: the records' stride
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> partial: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> tokens: array<vec4<u32>>;
@group(0) @binding(3) var out: texture_storage_2d<rgba32uint, write>;

const LOWEST: f32 = -3.4028234e38;

@compute @workgroup_size(WG)
fn merge(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= params.num_rows * QUADS) {
    return;
  }
  let row = i / QUADS;
  let c = i % QUADS;
  let token_record = tokens[row / params.num_qo_heads];
  let splits = token_record.x / token_record.w + 1u;
  let base = row * params.num_splits * (QUADS + 1u);
  var m = LOWEST;
  for (var s = 0u; s < splits; s++) {
    m = max(m, partial[base + s * (QUADS + 1u) + QUADS].x);
  }
  var total = 0.0;
  var acc = vec4<f32>(0.0);
  for (var s = 0u; s < splits; s++) {
    let at = base + s * (QUADS + 1u);
    let stats = partial[at + QUADS];
    let f = exp(stats.x - m);
    total += stats.y * f;
    acc += partial[at + c] * f;
  }
  let token = row / params.num_qo_heads;
  textureStore(out, vec2<u32>((row % params.num_qo_heads) * QUADS + c, token), bitcast<vec4<u32>>(acc / total));
}
