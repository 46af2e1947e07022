// The vocabulary head and its log-softmax as one MindSpore `ops.Custom(func_type="aot")` op on CPU, never holding a
// [rows, vocab] tensor.
//
// The plain path projects the final hidden states onto the whole vocabulary, then takes log_softmax and the
// target's column. At Qwen2.5's 151,936 entries every such [rows, vocab] float32 tensor is 0.6 MB a row, and a
// compiled CPU graph keeps each node's output for its lifetime: logits, log-softmax, the entropy's softmax and the
// backward's gradient of the logits were several GB per micro-batch shape. Here the rows go through in chunks of
// kChunkRows: the chunk's logits are made by one GEMM into a scratch buffer, reduced to the row's log-sum-exp,
// the target's log-prob and the entropy, and dropped.
//
//   z = (h W^T) * inv_temp      logp = z[id] - lse     entropy = lse - sum_v p_v z_v       (p = exp(z - lse))
//   d logp / d h = J = (onehot - p) W * inv_temp       d loss / d W = sum_r g_r (onehot - p_r)^T h_r * inv_temp
//
// A row's log-prob depends on its own hidden state only, so its derivative J [H] is known in the forward: the
// training forward (HeadLogProbsTrain) computes it with a second GEMM from the buffer it already holds, and the
// backward of the hidden states is g * J, without recomputing anything. The head's own gradient needs g, so a
// trained head's backward (HeadLogProbsGradWeight) recomputes the chunk's logits from the saved log-sum-exp: one
// GEMM more than the plain path in all, and none more for a frozen head (LoRA's backbone). Scoring (HeadLogProbs)
// is one GEMM. The entropy has no gradient here (a metric or the entropy mask's key; the entropy bonus takes the
// plain path). GEMMs are oneDNN's sgemm from the libdnnl MindSpore ships (its CPU MatMul's library).
//
// Entry points (MindSpore's AOT ABI: params holds the inputs, then the outputs; non-zero return = error):
//   HeadLogProbs           (h[R,H], w[V,H], ids[R] int32, inv_temp[1]) -> logp[R], entropy[R], lse[R]
//   HeadLogProbsTrain      (h[R,H], w[V,H], ids[R] int32, inv_temp[1]) -> logp[R], entropy[R], lse[R], J[R,H]
//   HeadLogProbsGradWeight (h[R,H], w[V,H], ids[R] int32, inv_temp[1], lse[R], g[R]) -> dw[V,H]
// Error codes: 1 tensor count, 2 shapes, 3 dtypes, 4 a target id outside [0, V), 5 out of memory, 6 oneDNN's GEMM
// failed (its status is never dropped: garbage log-probs would train silently).
// The row loops use OpenMP's threads (OMP_NUM_THREADS; all cores by default): a chunk is 64 rows of the vocabulary,
// millions of elements, far past the size where waking a thread costs more than it saves.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernel_common.h"

extern "C" int dnnl_sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                          int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

namespace {

using mindgrpo::is_float32;
using mindgrpo::vexp;

// Rows per GEMM: enough for the GEMM to run near its peak, few enough that the scratch buffer (kChunkRows x V
// floats, 39 MB at Qwen2.5's vocabulary) stays far below what one [rows, vocab] tensor used to take.
constexpr int64_t kChunkRows = 64;

struct Shapes {
  int64_t rows, hidden, vocab;
};

int check(int ndims[], int64_t *shapes[], const char *dtypes[], int inputs, Shapes *s) {
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 1) return 2;
  s->rows = shapes[0][0];
  s->hidden = shapes[0][1];
  s->vocab = shapes[1][0];
  if (shapes[1][1] != s->hidden || shapes[2][0] != s->rows || mindgrpo::numel(ndims[3], shapes[3]) != 1) return 2;
  if (!is_float32(dtypes[0]) || !is_float32(dtypes[1]) || !is_float32(dtypes[3])) return 3;
  if (std::strcmp(dtypes[2], "int32") != 0) return 3;
  for (int i = 4; i < inputs; ++i) {
    if (ndims[i] != 1 || shapes[i][0] != s->rows || !is_float32(dtypes[i])) return 2;
  }
  return 0;
}

constexpr int kGemmFailed = 6;

// logits [n, V] = h[n, H] W^T, into `out`; oneDNN's status (0: success).
inline int chunk_logits(const float *h, const float *w, const Shapes &s, int64_t n, float *out) {
  return dnnl_sgemm('N', 'T', n, s.vocab, s.hidden, 1.0f, h, s.hidden, w, s.hidden, 0.0f, out, s.vocab);
}

// The row's log-sum-exp of z = x * inv_temp, and its entropy lse - sum_v p_v z_v, written as
// log(sum) - sum_v e_v (z_v - top) / sum with e_v = exp(z_v - top): both terms stay small, so a peaked row's entropy
// does not come out of the difference of two large numbers.
MINDGRPO_CLONES void row_stats(const float *x, int64_t vocab, float inv_temp, float *lse, float *entropy) {
  float top = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v) top = std::max(top, x[v]);
  top *= inv_temp;
  float sum = 0.0f, weighted = 0.0f;
#pragma omp simd reduction(+ : sum, weighted)
  for (int64_t v = 0; v < vocab; ++v) {
    const float shifted = x[v] * inv_temp - top;
    const float e = vexp(shifted);
    sum += e;
    weighted += e * shifted;
  }
  const float log_sum = std::log(sum);
  *lse = top + log_sum;
  *entropy = log_sum - weighted / sum;
}

