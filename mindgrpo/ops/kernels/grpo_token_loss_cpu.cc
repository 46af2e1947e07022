// Fused GRPO per-token loss for MindSpore `ops.Custom(func_type="aot")` on CPU.
//
// One pass over the per-token tensors computes, per token,
//   r    = exp(logp - old)                                    importance ratio
//   pg   = -min(r * A, clamp(r, 1 - eps_low, 1 + eps_high) * A)  clipped surrogate (DAPO clip-higher)
//   kl   = k1 | k2 | k3(ref, logp)  [* r if bias-corrected]    KL to the reference policy
//   loss = pg + beta * kl
// reduces them per sequence (row), and stores the token's local derivative m * d loss / d logp, so the backward
// is one multiply by the incoming per-row gradient instead of a second pass over four inputs: 4 arrays read and
// 1 written forward, 1 read and 1 written backward. Rows are independent, so there is no cross-thread reduction
// and the result does not depend on the thread count. The loss_type normalisation (grpo / bnpo / dr_grpo / dapo)
// is a handful of O(B) ops on the row sums, done in Python (mindgrpo.algorithm.loss) for both this kernel and the
// plain-ops twin; autodiff of those ops produces the per-row gradient the backward consumes.
//
// Entry points follow MindSpore's AOT ABI:
//   int f(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, void *extra)
// where params holds the inputs then the outputs. A non-zero return makes MindSpore raise.
//
//   GrpoTokenLoss     (logp[B,T], old[B,T], ref[B,T], adv[B] or [B,T], mask[B,T], hp[6])
//                       -> row_loss[B], row_stats[B,8], batch_means[8], token_grad[B,T]
//   GrpoTokenLossGrad (token_grad[B,T], d_row_loss[B]) -> d_logp[B,T] = d_row_loss[b] * token_grad[b,t]
//
// hp = [beta, eps_low, eps_high, kl_code (0=k1, 1=k2, 2=k3), bias_correction (0/1), has_ref (0/1)].
// row_stats columns (masked sums over the row; see ROW_STATS in mindgrpo/ops/token_loss.py):
//   0 active tokens, 1 pg, 2 kl term, 3 low-clipped, 4 high-clipped, 5 clipped (either), 6 old - logp, 7 ratio.
// (Eight columns make a row 32 bytes, the aligned unit of the Ascend twin's copies.)
// batch_means: column 0 summed over the batch (active tokens), columns 1-7 summed and divided by max(1, that):
// the metrics as masked token means, so the graph needs no reduction ops for them.
// Only row_loss is differentiable. old, ref, adv and mask are constants of the loss (detached in GRPO).
// All tensors are float32. Error codes (MindSpore reports them as the kernel's return value): 1 wrong number of
// tensors, 2 logp not 2-D, 3 old/ref/mask shape differs from logp, 4 advantages neither [B] nor [B,T], 5 hp size,
// 6 unknown kl_code, 7 a tensor is not float32, 8 wrong output shape.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernel_common.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using mindgrpo::all_float32;
using mindgrpo::numel;
using mindgrpo::vexp;

constexpr int kNumStats = 8;
constexpr int kNumHp = 6;
// Below this many tokens per thread, waking another thread costs more than it saves.
constexpr int64_t kTokensPerThread = 32768;


struct HyperParams {
  float beta, eps_low, eps_high;
  int kl_code;
  bool bias_correction, has_ref;
};

inline float clampf(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }

// KL estimator value and its derivative with respect to logp (before the optional ratio correction).
// k3 follows verl's low_var_kl: the log-ratio is clamped to [-20, 20] and the result to [-10, 10]; a clamp
// that binds stops the gradient, as torch.clamp / ops.clamp do.
template <int KL>
inline void kl_value_grad(float logp, float ref, float *value, float *grad) {
  const float d = ref - logp;
  if (KL == 0) {
    *value = -d;
    *grad = 1.0f;
  } else if (KL == 1) {
    *value = 0.5f * d * d;
    *grad = -d;
  } else {
    const float dc = clampf(d, -20.0f, 20.0f);
    const float e = vexp(dc);
    const float raw = e - dc - 1.0f;  // >= 0 (e^x >= 1 + x), so only the upper clamp of the value can bind
    *value = clampf(raw, -10.0f, 10.0f);
    // Each condition is its own float select: a combined boolean stops GCC from vectorising the loop.
    *grad = (1.0f - e) * (std::fabs(d) <= 20.0f ? 1.0f : 0.0f) * (raw <= 10.0f ? 1.0f : 0.0f);
  }
}

// KL codes as stored in hp[3]; kNoKl is internal: no reference policy.
constexpr int kNoKl = 3;

