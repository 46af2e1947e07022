// The native rollout's decode step on CPU, as a few MindSpore `ops.Custom(func_type="aot")` kernels.
//
// Decoding one token for a few dozen rows is bound by kernel launches, not arithmetic: written with MindSpore ops a
// layer is about 50 kernels of a few microseconds of work each, and every launch costs ~10 us. These kernels cover
// everything in a layer except the weight products (left to MindSpore's oneDNN MatMul), so a layer is 11 launches.
// Hidden states are feature-major, [features, B] (see mindgrpo/models/qwen2_blocks.py: every weight product is
// then W @ x with the weight as stored).
//
//   RmsNormT(x[H,B], weight[H], eps[1]) -> y[H,B]
//       y[:, b] = x[:, b] * rsqrt(mean(x[:, b]^2) + eps) * weight
//   AddRmsNormT(x[H,B], delta[H,B], weight[H], eps[1]) -> (x + delta [H,B], RmsNormT(x + delta))
//   SiluMul(gate[I,B], up[I,B]) -> silu(gate) * up                                   (the SwiGLU product)
//   DecodeAttention(q_t[Hq*D,B], k_t[KV*D,B], v_t[KV*D,B], bq[Hq*D], bk[KV*D], bv[KV*D],
//                   cos[P,D], sin[P,D], positions[B] i32, start[B] i32, write_pos[] or [1] i32, rows[B] i32,
//                   cache[2] i64) -> ctx_t[Hq*D,B]
//       K, V    = the keys and values of layer cache[1] in store cache[0] (kv_store.h), [C, KV, L, D] each
//       r       = rows[b]                     (the cache row of column b, C >= B; -1: none, ctx_t[:, b] = 0)
//       q, k, v = q_t[:, b] + bq, k_t[:, b] + bk, v_t[:, b] + bv
//       q, k    = rope(q, positions[b]), rope(k, positions[b])          (rotate-half RoPE, tables [P, D])
//       K[r, g, w] = k;  V[r, g, w] = v                                 (w = write_pos, the same for every row)
//       ctx_t[h*D:(h+1)*D, b] = softmax(q_h . K[r, g, start[b]..w] / sqrt(D)) @ V[r, g, start[b]..w]
//     with query head h reading KV head g = h / (Hq / KV): attention over each row's valid keys only, where the
//     plain ops mask the whole cache. `rows` lets a compacted batch (the live sequences of a chunk, B < C) decode
//     in the chunk's cache without moving it; the rows must be distinct (each column writes its row). Columns
//     without a row fill a batch beyond its live sequences at no cost.
//   KvStoreWrite(k[P,S,KV,D], v[P,S,KV,D], rows[C] i32, cache[2] i64) -> done[1]
//       K[r, :, 0..S-1] = k[rows[r]] (as [KV, S, D]), the same for V     (the prompt pass: prompt rows[r] forked
//                                                                          to cache row r; done is set to 1)
//
// The caches live in a store the kernels own (kv_store.h), not in MindSpore tensors: only the positions written
// take memory. A kernel reads the store only through these ops, and graph runs are sequential, so each write is
// seen by the later steps (the engine's tests compare many steps' logits with the plain-ops graph and a full
// forward). The extern "C" functions at the end create, release, read and destroy stores (through ctypes).
//
// Entry points follow MindSpore's AOT ABI:
//   int f(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, void *extra)
// where params holds the inputs then the outputs. All floats are float32. A non-zero return makes MindSpore raise:
// 1 wrong number of tensors, 2 no such store or layer, or a shape that does not match the store's, 3 q/k/v or
// x/delta shapes, 4 bias or weight shapes, 5 cos/sin shapes, 6 positions/start/rows shapes, 7 dtypes, 8 output
// shapes, 9 write_pos, start or a position outside the cache or the tables, 10 a row outside the cache or used twice
// (KvStoreWrite: a prompt index outside k).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernel_common.h"
#include "kv_store.h"

