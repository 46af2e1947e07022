// Shared pieces of the GRPO token-loss Ascend C kernels (forward grpo_token_loss.cpp, backward
// grpo_token_loss_grad.cpp).
//
// UNTESTED: needs the CANN toolkit and an Ascend device; it cannot be compiled on the CPU-only development
// machines. The semantics are those of the CPU twin ../../grpo_token_loss_cpu.cc, which the test suite holds to
// TRL and to the plain-ops reference.
//
// Only count-mode vector instructions are used (Add/Sub/Mul/Min/Max, the scalar forms, Exp, Abs, ReduceSum), so
// tiles of any length work without Compare/Select's 256-byte alignment. Indicators such as [r > 1 + eps_high] are
// built with Step() below, which is exact here: its argument is either exactly 0 (clamp(r) returns r itself) or
// at least one float32 ulp of a number >= ~0.1 away from 0.
#ifndef MINDGRPO_GRPO_TOKEN_COMMON_H
#define MINDGRPO_GRPO_TOKEN_COMMON_H
#include "kernel_operator.h"

namespace grpo {
using namespace AscendC;

constexpr int32_t kBufferNum = 2;  // double-buffered input queues
constexpr uint32_t kNumStats = 8;  // row_stats columns, as ROW_STATS in mindgrpo/ops/token_loss.py
constexpr int32_t kKlK1 = 0;
constexpr int32_t kKlK2 = 1;
constexpr int32_t kKlK3 = 2;

struct Hyper {
  float beta;
  float lo;  // 1 - epsilon_low
  float hi;  // 1 + epsilon_high
  int32_t kl;
  bool bias;
  bool hasRef;
};

__aicore__ inline Hyper ReadHyper(GM_ADDR hyper) {
  GlobalTensor<float> h;
  h.SetGlobalBuffer((__gm__ float *)hyper, 6);
  Hyper out;
  out.beta = h.GetValue(0);
  out.lo = 1.0f - h.GetValue(1);
  out.hi = 1.0f + h.GetValue(2);
  out.kl = static_cast<int32_t>(h.GetValue(3));
  out.bias = h.GetValue(4) != 0.0f;
  out.hasRef = h.GetValue(5) != 0.0f;
  return out;
}

// dst = 1 where src > 0, else 0 (exact for the arguments used here, see the file comment).
__aicore__ inline void Step(const LocalTensor<float> &dst, const LocalTensor<float> &src, uint32_t n) {
  Maxs(dst, src, 0.0f, n);
  Muls(dst, dst, 1e30f, n);
  Mins(dst, dst, 1.0f, n);
}

// The five per-token inputs of one tile, loaded through double-buffered queues.
class TileLoader {
 public:
  __aicore__ inline void Init(TPipe *pipe, GM_ADDR logp, GM_ADDR oldLogp, GM_ADDR refLogp, GM_ADDR adv,
                              GM_ADDR mask, uint32_t rows, uint32_t cols, uint32_t tileLen, bool tokenAdv) {
    const uint64_t size = static_cast<uint64_t>(rows) * cols;
    logpGm_.SetGlobalBuffer((__gm__ float *)logp, size);
    oldGm_.SetGlobalBuffer((__gm__ float *)oldLogp, size);
    refGm_.SetGlobalBuffer((__gm__ float *)refLogp, size);
    maskGm_.SetGlobalBuffer((__gm__ float *)mask, size);
    advGm_.SetGlobalBuffer((__gm__ float *)adv, tokenAdv ? size : rows);
    tokenAdv_ = tokenAdv;
    const uint32_t bytes = tileLen * sizeof(float);
    pipe->InitBuffer(logpQ_, kBufferNum, bytes);
    pipe->InitBuffer(oldQ_, kBufferNum, bytes);
    pipe->InitBuffer(refQ_, kBufferNum, bytes);
    pipe->InitBuffer(maskQ_, kBufferNum, bytes);
    pipe->InitBuffer(advQ_, kBufferNum, bytes);
  }

  __aicore__ inline float RowAdvantage(uint32_t row) { return advGm_.GetValue(row); }