// One row of the forward pass: the sums, and token_grad[t] = m * d loss / d logp for the backward.
template <int KL, bool BIAS, bool TOKEN_ADV>
MINDGRPO_CLONES void forward_row(const float *logp, const float *old, const float *ref, const float *adv,
                                 float adv_row, const float *mask, int64_t T, const HyperParams &hp,
                                 float *row_loss, float *stats, float *token_grad) {
  const float lo = 1.0f - hp.eps_low, hi = 1.0f + hp.eps_high, beta = hp.beta;
  // float accumulators vectorise; rows hold at most a few thousand tokens, so the rounding stays ~1e-7 relative.
  float s_cnt = 0, s_pg = 0, s_kl = 0, s_low = 0, s_high = 0, s_ppo = 0, s_ratio = 0;
#pragma omp simd reduction(+ : s_cnt, s_pg, s_kl, s_low, s_high, s_ppo, s_ratio)
  for (int64_t t = 0; t < T; ++t) {
    const float a = TOKEN_ADV ? adv[t] : adv_row;
    const float m = mask[t];
    const float r = vexp(logp[t] - old[t]);
    const float rc = clampf(r, lo, hi);
    const float pg = -std::min(r * a, rc * a);
    // The surrogate has a gradient only where the min picks the unclamped r * A (on a tie the two are equal and
    // so are their gradients); otherwise the token is clipped (r > hi with A > 0, or r < lo with A < 0).
    float g = (r * a <= rc * a) ? -a * r : 0.0f;
    const float low = (r < lo ? 1.0f : 0.0f) * (a < 0.0f ? 1.0f : 0.0f);
    const float high = (r > hi ? 1.0f : 0.0f) * (a > 0.0f ? 1.0f : 0.0f);
    float kl = 0.0f;
    if (KL != kNoKl) {
      float dkl;
      kl_value_grad<KL>(logp[t], ref[t], &kl, &dkl);
      // d(kl * r)/dlogp = dkl * r + kl * r: the ratio is not detached (DeepSeek-V3.2 / TRL).
      g += beta * (BIAS ? (dkl + kl) * r : dkl);
      if (BIAS) kl *= r;
    }
    token_grad[t] = m * g;
    s_cnt += m;
    s_pg += m * pg;
    s_kl += m * kl;
    s_low += m * low;
    s_high += m * high;
    s_ppo += m * (old[t] - logp[t]);
    s_ratio += m * r;
  }
  *row_loss = s_pg + beta * s_kl;  // = sum m * (pg + beta * kl)
  stats[0] = s_cnt;
  stats[1] = s_pg;
  stats[2] = s_kl;
  stats[3] = s_low;
  stats[4] = s_high;
  stats[5] = s_low + s_high;  // disjoint events: r < lo needs a < 0, r > hi needs a > 0
  stats[6] = s_ppo;
  stats[7] = s_ratio;
}

MINDGRPO_CLONES void scale_row(const float *token_grad, float dout, int64_t T, float *grad) {
#pragma omp simd
  for (int64_t t = 0; t < T; ++t) grad[t] = dout * token_grad[t];
}

using ForwardFn = void (*)(const float *, const float *, const float *, const float *, float, const float *,
                           int64_t, const HyperParams &, float *, float *, float *);

// Picks the specialisation once per call so the per-token loop carries no runtime branches on the settings.
template <int KL>
ForwardFn pick_forward(bool bias, bool token_adv) {
  if (bias) return token_adv ? &forward_row<KL, true, true> : &forward_row<KL, true, false>;
  return token_adv ? &forward_row<KL, false, true> : &forward_row<KL, false, false>;
}

ForwardFn pick_forward(int kl, bool bias, bool token_adv) {
  switch (kl) {
    case 0:
      return pick_forward<0>(bias, token_adv);
    case 1:
      return pick_forward<1>(bias, token_adv);
    case 2:
      return pick_forward<2>(bias, token_adv);
    default:
      return pick_forward<kNoKl>(bias, token_adv);
  }
}

