// What a sampled pick needs of the logits (kvckpt_web/model/shortlist.py), on the GPU, so the host reads back
// a few statistics and the highest scores rather than the whole vocabulary.
//
// The scores are a copy of the logits with the penalties applied to the listed tokens; every pass after them
// reads the scores. Passes (one dispatch each, in this order):
//   scale:       scores[id] *= (scores[id] > 0 ? params.above : params.below) for each listed id (repetition
//                penalty: one correctly rounded f32 product, which the host reproduces)
//   shift:       scores[id] -= offset for each listed (id, f32 bits of offset) (presence and frequency penalties:
//                one correctly rounded f32 difference, in a dispatch of its own so that no compiler fuses it
//                with the product into one rounding)
//   chunk_max:   invocation c: the largest of scores[c * chunk ..] into maxima[c]
//   chunk_sums:  invocation c: with top the largest of all maxima and d = (top - score) * inv_t per score of its
//                chunk, the sum of exp(-d) over the chunk and, per window j, how many scores have
//                d <= WINDOWS[j] and the sum of their exp(-d): into partial[c * STRIDE ..]
//   merge:       one invocation: stats = (total, counts[WINDOWS], masses[WINDOWS], edge), each summed over the
//                chunks in chunk order (the same inputs give the same bits); edge the first window that holds
//                params.top_k scores (top_k > 0) or params.fraction of the total (and a slack), else infinity
//   collect:     invocation c: each score of its chunk with d <= edge (stats[STRIDE], which the host may
//                overwrite) appended as (f32 bits, id) to pairs, at the index an atomic counter hands out (the
//                host sorts them)
// Every sum runs in index order in one invocation. Counts are f32 (exact below 2^24).
// Bindings (group 0):
//   scale:       0 uniform Params, 1 storage read_write scores_rw (n) f32, 2 storage read listed (u32 ids)
//   shift:       0 uniform Params, 1 storage read_write scores_rw (n) f32, 2 storage read shifted (vec2<u32>)
//   chunk_max:   0 uniform Params, 1 storage read scores, 2 storage read_write maxima (chunks) f32
//   chunk_sums:  0 uniform Params, 1 storage read scores, 2 storage read maxima_in, 3 storage read_write partial
//   merge:       0 uniform Params, 1 storage read partial_in, 2 storage read_write stats (STRIDE + 1) f32
//   collect:     0 uniform Params, 1 storage read scores, 2 storage read maxima_in, 3 storage read_write count
//                (atomic u32, zeroed before), 4 storage read_write pairs (n) vec2<u32>, 5 storage read stats_in

struct Params {
  n: u32,
  chunk: u32,
  chunks: u32,
  listed: u32,    // scale, shift: how many ids are listed
  inv_t: f32,     // 1 / temperature, clamped to finite f32
  fraction: f32,  // merge: the part of the total the pick needs (with the slack)
  above: f32,     // scale: the factor of a score above 0
  below: f32,     // scale: the factor of a score at or below 0
  top_k: u32,     // merge: the scores the pick needs (0: a fraction of the total)
}

const WINDOW_COUNT: u32 = 8u;
const WINDOWS = array<f32, 8>(2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0);  // shortlist.WINDOWS
const STRIDE: u32 = 17u;  // 1 + 2 * WINDOW_COUNT

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> scores_rw: array<f32>;
@group(0) @binding(2) var<storage, read> listed: array<u32>;
@group(0) @binding(2) var<storage, read> shifted: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read> scores: array<f32>;
@group(0) @binding(2) var<storage, read_write> maxima: array<f32>;
@group(0) @binding(2) var<storage, read> maxima_in: array<f32>;
@group(0) @binding(3) var<storage, read_write> partial: array<f32>;
@group(0) @binding(1) var<storage, read> partial_in: array<f32>;
@group(0) @binding(2) var<storage, read_write> stats: array<f32>;
@group(0) @binding(3) var<storage, read_write> count: atomic<u32>;
@group(0) @binding(4) var<storage, read_write> pairs: array<vec2<u32>>;
@group(0) @binding(5) var<storage, read> stats_in: array<f32>;