  // Copy tokens [offset, offset + n) of the flattened [B, T] tensors into the queues.
  __aicore__ inline void CopyIn(uint64_t offset, uint32_t n, bool withRef) {
    DataCopyExtParams params{1, static_cast<uint32_t>(n * sizeof(float)), 0, 0, 0};
    DataCopyPadExtParams<float> noPad{false, 0, 0, 0.0f};
    Load(logpQ_, logpGm_, offset, params, noPad);
    Load(oldQ_, oldGm_, offset, params, noPad);
    Load(maskQ_, maskGm_, offset, params, noPad);
    if (withRef) Load(refQ_, refGm_, offset, params, noPad);
    if (tokenAdv_) Load(advQ_, advGm_, offset, params, noPad);
  }

  __aicore__ inline LocalTensor<float> Logp() { return logpQ_.DeQue<float>(); }
  __aicore__ inline LocalTensor<float> Old() { return oldQ_.DeQue<float>(); }
  __aicore__ inline LocalTensor<float> Ref() { return refQ_.DeQue<float>(); }
  __aicore__ inline LocalTensor<float> Mask() { return maskQ_.DeQue<float>(); }
  __aicore__ inline LocalTensor<float> Adv() { return advQ_.DeQue<float>(); }

  __aicore__ inline void Free(LocalTensor<float> &logp, LocalTensor<float> &old, LocalTensor<float> &mask) {
    logpQ_.FreeTensor(logp);
    oldQ_.FreeTensor(old);
    maskQ_.FreeTensor(mask);
  }
  __aicore__ inline void FreeRef(LocalTensor<float> &ref) { refQ_.FreeTensor(ref); }
  __aicore__ inline void FreeAdv(LocalTensor<float> &adv) { advQ_.FreeTensor(adv); }

 private:
  __aicore__ inline void Load(TQue<QuePosition::VECIN, kBufferNum> &queue, GlobalTensor<float> &gm, uint64_t offset,
                              const DataCopyExtParams &params, const DataCopyPadExtParams<float> &pad) {
    LocalTensor<float> local = queue.AllocTensor<float>();
    DataCopyPad(local, gm[offset], params, pad);
    queue.EnQue(local);
  }

  TQue<QuePosition::VECIN, kBufferNum> logpQ_, oldQ_, refQ_, maskQ_, advQ_;
  GlobalTensor<float> logpGm_, oldGm_, refGm_, maskGm_, advGm_;
  bool tokenAdv_ = false;
};

// KL estimate `kl` (and, when wanted, its derivative `dkl` with respect to logp) from d = ref - logp.
// k3 follows verl's low_var_kl: log-ratio clamped to [-20, 20], value to [-10, 10]; a binding clamp stops the
// gradient. `e` and `t` are scratch buffers.
__aicore__ inline void KlTerms(int32_t kl, const LocalTensor<float> &d, const LocalTensor<float> &klOut,
                               const LocalTensor<float> &dklOut, const LocalTensor<float> &e,
                               const LocalTensor<float> &t, uint32_t n, bool wantGrad) {
  if (kl == kKlK1) {
    Muls(klOut, d, -1.0f, n);
    if (wantGrad) Duplicate(dklOut, 1.0f, n);
  } else if (kl == kKlK2) {
    Mul(klOut, d, d, n);
    Muls(klOut, klOut, 0.5f, n);
    if (wantGrad) Muls(dklOut, d, -1.0f, n);
  } else {
    Maxs(t, d, -20.0f, n);
    Mins(t, t, 20.0f, n);           // t = clamped log-ratio
    Exp(e, t, n);                   // e = exp(t)
    Sub(klOut, e, t, n);
    Adds(klOut, klOut, -1.0f, n);   // raw = e - t - 1 (>= 0, so only the upper value clamp can bind)
    if (wantGrad) {
      // dkl = (1 - e) * [|d| <= 20] * [raw <= 10]
      Abs(dklOut, d, n);
      Adds(dklOut, dklOut, -20.0f, n);
      Step(dklOut, dklOut, n);      // [|d| > 20]
      Muls(t, e, -1.0f, n);
      Adds(t, t, 1.0f, n);          // 1 - e
      Mul(dklOut, dklOut, t, n);
      Sub(dklOut, t, dklOut, n);    // (1 - e) * [|d| <= 20]
      Adds(t, klOut, -10.0f, n);
      Step(t, t, n);                // [raw > 10]
      Mul(t, t, dklOut, n);
      Sub(dklOut, dklOut, t, n);
    }
    Mins(klOut, klOut, 10.0f, n);
  }
}
}  // namespace grpo
#endif  // MINDGRPO_GRPO_TOKEN_COMMON_H
