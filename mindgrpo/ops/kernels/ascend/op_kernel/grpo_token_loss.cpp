// GrpoTokenLoss forward kernel (Ascend C): per-sequence sums of the GRPO token loss and of the metric counts,
// and each token's local derivative for the backward.
//
// UNTESTED: needs the CANN toolkit and an Ascend device; it cannot be compiled on the CPU-only development
// machines. Semantics are those of GrpoTokenLoss in ../../grpo_token_loss_cpu.cc (which the tests hold to TRL):
//   row_loss[b]      = sum_t m * (pg + beta * kl)
//   row_stats[b, :]  = sum_t m * [1, pg, kl, low, high, low + high, old - logp, r]
//   token_grad[b, t] = m * d(pg + beta * kl) / d logp
// (The CPU kernel also outputs the batch means; on Ascend mindgrpo/ops/token_loss.py reduces them from row_stats.)
// Each AI core streams its rows tile by tile, accumulating element-wise in UB, and reduces once per row; rows
// never span cores, so no cross-core reduction is needed. Per-row results are staged in UB and written at the end.
#include "grpo_token_common.h"

using namespace AscendC;
using namespace grpo;

class GrpoTokenLossKernel {
 public:
  __aicore__ inline void Init(GM_ADDR logp, GM_ADDR oldLogp, GM_ADDR refLogp, GM_ADDR adv, GM_ADDR mask,
                              GM_ADDR hyper, GM_ADDR rowLoss, GM_ADDR rowStats, GM_ADDR tokenGrad,
                              const GrpoTokenLossTilingData &t) {
    cols_ = t.cols;
    tileLen_ = t.tileLen;
    tokenAdv_ = t.tokenAdv != 0;
    rowBegin_ = GetBlockIdx() * t.rowsPerCore;
    rowEnd_ = rowBegin_ + t.rowsPerCore < t.rows ? rowBegin_ + t.rowsPerCore : t.rows;
    hp_ = ReadHyper(hyper);
    klGrad_ = hp_.hasRef && hp_.beta != 0.0f;
    loader_.Init(&pipe_, logp, oldLogp, refLogp, adv, mask, t.rows, t.cols, t.tileLen, tokenAdv_);
    rowLossGm_.SetGlobalBuffer((__gm__ float *)rowLoss, t.rows);
    rowStatsGm_.SetGlobalBuffer((__gm__ float *)rowStats, static_cast<uint64_t>(t.rows) * kNumStats);
    tokenGradGm_.SetGlobalBuffer((__gm__ float *)tokenGrad, static_cast<uint64_t>(t.rows) * t.cols);

    const uint32_t bytes = tileLen_ * sizeof(float);
    pipe_.InitBuffer(scratch_, 11 * bytes);             // r, rc, d, pg, kl, low, high, e, t, dkl, g
    pipe_.InitBuffer(accum_, 8 * bytes);                // the 8 row_stats columns
    pipe_.InitBuffer(work_, bytes);                     // ReduceSum workspace
    pipe_.InitBuffer(reduced_, 8 * 8 * sizeof(float));  // one 32-byte slot per reduced sum
    pipe_.InitBuffer(gradQ_, kBufferNum, bytes);
    const uint32_t staged = (t.rowsPerCore + 7) / 8 * 8;
    pipe_.InitBuffer(outLoss_, staged * sizeof(float));
    pipe_.InitBuffer(outStats_, staged * kNumStats * sizeof(float));
  }

  __aicore__ inline void Process() {
    if (rowBegin_ >= rowEnd_) return;
    LocalTensor<float> acc = accum_.Get<float>();
    for (uint32_t row = rowBegin_; row < rowEnd_; ++row) {
      Duplicate(acc, 0.0f, 8 * tileLen_);
      const float a = tokenAdv_ ? 0.0f : loader_.RowAdvantage(row);
      for (uint32_t start = 0; start < cols_; start += tileLen_) {
        const uint32_t n = cols_ - start < tileLen_ ? cols_ - start : tileLen_;
        const uint64_t offset = static_cast<uint64_t>(row) * cols_ + start;
        loader_.CopyIn(offset, n, hp_.hasRef);
        Accumulate(a, n, acc);
        CopyOutGrad(offset, n);
      }
      FinishRow(row - rowBegin_, acc);
    }
    WriteOut();
  }