namespace {

using mindgrpo::all_float32;
using mindgrpo::is_float32;
using mindgrpo::KvStore;
using mindgrpo::numel;
using mindgrpo::vexp;

constexpr int kAttentionInputs = 13;

// Threads of the attention's row loop: MINDGRPO_DECODE_THREADS, by default every processor, at most one per row.
// Rows are independent and each row's arithmetic is the same on any thread, so the result does not depend on it.
// The attention reads each live row's KV cache once per step and is most of a small model's decoding step (tiny at
// 512 tokens: 2 threads decode 1.39x faster on 2 cores; `small`, where the weight products dominate: 1.01x).
int decode_threads(int64_t rows) {
#ifdef _OPENMP
  static const int requested = [] {
    const char *env = std::getenv("MINDGRPO_DECODE_THREADS");
    return env ? std::max(1, std::atoi(env)) : std::max(1, omp_get_num_procs());
  }();
  return static_cast<int>(std::min<int64_t>(requested, std::max<int64_t>(rows, 1)));
#else
  (void)rows;
  return 1;
#endif
}

struct Dims {
  int64_t B, H, KV, L, D;  // B: columns decoded this step (the caches may hold more rows)
};

// Rotate-half RoPE of x[D] at one position (cos/sin rows of the tables) times `scale`, into out[D].
inline void rope(const float *x, const float *cos, const float *sin, int64_t D, float scale, float *out) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < half; ++d) out[d] = (x[d] * cos[d] - x[d + half] * sin[d]) * scale;
  for (int64_t d = half; d < D; ++d) out[d] = (x[d] * cos[d] + x[d - half] * sin[d]) * scale;
}

// Attention of one KV head's `groups` query heads q[groups][D] (RoPE'd, pre-scaled) over keys start..w of its
// cache; writes acc[groups][D] (normalised). kD is the head size when known at compile time (0: D at run time), so
// the per-key dot products and value sums unroll into whole vector registers. Each key and value is read once for
// all the group's heads.
template <int kD>
inline __attribute__((always_inline)) void attend_group(int64_t head_dim, int64_t groups, const float *q,
                                                        const float *k_head, const float *v_head, int64_t start,
                                                        int64_t w, int64_t L, float *p, float *acc) {
  const int64_t D = kD ? kD : head_dim;
  const int64_t keys = w - start + 1;
  for (int64_t j = 0; j < keys; ++j) {
    const float *key = k_head + (start + j) * D;
    for (int64_t h = 0; h < groups; ++h) {
      const float *qh = q + h * D;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < D; ++d) s += qh[d] * key[d];
      p[h * L + j] = s;
    }
  }
  for (int64_t h = 0; h < groups; ++h) {
    float *ph = p + h * L;
    float best = -INFINITY;
    for (int64_t j = 0; j < keys; ++j) best = std::max(best, ph[j]);
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < keys; ++j) {
      ph[j] = vexp(ph[j] - best);
      total += ph[j];
    }
    const float inv = 1.0f / total;
    for (int64_t j = 0; j < keys; ++j) ph[j] *= inv;
  }
  std::fill(acc, acc + groups * D, 0.0f);
  for (int64_t j = 0; j < keys; ++j) {
    const float *value = v_head + (start + j) * D;
    for (int64_t h = 0; h < groups; ++h) {
      const float pj = p[h * L + j];
      float *ah = acc + h * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) ah[d] += pj * value[d];
    }
  }
}

// One sequence (column b, cache rows k_row/v_row [KV, L, D]): write its new key/value into them, then attend for
// every query head.
MINDGRPO_CLONES void decode_row(const Dims &n, int64_t b, const float *q_t, const float *k_t, const float *v_t,
                                const float *bq, const float *bk, const float *bv, const float *cos_row,
                                const float *sin_row, int64_t start, int64_t w, float *k_row, float *v_row,
                                float *ctx_t, float *scratch) {
  const int64_t B = n.B, D = n.D, L = n.L, groups = n.H / n.KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  float *x = scratch;                 // [D] one gathered projection
  float *q = x + D;                   // [groups][D] the group's rotated, pre-scaled queries
  float *acc = q + groups * D;        // [groups][D] their attention outputs
  float *p = acc + groups * D;        // [groups][L] scores, then probabilities
  for (int64_t g = 0; g < n.KV; ++g) {
    float *k_head = k_row + g * L * D;
    float *v_head = v_row + g * L * D;
    for (int64_t d = 0; d < D; ++d) x[d] = k_t[(g * D + d) * B + b] + bk[g * D + d];
    rope(x, cos_row, sin_row, D, 1.0f, k_head + w * D);
    for (int64_t d = 0; d < D; ++d) v_head[w * D + d] = v_t[(g * D + d) * B + b] + bv[g * D + d];
    for (int64_t i = 0; i < groups; ++i) {
      const int64_t h = g * groups + i;
      for (int64_t d = 0; d < D; ++d) x[d] = q_t[(h * D + d) * B + b] + bq[h * D + d];
      rope(x, cos_row, sin_row, D, scale, q + i * D);
    }
    switch (D) {  // Qwen2.5's head sizes, then any other
      case 64: attend_group<64>(D, groups, q, k_head, v_head, start, w, L, p, acc); break;
      case 128: attend_group<128>(D, groups, q, k_head, v_head, start, w, L, p, acc); break;
      case 32: attend_group<32>(D, groups, q, k_head, v_head, start, w, L, p, acc); break;
      default: attend_group<0>(D, groups, q, k_head, v_head, start, w, L, p, acc);
    }
    for (int64_t i = 0; i < groups; ++i) {
      const int64_t h = g * groups + i;
      for (int64_t d = 0; d < D; ++d) ctx_t[(h * D + d) * B + b] = acc[i * D + d];
    }
  }
}