// x <- g * (onehot(id) - exp(x * inv_temp - lse)) * inv_temp: the gradient of the row's logits.
MINDGRPO_CLONES void row_grad(float *x, int64_t vocab, int32_t id, float inv_temp, float lse, float g) {
  const float scale = -g * inv_temp;
#pragma omp simd
  for (int64_t v = 0; v < vocab; ++v) x[v] = scale * vexp(x[v] * inv_temp - lse);
  x[id] += g * inv_temp;
}

bool ids_in_range(const int32_t *ids, const Shapes &s) {
  for (int64_t r = 0; r < s.rows; ++r) {
    if (ids[r] < 0 || ids[r] >= s.vocab) return false;
  }
  return true;
}

// The scratch buffer of one chunk of logits; empty if it cannot be had.
std::vector<float> chunk_buffer(const Shapes &s) {
  std::vector<float> buffer;
  try {
    buffer.resize(static_cast<size_t>(std::min(kChunkRows, s.rows)) * s.vocab);
  } catch (const std::bad_alloc &) {
    buffer.clear();
  }
  return buffer;
}

// The forward; with_jacobian: also J, the derivative of each log-prob with respect to its hidden state.
int forward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, bool with_jacobian) {
  if (nparam != (with_jacobian ? 8 : 7)) return 1;
  Shapes s;
  if (int err = check(ndims, shapes, dtypes, 4, &s)) return err;
  const auto *h = static_cast<const float *>(params[0]);
  const auto *w = static_cast<const float *>(params[1]);
  const auto *ids = static_cast<const int32_t *>(params[2]);
  const float inv_temp = *static_cast<const float *>(params[3]);
  auto *logp = static_cast<float *>(params[4]);
  auto *entropy = static_cast<float *>(params[5]);
  auto *lse = static_cast<float *>(params[6]);
  auto *jacobian = with_jacobian ? static_cast<float *>(params[7]) : nullptr;
  if (!ids_in_range(ids, s)) return 4;
  if (s.rows == 0) return 0;
  std::vector<float> buffer = chunk_buffer(s);
  if (buffer.empty()) return 5;
  float *logits = buffer.data();
  for (int64_t start = 0; start < s.rows; start += kChunkRows) {
    const int64_t n = std::min(kChunkRows, s.rows - start);
    if (chunk_logits(h + start * s.hidden, w, s, n, logits) != 0) return kGemmFailed;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      float *x = logits + r * s.vocab;
      row_stats(x, s.vocab, inv_temp, lse + start + r, entropy + start + r);
      logp[start + r] = x[ids[start + r]] * inv_temp - lse[start + r];
      if (jacobian != nullptr) row_grad(x, s.vocab, ids[start + r], inv_temp, lse[start + r], 1.0f);
    }
    // J [n, H] = (onehot - p) [n, V] W [V, H] * inv_temp (the scale is in the buffer)
    if (jacobian != nullptr && dnnl_sgemm('N', 'N', n, s.hidden, s.vocab, 1.0f, logits, s.vocab, w, s.hidden, 0.0f,
                                          jacobian + start * s.hidden, s.hidden) != 0) {
      return kGemmFailed;
    }
  }
  return 0;
}

}  // namespace

extern "C" int HeadLogProbs(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  return forward(nparam, params, ndims, shapes, dtypes, false);
}

extern "C" int HeadLogProbsTrain(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  return forward(nparam, params, ndims, shapes, dtypes, true);
}

extern "C" int HeadLogProbsGradWeight(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                      void *stream, void *extra) {
  if (nparam != 7) return 1;
  Shapes s;
  if (int err = check(ndims, shapes, dtypes, 6, &s)) return err;
  const auto *h = static_cast<const float *>(params[0]);
  const auto *w = static_cast<const float *>(params[1]);
  const auto *ids = static_cast<const int32_t *>(params[2]);
  const float inv_temp = *static_cast<const float *>(params[3]);
  const auto *lse = static_cast<const float *>(params[4]);
  const auto *g = static_cast<const float *>(params[5]);
  auto *dw = static_cast<float *>(params[6]);
  if (!ids_in_range(ids, s)) return 4;
  if (s.rows == 0) {  // no row: no gradient
    std::fill(dw, dw + s.vocab * s.hidden, 0.0f);
    return 0;
  }
  std::vector<float> buffer = chunk_buffer(s);
  if (buffer.empty()) return 5;
  float *logits = buffer.data();
  for (int64_t start = 0; start < s.rows; start += kChunkRows) {
    const int64_t n = std::min(kChunkRows, s.rows - start);
    if (chunk_logits(h + start * s.hidden, w, s, n, logits) != 0) return kGemmFailed;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      row_grad(logits + r * s.vocab, s.vocab, ids[start + r], inv_temp, lse[start + r], g[start + r]);
    }
    // dW [V, H] (+)= dz^T [V, n] h [n, H]
    if (dnnl_sgemm('T', 'N', s.vocab, s.hidden, n, 1.0f, logits, s.vocab, h + start * s.hidden, s.hidden,
                   start == 0 ? 0.0f : 1.0f, dw, s.hidden) != 0) {
      return kGemmFailed;
    }
  }
  return 0;
}