 private:
  __aicore__ inline LocalTensor<float> Slot(const LocalTensor<float> &base, uint32_t i) {
    return base[i * tileLen_];
  }

  // Adds this tile's masked per-token values into the accumulators (slot k = row_stats column k) and queues the
  // tile's token_grad.
  __aicore__ inline void Accumulate(float a, uint32_t n, const LocalTensor<float> &acc) {
    LocalTensor<float> s = scratch_.Get<float>();
    LocalTensor<float> r = Slot(s, 0), rc = Slot(s, 1), d = Slot(s, 2), pg = Slot(s, 3), kl = Slot(s, 4);
    LocalTensor<float> low = Slot(s, 5), high = Slot(s, 6), e = Slot(s, 7), t = Slot(s, 8), dkl = Slot(s, 9);
    LocalTensor<float> g = Slot(s, 10);
    LocalTensor<float> logp = loader_.Logp(), old = loader_.Old(), mask = loader_.Mask();

    Sub(d, logp, old, n);
    Exp(r, d, n);                                   // importance ratio
    Maxs(rc, r, hp_.lo, n);
    Mins(rc, rc, hp_.hi, n);                        // clamp(r, 1 - eps_low, 1 + eps_high)
    Sub(t, r, rc, n);
    Step(high, t, n);                               // [r > hi]
    Muls(t, t, -1.0f, n);
    Step(low, t, n);                                // [r < lo]
    if (tokenAdv_) {
      LocalTensor<float> adv = loader_.Adv();
      Mul(pg, r, adv, n);
      Mul(t, rc, adv, n);
      Min(pg, pg, t, n);
      Muls(pg, pg, -1.0f, n);                       // pg = -min(r A, clamp(r) A)
      Step(t, adv, n);
      Mul(high, high, t, n);                        // [r > hi and A > 0]
      Muls(t, adv, -1.0f, n);
      Step(t, t, n);
      Mul(low, low, t, n);                          // [r < lo and A < 0]
      Mul(g, r, adv, n);                            // A r (the sign is applied below)
      loader_.FreeAdv(adv);
    } else {
      // With one advantage per row, min(r A, rc A) is A * min(r, rc) for A >= 0 and A * max(r, rc) otherwise.
      if (a >= 0.0f) {
        Min(pg, r, rc, n);
      } else {
        Max(pg, r, rc, n);
      }
      Muls(pg, pg, -a, n);
      if (a <= 0.0f) Duplicate(high, 0.0f, n);
      if (a >= 0.0f) Duplicate(low, 0.0f, n);
      Muls(g, r, a, n);
    }
    // Surrogate gradient -A r where the token is not clipped: g = -A r * (1 - low - high).
    Add(t, low, high, n);                           // clipped (disjoint events)
    Muls(e, t, -1.0f, n);
    Adds(e, e, 1.0f, n);
    Mul(g, g, e, n);
    Muls(g, g, -1.0f, n);
    if (hp_.hasRef) {
      LocalTensor<float> ref = loader_.Ref();
      Sub(d, ref, logp, n);
      KlTerms(hp_.kl, d, kl, dkl, e, rc, n, klGrad_);  // rc is no longer needed and serves as scratch
      if (klGrad_) {
        if (hp_.bias) {                             // d(kl * r)/dlogp = (dkl + kl) * r: the ratio is not detached
          Add(dkl, dkl, kl, n);
          Mul(dkl, dkl, r, n);
        }
        Muls(dkl, dkl, hp_.beta, n);
        Add(g, g, dkl, n);
      }
      if (hp_.bias) Mul(kl, kl, r, n);
      loader_.FreeRef(ref);
    } else {
      Duplicate(kl, 0.0f, n);
    }
    LocalTensor<float> tokenGrad = gradQ_.AllocTensor<float>();
    Mul(tokenGrad, g, mask, n);
    gradQ_.EnQue(tokenGrad);

    Sub(d, old, logp, n);                           // ppo_kl term
    Add(Slot(acc, 0), Slot(acc, 0), mask, n);       // active tokens
    MaskedAdd(Slot(acc, 1), pg, mask, e, n);
    MaskedAdd(Slot(acc, 2), kl, mask, e, n);
    MaskedAdd(Slot(acc, 3), low, mask, e, n);
    MaskedAdd(Slot(acc, 4), high, mask, e, n);
    MaskedAdd(Slot(acc, 5), t, mask, e, n);         // clipped either way
    MaskedAdd(Slot(acc, 6), d, mask, e, n);
    MaskedAdd(Slot(acc, 7), r, mask, e, n);
    loader_.Free(logp, old, mask);
  }