// y = x * rsqrt(mean over features + eps) * weight for feature-major x [H, B]: the per-row sums run along the
// contiguous B axis, one feature at a time, so both passes vectorise.
MINDGRPO_CLONES void rms_norm_t(const float *x, const float *weight, float eps, int64_t H, int64_t B, float *y,
                                float *inv) {
  std::fill(inv, inv + B, 0.0f);
  for (int64_t h = 0; h < H; ++h) {
    const float *row = x + h * B;
#pragma omp simd
    for (int64_t b = 0; b < B; ++b) inv[b] += row[b] * row[b];
  }
  for (int64_t b = 0; b < B; ++b) inv[b] = 1.0f / std::sqrt(inv[b] / static_cast<float>(H) + eps);
  for (int64_t h = 0; h < H; ++h) {
    const float *row = x + h * B;
    float *out = y + h * B;
    const float w = weight[h];
#pragma omp simd
    for (int64_t b = 0; b < B; ++b) out[b] = row[b] * inv[b] * w;
  }
}

// Shapes shared by the norms: x [H, B], weight [H], eps [1].
int check_norm(int *ndims, int64_t **shapes, int x, int weight, int eps, int64_t *H, int64_t *B) {
  if (ndims[x] != 2) return 3;
  *H = shapes[x][0];
  *B = shapes[x][1];
  if (numel(ndims[weight], shapes[weight]) != *H || numel(ndims[eps], shapes[eps]) != 1) return 4;
  return 0;
}

bool same_shape(int *ndims, int64_t **shapes, int a, int b) {
  if (ndims[a] != ndims[b]) return false;
  for (int i = 0; i < ndims[a]; ++i) {
    if (shapes[a][i] != shapes[b][i]) return false;
  }
  return true;
}

MINDGRPO_CLONES void silu_mul(const float *gate, const float *up, int64_t n, float *out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + vexp(-gate[i])) * up[i];
}

// The store and layer a cache[2] i64 input (store id, layer) names, or null.
const KvStore *find_layer(int ndim, const int64_t *shape, const void *data, int64_t *layer) {
  if (numel(ndim, shape) != 2) return nullptr;
  const auto *key = static_cast<const int64_t *>(data);
  const KvStore *store = mindgrpo::find_store(key[0]);
  *layer = key[1];
  return store != nullptr && *layer >= 0 && *layer < store->layers ? store : nullptr;
}

}  // namespace

extern "C" int RmsNormT(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                        void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 4) return 1;
  if (!all_float32(nparam, dtypes)) return 7;
  int64_t H, B;
  if (int err = check_norm(ndims, shapes, 0, 1, 2, &H, &B)) return err;
  if (!same_shape(ndims, shapes, 0, 3)) return 8;
  std::vector<float> inv(B);
  rms_norm_t(static_cast<const float *>(params[0]), static_cast<const float *>(params[1]),
             *static_cast<const float *>(params[2]), H, B, static_cast<float *>(params[3]), inv.data());
  return 0;
}

extern "C" int AddRmsNormT(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                           void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 6) return 1;
  if (!all_float32(nparam, dtypes)) return 7;
  int64_t H, B;
  if (int err = check_norm(ndims, shapes, 0, 2, 3, &H, &B)) return err;
  if (!same_shape(ndims, shapes, 0, 1)) return 3;
  if (!same_shape(ndims, shapes, 0, 4) || !same_shape(ndims, shapes, 0, 5)) return 8;
  const auto *x = static_cast<const float *>(params[0]);
  const auto *delta = static_cast<const float *>(params[1]);
  auto *sum = static_cast<float *>(params[4]);
  for (int64_t i = 0; i < H * B; ++i) sum[i] = x[i] + delta[i];
  std::vector<float> inv(B);
  rms_norm_t(sum, static_cast<const float *>(params[2]), *static_cast<const float *>(params[3]), H, B,
             static_cast<float *>(params[5]), inv.data());
  return 0;
}

