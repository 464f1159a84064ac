// Row-wise kernels of the variations on the llama block (kvckpt_web/model/row_kernels.py): Qwen2's q/k/v biases,
// Qwen 3's and Gemma 3's per-head RMSNorm of Q and K, Gemma 3's embedding scale and its norms after attention and
// the FFN; and the placing of one matrix's product beside those of matrices of other types.
//
// Bindings (group 0), each entry binding the first of them it needs:
//   0  uniform              Params
//   1  storage, read_write  x  f32 [tokens, width], row-major: changed in place
//   2  storage, read        w  f32: a bias row (add_bias) or norm weights (head_norm: Q's head_dim, then K's;
//                              norm_add: width), or (place) rows of `part` values
//   3  storage, read        y  f32 [tokens, width] (norm_add)
//
// Every sum of squares runs in index order in one invocation: the same inputs give the same bits.

struct Params {
  tokens: u32,
  width: u32,
  heads: u32,     // head_norm: the Q and K heads of a row, from its start
  head_dim: u32,  // head_norm
  q_heads: u32,   // head_norm: the first q_heads heads take the first head_dim weights, the others the next
  value: f32,     // scale: the factor; head_norm, norm_add: the RMSNorm epsilon
  offset: u32,    // place: where in a row of x the part goes
  part: u32,      // place: values per row of w
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> y: array<f32>;

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
  return gid.x + gid.y * nwg.x * 256u;
}

// x[t, i] += w[i]: one invocation per value.
@compute @workgroup_size(256)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = index(gid, nwg);
  if (i < params.tokens * params.width) {
    x[i] += w[i % params.width];
  }
}

// x[t, i] *= value: one invocation per value.
@compute @workgroup_size(256)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = index(gid, nwg);
  if (i < params.tokens * params.width) {
    x[i] *= params.value;
  }
}

// RMSNorm of each of the first `heads` heads of each row of x, in place: one invocation per (token, head).
@compute @workgroup_size(256)
fn head_norm(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = index(gid, nwg);
  if (i >= params.tokens * params.heads) {
    return;
  }
  let head = i % params.heads;
  let base = (i / params.heads) * params.width + head * params.head_dim;
  var squares = 0.0;
  for (var d = 0u; d < params.head_dim; d++) {
    squares += x[base + d] * x[base + d];
  }
  let s = 1.0 / sqrt(squares / f32(params.head_dim) + params.value);
  let weights = select(0u, params.head_dim, head >= params.q_heads);
  for (var d = 0u; d < params.head_dim; d++) {
    x[base + d] = x[base + d] * s * w[weights + d];
  }
}

// x[t] += RMSNorm(y[t]) * w: one invocation per token.
@compute @workgroup_size(256)
fn norm_add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let t = index(gid, nwg);
  if (t >= params.tokens) {
    return;
  }
  let base = t * params.width;
  var squares = 0.0;
  for (var i = 0u; i < params.width; i++) {
    squares += y[base + i] * y[base + i];
  }
  let s = 1.0 / sqrt(squares / f32(params.width) + params.value);
  for (var i = 0u; i < params.width; i++) {
    x[base + i] += y[base + i] * s * w[i];
  }
}

// x[t, offset + i] = w[t, i] for i < part: one invocation per value of w.
@compute @workgroup_size(256)
fn place(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = index(gid, nwg);
  if (i < params.tokens * params.part) {
    x[(i / params.part) * params.width + params.offset + i % params.part] = w[i];
  }
}
