// RMSNorm: out[t, i] = x[t, i] / sqrt(mean_i(x[t, :]^2) + eps) * weight[i], for each token t.
//
// Bindings (group 0):
//   0  uniform                  Params
//   1  storage, read            x       (tokens, dim) f32, row-major
//   2  storage, read            weight  (dim) f32
//   3  storage texture, write   out     token t's features 4i .. 4i + 3 in texel (i, t), as f32 bits (the input of
//                                       the products: quant.wgsl)
// One invocation per token sums the squares in index order (deterministic); dim is small (576 here), a multiple
// of 4.

struct Params {
  tokens: u32,
  dim: u32,
  eps: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var out: texture_storage_2d<rgba32uint, write>;

@compute @workgroup_size(64)
fn rms_norm(@builtin(global_invocation_id) gid: vec3<u32>) {
  let t = gid.x;
  if (t >= params.tokens) {
    return;
  }
  let base = t * params.dim;
  var squares = 0.0;
  for (var i = 0u; i < params.dim; i = i + 1u) {
    squares = squares + x[base + i] * x[base + i];
  }
  let scale = 1.0 / sqrt(squares / f32(params.dim) + params.eps);
  for (var i = 0u; i < params.dim; i = i + 4u) {
    let v = vec4<f32>(x[base + i], x[base + i + 1u], x[base + i + 2u], x[base + i + 3u]);
    let g = vec4<f32>(weight[i], weight[i + 1u], weight[i + 2u], weight[i + 3u]);
    textureStore(out, vec2<u32>(i / 4u, t), bitcast<vec4<u32>>(v * scale * g));
  }
}