extern "C" int SiluMul(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                       void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 3) return 1;
  if (!all_float32(nparam, dtypes)) return 7;
  if (!same_shape(ndims, shapes, 0, 1)) return 3;
  if (!same_shape(ndims, shapes, 0, 2)) return 8;
  silu_mul(static_cast<const float *>(params[0]), static_cast<const float *>(params[1]), numel(ndims[0], shapes[0]),
           static_cast<float *>(params[2]));
  return 0;
}

extern "C" int DecodeAttention(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != kAttentionInputs + 1) return 1;
  for (int i = 0; i < kAttentionInputs + 1; ++i) {
    const char *expected = i == 12 ? "int64" : i >= 8 && i <= 11 ? "int32" : nullptr;
    if (expected ? std::strcmp(dtypes[i], expected) != 0 : !is_float32(dtypes[i])) return 7;
  }
  int64_t layer;
  const KvStore *store = find_layer(ndims[12], shapes[12], params[12], &layer);
  if (store == nullptr) return 2;
  Dims n{0, 0, store->kv, store->len, store->dim};
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 2 || shapes[0][0] % n.D != 0) return 3;
  n.B = shapes[0][1];
  if (n.B <= 0 || n.B > store->rows) return 3;
  n.H = shapes[0][0] / n.D;
  if (n.D % 2 != 0 || n.H % n.KV != 0) return 3;
  for (int i = 1; i <= 2; ++i) {
    if (shapes[i][0] != n.KV * n.D || shapes[i][1] != n.B) return 3;
  }
  const int64_t bias_sizes[3] = {n.H * n.D, n.KV * n.D, n.KV * n.D};
  for (int i = 0; i < 3; ++i) {
    if (numel(ndims[3 + i], shapes[3 + i]) != bias_sizes[i]) return 4;
  }
  for (int i = 6; i <= 7; ++i) {
    if (ndims[i] != 2 || shapes[i][1] != n.D) return 5;
  }
  const int64_t table_len = shapes[6][0];
  if (shapes[7][0] != table_len) return 5;
  for (int i = 8; i <= 11; ++i) {
    if (i != 10 && numel(ndims[i], shapes[i]) != n.B) return 6;
  }
  if (numel(ndims[10], shapes[10]) != 1) return 9;
  if (ndims[13] != 2 || shapes[13][0] != n.H * n.D || shapes[13][1] != n.B) return 8;

  const auto *q_t = static_cast<const float *>(params[0]);
  const auto *k_t = static_cast<const float *>(params[1]);
  const auto *v_t = static_cast<const float *>(params[2]);
  const auto *bq = static_cast<const float *>(params[3]);
  const auto *bk = static_cast<const float *>(params[4]);
  const auto *bv = static_cast<const float *>(params[5]);
  const auto *cos = static_cast<const float *>(params[6]);
  const auto *sin = static_cast<const float *>(params[7]);
  const auto *positions = static_cast<const int32_t *>(params[8]);
  const auto *start = static_cast<const int32_t *>(params[9]);
  const int64_t w = *static_cast<const int32_t *>(params[10]);
  const auto *rows = static_cast<const int32_t *>(params[11]);
  auto *ctx_t = static_cast<float *>(params[13]);
  if (w < 0 || w >= n.L) return 9;
  for (int64_t b = 0; b < n.B; ++b) {
    if (start[b] < 0 || start[b] > w || positions[b] < 0 || positions[b] >= table_len) return 9;
  }
  std::vector<bool> taken(store->rows, false);
  for (int64_t b = 0; b < n.B; ++b) {
    if (rows[b] == -1) continue;
    if (rows[b] < 0 || rows[b] >= store->rows || taken[rows[b]]) return 10;
    taken[rows[b]] = true;
  }
  const int64_t groups = n.H / n.KV;
  const int64_t per_thread = n.D + 2 * groups * n.D + groups * n.L;
  const int threads = decode_threads(n.B);
  std::vector<float> scratch(per_thread * threads);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t b = 0; b < n.B; ++b) {
    if (rows[b] == -1) {
      for (int64_t i = 0; i < n.H * n.D; ++i) ctx_t[i * n.B + b] = 0.0f;
      continue;
    }
#ifdef _OPENMP
    float *mine = scratch.data() + per_thread * omp_get_thread_num();
#else
    float *mine = scratch.data();
#endif
    decode_row(n, b, q_t, k_t, v_t, bq, bk, bv, cos + positions[b] * n.D, sin + positions[b] * n.D, start[b], w,
               store->row(layer, 0, rows[b]), store->row(layer, 1, rows[b]), ctx_t, mine);
  }
  return 0;
}

