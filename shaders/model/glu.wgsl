// The gated FFN's hidden activations from the gate/up rows (kvckpt_web/model/row_kernels.py), where no fused product
// makes them: hidden[t, r] = act(g[t, r]) * u[t, r], act SiLU (SwiGLU: silu(g) = g / (1 + exp(-g))) or GELU in its
// tanh approximation (GeGLU: ggml_gelu, Gemma's gelu_pytorch_tanh: gelu(g) = 0.5 g (1 + tanh(sqrt(2 / pi) (g +
// 0.044715 g^3)))).
//
// Bindings (group 0):
//   0  uniform                  Params
//   1  storage, read            gate_up  f32 [tokens, 2 * ffn]: per token the ffn gate rows, then the ffn up rows
//   2  storage texture, write   hidden   token t's activations 4i .. 4i + 3 in texel (i, t), as f32 bits (the input
//                                        of the down product: quant.wgsl)
// One invocation per texel (four activations).

struct Params {
  tokens: u32,
  ffn: u32,   // a multiple of 4
  gelu: u32,  // 1: GeGLU, 0: SwiGLU
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> gate_up: array<vec4<f32>>;
@group(0) @binding(2) var hidden: texture_storage_2d<rgba32uint, write>;

const SQRT_2_OVER_PI: f32 = 0.7978845608028654;

fn gelu(g: vec4<f32>) -> vec4<f32> {
  // tanh through exp, its argument clamped where tanh is +-1 in f32 (WGSL's tanh may overflow for large ones)
  let a = clamp(SQRT_2_OVER_PI * (g + 0.044715 * g * g * g), vec4<f32>(-15.0), vec4<f32>(15.0));
  let e = exp(2.0 * a);
  return 0.5 * g * (1.0 + (e - 1.0) / (e + 1.0));
}

fn silu(g: vec4<f32>) -> vec4<f32> {
  return g / (1.0 + exp(-g));
}

@compute @workgroup_size(256)
fn glu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  let quads = params.ffn / 4u;
  if (i >= params.tokens * quads) {
    return;
  }
  let t = i / quads;
  let q = i % quads;
  let row = t * 2u * quads;
  let g = gate_up[row + q];
  var a = silu(g);
  if (params.gelu == 1u) {
    a = gelu(g);
  }
  textureStore(hidden, vec2<u32>(q, t), bitcast<vec4<u32>>(a * gate_up[row + quads + q]));
}