// Validates the common inputs (logp, old, ref, adv, mask, hp) and reads the hyper-parameters.
// Returns 0 on success; the codes are distinct so a failure can be traced to the check that fired.
int read_inputs(int *ndims, int64_t **shapes, void **params, int64_t *B, int64_t *T,
                bool *token_adv, HyperParams *hp) {
  if (ndims[0] != 2) return 2;
  *B = shapes[0][0];
  *T = shapes[0][1];
  for (int i : {1, 2, 4}) {
    if (ndims[i] != 2 || shapes[i][0] != *B || shapes[i][1] != *T) return 3;
  }
  if (ndims[3] == 1 && shapes[3][0] == *B) {
    *token_adv = false;
  } else if (ndims[3] == 2 && shapes[3][0] == *B && shapes[3][1] == *T) {
    *token_adv = true;
  } else {
    return 4;
  }
  if (numel(ndims[5], shapes[5]) != kNumHp) return 5;
  const float *h = static_cast<const float *>(params[5]);
  hp->beta = h[0];
  hp->eps_low = h[1];
  hp->eps_high = h[2];
  hp->kl_code = static_cast<int>(h[3]);
  hp->bias_correction = h[4] != 0.0f;
  hp->has_ref = h[5] != 0.0f;
  if (hp->kl_code < 0 || hp->kl_code > 2) return 6;
  return 0;
}

// Threads for one call. One core already streams these arrays at about the machine's copy bandwidth, and on a
// busy machine a second OpenMP thread can stall the whole call for a scheduler time slice (measured: 0.1 ms calls
// taking 20 ms on an oversubscribed 2-core box), so the kernel is single-threaded unless MINDGRPO_LOSS_THREADS
// asks for more; then rows are split over up to that many threads, each with at least kTokensPerThread tokens.
int thread_count(int64_t tokens, int64_t rows) {
#ifdef _OPENMP
  static const int requested = [] {
    const char *env = std::getenv("MINDGRPO_LOSS_THREADS");
    return env ? std::max(1, std::atoi(env)) : 1;
  }();
  const int64_t by_size = std::max<int64_t>(1, tokens / kTokensPerThread);
  return static_cast<int>(std::min<int64_t>({static_cast<int64_t>(requested), by_size, rows}));
#else
  (void)tokens;
  (void)rows;
  return 1;
#endif
}

}  // namespace

extern "C" int GrpoTokenLoss(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 10) return 1;
  if (!all_float32(nparam, dtypes)) return 7;
  int64_t B, T;
  bool token_adv;
  HyperParams hp;
  if (int err = read_inputs(ndims, shapes, params, &B, &T, &token_adv, &hp)) return err;
  if (numel(ndims[6], shapes[6]) != B || numel(ndims[7], shapes[7]) != B * kNumStats ||
      numel(ndims[8], shapes[8]) != kNumStats || numel(ndims[9], shapes[9]) != B * T) {
    return 8;
  }
  const auto *logp = static_cast<const float *>(params[0]);
  const auto *old = static_cast<const float *>(params[1]);
  const auto *ref = static_cast<const float *>(params[2]);
  const auto *adv = static_cast<const float *>(params[3]);
  const auto *mask = static_cast<const float *>(params[4]);
  auto *row_loss = static_cast<float *>(params[6]);
  auto *row_stats = static_cast<float *>(params[7]);
  auto *batch_means = static_cast<float *>(params[8]);
  auto *token_grad = static_cast<float *>(params[9]);
  const ForwardFn fn = pick_forward(hp.has_ref ? hp.kl_code : kNoKl, hp.bias_correction, token_adv);
  const int threads = thread_count(B * T, B);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t o = b * T;
    fn(logp + o, old + o, ref + o, token_adv ? adv + o : adv, token_adv ? 0.0f : adv[b], mask + o, T, hp,
       row_loss + b, row_stats + b * kNumStats, token_grad + o);
  }
  // Batch totals in a fixed order (and in double), so they too are independent of the thread count.
  double sums[kNumStats] = {0.0};
  for (int64_t b = 0; b < B; ++b) {
    for (int k = 0; k < kNumStats; ++k) sums[k] += row_stats[b * kNumStats + k];
  }
  const double tokens = std::max(1.0, sums[0]);
  batch_means[0] = static_cast<float>(sums[0]);
  for (int k = 1; k < kNumStats; ++k) batch_means[k] = static_cast<float>(sums[k] / tokens);
  return 0;
}

extern "C" int GrpoTokenLossGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 3) return 1;
  if (!all_float32(nparam, dtypes)) return 7;
  if (ndims[0] != 2) return 2;
  const int64_t B = shapes[0][0], T = shapes[0][1];
  if (numel(ndims[1], shapes[1]) != B) return 4;
  if (ndims[2] != 2 || shapes[2][0] != B || shapes[2][1] != T) return 8;
  const auto *token_grad = static_cast<const float *>(params[0]);
  const auto *dout = static_cast<const float *>(params[1]);
  auto *grad = static_cast<float *>(params[2]);
  const int threads = thread_count(B * T, B);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t b = 0; b < B; ++b) scale_row(token_grad + b * T, dout[b], T, grad + b * T);
  return 0;
}
