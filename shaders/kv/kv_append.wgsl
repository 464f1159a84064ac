// K/V append kernel: write the K and V rows of one forward pass into one layer's pages.
//
// Bindings (group 0):
//   0  uniform              Params
//   1  storage, read_write  pages      one layer: [num_total_pages, 2, num_kv_heads, page_size, head_dim],
//                                      as atomic u32 words (16-bit halves of a shared word are merged atomically)
//   2  storage, read        positions  per appended token: page_id * page_size + slot in page
//   3  storage, read        kv         K rows then V rows, each (num_tokens, num_kv_heads, head_dim) elements;
//                                      V starts at element v_elem_offset
// Invocation i handles (kv, token, head, unit); a unit is one u32 word of a row when rows are word-aligned
// (aligned = 1), else one 16-bit element (odd head_dim with 16-bit elements). Values are never interpreted.

struct Params {
  num_tokens: u32,
  num_kv_heads: u32,
  head_dim: u32,
  page_size: u32,
  elem_shift: u32,      // log2(elements per word): 1 for 16-bit, 0 for 32-bit elements
  aligned: u32,         // 1 when every row starts on a word boundary
  v_elem_offset: u32,   // num_tokens * num_kv_heads * head_dim
  units_per_row: u32,   // head_dim >> elem_shift when aligned, else head_dim
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> pages: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read> kv: array<u32>;

@compute @workgroup_size(256)
fn append(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  let rows_per_kv = params.num_tokens * params.num_kv_heads;
  if (i >= 2u * rows_per_kv * params.units_per_row) {
    return;
  }
  let row = i / params.units_per_row;
  let unit = i % params.units_per_row;
  let which = row / rows_per_kv;              // 0 = K, 1 = V
  let token = (row % rows_per_kv) / params.num_kv_heads;
  let head = row % params.num_kv_heads;
  let position = positions[token];
  let page = position / params.page_size;
  let slot = position % params.page_size;
  let dst_elem = ((page * 2u + which) * params.num_kv_heads + head) * params.page_size * params.head_dim
                 + slot * params.head_dim;
  let src_elem = which * params.v_elem_offset + (token * params.num_kv_heads + head) * params.head_dim;
  if (params.aligned == 1u) {
    atomicStore(&pages[(dst_elem >> params.elem_shift) + unit], kv[(src_elem >> params.elem_shift) + unit]);
  } else {
    let s = src_elem + unit;
    let d = dst_elem + unit;
    let half = (kv[s >> 1u] >> ((s & 1u) * 16u)) & 0xffffu;
    let shift = (d & 1u) * 16u;
    atomicAnd(&pages[d >> 1u], ~(0xffffu << shift));
    atomicOr(&pages[d >> 1u], half << shift);
  }
}