  __aicore__ inline void MaskedAdd(const LocalTensor<float> &acc, const LocalTensor<float> &value,
                                   const LocalTensor<float> &mask, const LocalTensor<float> &tmp, uint32_t n) {
    Mul(tmp, value, mask, n);
    Add(acc, acc, tmp, n);
  }

  __aicore__ inline void CopyOutGrad(uint64_t offset, uint32_t n) {
    LocalTensor<float> tokenGrad = gradQ_.DeQue<float>();
    DataCopyExtParams params{1, static_cast<uint32_t>(n * sizeof(float)), 0, 0, 0};
    DataCopyPad(tokenGradGm_[offset], tokenGrad, params);
    gradQ_.FreeTensor(tokenGrad);
  }

  // Reduces the accumulators of one row and stages the sums for the final copy to global memory.
  __aicore__ inline void FinishRow(uint32_t localRow, const LocalTensor<float> &acc) {
    LocalTensor<float> red = reduced_.Get<float>(), work = work_.Get<float>();
    const uint32_t used = cols_ < tileLen_ ? cols_ : tileLen_;  // accumulator entries that were written
    for (uint32_t k = 0; k < kNumStats; ++k) ReduceSum(red[k * 8], Slot(acc, k), work, used);
    PipeBarrier<PIPE_ALL>();  // scalar reads of vector results below
    LocalTensor<float> loss = outLoss_.Get<float>(), stats = outStats_.Get<float>();
    float sums[kNumStats];
    for (uint32_t k = 0; k < kNumStats; ++k) {
      sums[k] = red.GetValue(k * 8);
      stats.SetValue(localRow * kNumStats + k, sums[k]);
    }
    loss.SetValue(localRow, sums[1] + hp_.beta * sums[2]);  // = sum m * (pg + beta * kl)
    PipeBarrier<PIPE_ALL>();  // the next row's vector work reuses red
  }

  __aicore__ inline void WriteOut() {
    const uint32_t rows = rowEnd_ - rowBegin_;
    LocalTensor<float> loss = outLoss_.Get<float>(), stats = outStats_.Get<float>();
    PipeBarrier<PIPE_ALL>();
    DataCopyExtParams lossParams{1, static_cast<uint32_t>(rows * sizeof(float)), 0, 0, 0};
    DataCopyPad(rowLossGm_[rowBegin_], loss, lossParams);  // exact byte count: neighbouring cores' rows untouched
    DataCopyExtParams statParams{1, static_cast<uint32_t>(rows * kNumStats * sizeof(float)), 0, 0, 0};
    DataCopyPad(rowStatsGm_[static_cast<uint64_t>(rowBegin_) * kNumStats], stats, statParams);
  }

  TPipe pipe_;
  TileLoader loader_;
  TBuf<QuePosition::VECCALC> scratch_, accum_, work_, reduced_, outLoss_, outStats_;
  TQue<QuePosition::VECOUT, kBufferNum> gradQ_;
  GlobalTensor<float> rowLossGm_, rowStatsGm_, tokenGradGm_;
  Hyper hp_;
  uint32_t cols_ = 0, tileLen_ = 0, rowBegin_ = 0, rowEnd_ = 0;
  bool tokenAdv_ = false, klGrad_ = false;
};

extern "C" __global__ __aicore__ void grpo_token_loss(GM_ADDR logp, GM_ADDR old_logp, GM_ADDR ref_logp,
                                                      GM_ADDR advantages, GM_ADDR mask, GM_ADDR hyper,
                                                      GM_ADDR row_loss, GM_ADDR row_stats, GM_ADDR token_grad,
                                                      GM_ADDR workspace, GM_ADDR tiling) {
  GET_TILING_DATA(tilingData, tiling);
  GrpoTokenLossKernel op;
  op.Init(logp, old_logp, ref_logp, advantages, mask, hyper, row_loss, row_stats, token_grad, tilingData);
  op.Process();
}
