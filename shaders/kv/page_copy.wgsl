// Page copy kernels: move whole KV pages between one layer's page buffer and a dense page group.
//
//   pack:    dense[page i] = pages[page_table[i]], with every element of the last page whose token
//            slot is >= tail_tokens set to zero (stale data of a reused page never leaves the cache).
//   scatter: pages[page_table[i]] = dense[page i], whole pages (as TVM's import).
//
// Bindings (group 0):
//   0  uniform              Params
//   1  storage, read_write  pages       one layer: [num_total_pages, 2, num_kv_heads, page_size, head_dim]
//   2  storage, read        page_table  physical page ids; page i of this call is page_table[table_offset + i]
//   3  storage, read_write  dense       page group (1, num_logical_pages, 2, num_kv_heads, page_size, head_dim),
//                                       page 0 of this call at word dense_word_offset
// Elements are 16 or 32 bits wide; values are never interpreted, so float16/bfloat16 need no shader-f16.
// pack and scatter see the buffers as arrays of u32 words, invocation i handling word i of the call;
// pack4 and scatter4 (for pages of a multiple of 4 words and a dense offset of a multiple of 4 words)
// bind the same buffers as arrays of vec4<u32>, invocation i handling words 4i..4i+3: a quarter of the
// invocations and of their index arithmetic. Params stay in words for all four. 2-D grid, linearised.

struct Params {
  num_pages: u32,          // logical pages in this call
  words_per_page: u32,     // u32 words in one page of one layer
  tail_tokens: u32,        // valid token slots in the last page of this call (page_size when full)
  elem_shift: u32,         // log2(elements per word): 1 for 16-bit, 0 for 32-bit elements
  head_dim: u32,
  page_size: u32,
  dense_word_offset: u32,
  table_offset: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> pages: array<u32>;
@group(0) @binding(2) var<storage, read> page_table: array<u32>;
@group(0) @binding(3) var<storage, read_write> dense: array<u32>;
// The same bindings as vec4 units, for pack4 and scatter4 (an entry point uses one view or the other).
@group(0) @binding(1) var<storage, read_write> pages4: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> dense4: array<vec4<u32>>;

fn invocation(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
  return gid.x + gid.y * nwg.x * 256u;
}

// Bits of word w (within a page) that belong to token slots < tail_tokens.
fn tail_mask(w: u32) -> u32 {
  let per_word = 1u << params.elem_shift;
  let bits = 32u >> params.elem_shift;
  var mask = 0u;
  for (var j = 0u; j < per_word; j = j + 1u) {
    let elem = (w << params.elem_shift) + j;
    let slot = (elem / params.head_dim) % params.page_size;
    if (slot < params.tail_tokens) {
      if (bits == 32u) {
        mask = 0xffffffffu;
      } else {
        mask = mask | (((1u << bits) - 1u) << (j * bits));
      }
    }
  }
  return mask;
}

// Where an invocation lands when pages hold `per_page` units (words, or vec4s): unit `i` of the call,
// unit `offset` of the call's logical page `page`; `inside` is false past the call's last page.
struct Unit {
  i: u32,
  page: u32,
  offset: u32,
  inside: bool,
}

fn locate(gid: vec3<u32>, nwg: vec3<u32>, per_page: u32) -> Unit {
  let i = invocation(gid, nwg);
  let page = i / per_page;
  return Unit(i, page, i - page * per_page, page < params.num_pages);
}

// Index of unit `u` in the layer's page buffer.
fn paged(u: Unit, per_page: u32) -> u32 {
  return page_table[params.table_offset + u.page] * per_page + u.offset;
}

// Whether `u` lies in the call's last page and that page has unused token slots.
fn in_partial_page(u: Unit) -> bool {
  return u.page + 1u == params.num_pages && params.tail_tokens < params.page_size;
}

@compute @workgroup_size(256)
fn pack(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let u = locate(gid, nwg, params.words_per_page);
  if (!u.inside) {
    return;
  }
  var word = pages[paged(u, params.words_per_page)];
  if (in_partial_page(u)) {
    word = word & tail_mask(u.offset);
  }
  dense[params.dense_word_offset + u.i] = word;
}

@compute @workgroup_size(256)
fn scatter(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let u = locate(gid, nwg, params.words_per_page);
  if (!u.inside) {
    return;
  }
  pages[paged(u, params.words_per_page)] = dense[params.dense_word_offset + u.i];
}

@compute @workgroup_size(256)
fn pack4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let per_page = params.words_per_page >> 2u;
  let u = locate(gid, nwg, per_page);
  if (!u.inside) {
    return;
  }
  var unit = pages4[paged(u, per_page)];
  if (in_partial_page(u)) {
    let w = u.offset << 2u;
    unit = unit & vec4<u32>(tail_mask(w), tail_mask(w + 1u), tail_mask(w + 2u), tail_mask(w + 3u));
  }
  dense4[(params.dense_word_offset >> 2u) + u.i] = unit;
}

@compute @workgroup_size(256)
fn scatter4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let per_page = params.words_per_page >> 2u;
  let u = locate(gid, nwg, per_page);
  if (!u.inside) {
    return;
  }
  pages4[paged(u, per_page)] = dense4[(params.dense_word_offset >> 2u) + u.i];
}