extern "C" int KvStoreWrite(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 5) return 1;
  if (!is_float32(dtypes[0]) || !is_float32(dtypes[1]) || std::strcmp(dtypes[2], "int32") != 0 ||
      std::strcmp(dtypes[3], "int64") != 0 || !is_float32(dtypes[4])) {
    return 7;
  }
  int64_t layer;
  const KvStore *store = find_layer(ndims[3], shapes[3], params[3], &layer);
  if (store == nullptr) return 2;
  if (ndims[0] != 4 || !same_shape(ndims, shapes, 0, 1)) return 3;
  const int64_t P = shapes[0][0], S = shapes[0][1], KV = store->kv, L = store->len, D = store->dim;
  if (shapes[0][2] != KV || shapes[0][3] != D || S > L) return 2;
  if (numel(ndims[2], shapes[2]) != store->rows) return 6;
  if (numel(ndims[4], shapes[4]) != 1) return 8;
  const auto *rows = static_cast<const int32_t *>(params[2]);
  for (int64_t r = 0; r < store->rows; ++r) {
    if (rows[r] < 0 || rows[r] >= P) return 10;
  }
  for (int kind = 0; kind < 2; ++kind) {
    const auto *src = static_cast<const float *>(params[kind]);
    for (int64_t r = 0; r < store->rows; ++r) {
      float *dst = store->row(layer, kind, r);
      for (int64_t g = 0; g < KV; ++g) {
        for (int64_t s = 0; s < S; ++s) {
          std::memcpy(dst + (g * L + s) * D, src + ((rows[r] * S + s) * KV + g) * D, D * sizeof(float));
        }
      }
    }
  }
  *static_cast<float *>(params[4]) = 1.0f;
  return 0;
}

// Store management, called from Python through ctypes (mindgrpo/ops/kv_store.py). Each returns 0, or 2 for an
// unknown store (KvStoreCreate: 1 when the memory cannot be mapped).

extern "C" int KvStoreCreate(int64_t rows, int64_t kv, int64_t len, int64_t dim, int64_t layers, int64_t *id) {
  auto *store = new KvStore(rows, kv, len, dim, layers);
  if (!store->ok()) {
    delete store;
    return 1;
  }
  static int64_t next_id = 1;
  std::lock_guard<std::mutex> lock(mindgrpo::store_mutex());
  *id = next_id++;
  mindgrpo::stores()[*id] = store;
  return 0;
}

// Give back the pages of `count` rows (every row when `rows` is null) of every layer.
extern "C" int KvStoreRelease(int64_t id, const int32_t *rows, int64_t count) {
  const KvStore *store = mindgrpo::find_store(id);
  if (store == nullptr) return 2;
  if (rows == nullptr) {
    store->release_all();
  } else {
    store->release_rows(rows, count);
  }
  return 0;
}

// Copy layer `layer`'s keys and values into k, v [rows, KV, L, D] (to inspect a cache).
extern "C" int KvStoreRead(int64_t id, int64_t layer, float *k, float *v) {
  const KvStore *store = mindgrpo::find_store(id);
  if (store == nullptr || layer < 0 || layer >= store->layers) return 2;
  const int64_t row_floats = store->kv * store->len * store->dim;
  for (int64_t r = 0; r < store->rows; ++r) {
    std::memcpy(k + r * row_floats, store->row(layer, 0, r), row_floats * sizeof(float));
    std::memcpy(v + r * row_floats, store->row(layer, 1, r), row_floats * sizeof(float));
  }
  return 0;
}

extern "C" int KvStoreDestroy(int64_t id) {
  std::lock_guard<std::mutex> lock(mindgrpo::store_mutex());
  auto it = mindgrpo::stores().find(id);
  if (it == mindgrpo::stores().end()) return 2;
  delete it->second;
  mindgrpo::stores().erase(it);
  return 0;
}