@compute @workgroup_size(64)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>) {
  if (gid.x >= params.listed) {
    return;
  }
  let id = listed[gid.x];
  let s = scores_rw[id];
  scores_rw[id] = s * select(params.below, params.above, s > 0.0);
}

@compute @workgroup_size(64)
fn shift(@builtin(global_invocation_id) gid: vec3<u32>) {
  if (gid.x >= params.listed) {
    return;
  }
  let pair = shifted[gid.x];
  scores_rw[pair.x] = scores_rw[pair.x] - bitcast<f32>(pair.y);
}

@compute @workgroup_size(64)
fn chunk_max(@builtin(global_invocation_id) gid: vec3<u32>) {
  let c = gid.x;
  if (c >= params.chunks) {
    return;
  }
  let end = min(params.n, (c + 1u) * params.chunk);
  var best = scores[c * params.chunk];
  for (var i = c * params.chunk + 1u; i < end; i = i + 1u) {
    best = max(best, scores[i]);
  }
  maxima[c] = best;
}

fn top_score() -> f32 {
  var best = maxima_in[0];
  for (var c = 1u; c < params.chunks; c = c + 1u) {
    best = max(best, maxima_in[c]);
  }
  return best;
}

@compute @workgroup_size(64)
fn chunk_sums(@builtin(global_invocation_id) gid: vec3<u32>) {
  let c = gid.x;
  if (c >= params.chunks) {
    return;
  }
  let top = top_score();
  var total = 0.0;
  var counts = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
  var masses = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
  let end = min(params.n, (c + 1u) * params.chunk);
  for (var i = c * params.chunk; i < end; i = i + 1u) {
    let d = (top - scores[i]) * params.inv_t;
    let w = exp(-d);
    total = total + w;
    for (var j = 0u; j < WINDOW_COUNT; j = j + 1u) {
      if (d <= WINDOWS[j]) {
        counts[j] = counts[j] + 1.0;
        masses[j] = masses[j] + w;
      }
    }
  }
  let base = c * STRIDE;
  partial[base] = total;
  for (var j = 0u; j < WINDOW_COUNT; j = j + 1u) {
    partial[base + 1u + j] = counts[j];
    partial[base + 1u + WINDOW_COUNT + j] = masses[j];
  }
}

@compute @workgroup_size(1)
fn merge() {
  for (var j = 0u; j < STRIDE; j = j + 1u) {
    var sum = 0.0;
    for (var c = 0u; c < params.chunks; c = c + 1u) {
      sum = sum + partial_in[c * STRIDE + j];
    }
    stats[j] = sum;
  }
  var edge = bitcast<f32>(0x7f800000u | (params.top_k & 0u));  // infinity, the whole vocabulary (not a constant)
  for (var j = WINDOW_COUNT; j > 0u; j = j - 1u) {
    let holds = select(stats[WINDOW_COUNT + j] >= params.fraction * stats[0], stats[j] >= f32(params.top_k),
                       params.top_k > 0u);
    if (holds) {
      edge = WINDOWS[j - 1u];
    }
  }
  stats[STRIDE] = edge;
}

@compute @workgroup_size(64)
fn collect(@builtin(global_invocation_id) gid: vec3<u32>) {
  let c = gid.x;
  if (c >= params.chunks) {
    return;
  }
  let top = top_score();
  let edge = stats_in[STRIDE];
  let end = min(params.n, (c + 1u) * params.chunk);
  for (var i = c * params.chunk; i < end; i = i + 1u) {
    let s = scores[i];
    if ((top - s) * params.inv_t <= edge) {
      pairs[atomicAdd(&count, 1u)] = vec2<u32>(bitcast<u32>(s), i);
    }
  }
}
