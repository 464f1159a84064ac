// RMSNorm: out[t, i] = x[first + t, i] / sqrt(mean_i(x[first + t, :]^2) + eps) * weight[i], for each token t.
//
// Bindings (group 0):
//   0  uniform              Params
//   1  storage, read        x       (first + tokens, dim) f32, row-major
//   2  storage, read        weight  (dim) f32
//   3  storage, read_write  out     (tokens, dim) f32, row-major (may be bound as uniform by the next product)
// One invocation per token sums the squares in index order (deterministic); dim is small (576 here).

struct Params {
  tokens: u32,
  dim: u32,
  first: u32,
  eps: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn rms_norm(@builtin(global_invocation_id) gid: vec3<u32>) {
  let t = gid.x;
  if (t >= params.tokens) {
    return;
  }
  let base = (params.first + t) * params.dim;
  var squares = 0.0;
  for (var i = 0u; i < params.dim; i = i + 1u) {
    squares = squares + x[base + i] * x[base + i];
  }
  let scale = 1.0 / sqrt(squares / f32(params.dim) + params.eps);
  for (var i = 0u; i < params.dim; i = i + 1u) {
    out[t * params.dim + i] = x[base + i] * scale * weight[i];
  }
}
