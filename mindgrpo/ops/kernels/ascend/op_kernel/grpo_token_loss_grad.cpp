// GrpoTokenLossGrad backward kernel (Ascend C): d_logp[b, t] = d_row_loss[b] * token_grad[b, t].
//
// UNTESTED: needs the CANN toolkit and an Ascend device; it cannot be compiled on the CPU-only development
// machines. Semantics are those of GrpoTokenLossGrad in ../../grpo_token_loss_cpu.cc: the forward stored each
// token's local derivative, so the backward is one scaled copy per row.
#include "grpo_token_common.h"

using namespace AscendC;
using namespace grpo;

class GrpoTokenLossGradKernel {
 public:
  __aicore__ inline void Init(GM_ADDR tokenGrad, GM_ADDR dRowLoss, GM_ADDR dLogp, const GrpoTokenLossTilingData &t) {
    cols_ = t.cols;
    tileLen_ = t.tileLen;
    rowBegin_ = GetBlockIdx() * t.rowsPerCore;
    rowEnd_ = rowBegin_ + t.rowsPerCore < t.rows ? rowBegin_ + t.rowsPerCore : t.rows;
    const uint64_t size = static_cast<uint64_t>(t.rows) * t.cols;
    tokenGradGm_.SetGlobalBuffer((__gm__ float *)tokenGrad, size);
    dRowLossGm_.SetGlobalBuffer((__gm__ float *)dRowLoss, t.rows);
    dLogpGm_.SetGlobalBuffer((__gm__ float *)dLogp, size);
    pipe_.InitBuffer(inQ_, kBufferNum, tileLen_ * sizeof(float));
    pipe_.InitBuffer(outQ_, kBufferNum, tileLen_ * sizeof(float));
  }

  __aicore__ inline void Process() {
    for (uint32_t row = rowBegin_; row < rowEnd_; ++row) {
      const float dout = dRowLossGm_.GetValue(row);
      for (uint32_t start = 0; start < cols_; start += tileLen_) {
        const uint32_t n = cols_ - start < tileLen_ ? cols_ - start : tileLen_;
        const uint64_t offset = static_cast<uint64_t>(row) * cols_ + start;
        DataCopyExtParams params{1, static_cast<uint32_t>(n * sizeof(float)), 0, 0, 0};
        LocalTensor<float> in = inQ_.AllocTensor<float>();
        DataCopyPad(in, tokenGradGm_[offset], params, DataCopyPadExtParams<float>{false, 0, 0, 0.0f});
        inQ_.EnQue(in);
        in = inQ_.DeQue<float>();
        LocalTensor<float> out = outQ_.AllocTensor<float>();
        Muls(out, in, dout, n);
        outQ_.EnQue(out);
        inQ_.FreeTensor(in);
        out = outQ_.DeQue<float>();
        DataCopyPad(dLogpGm_[offset], out, params);
        outQ_.FreeTensor(out);
      }
    }
  }

 private:
  TPipe pipe_;
  TQue<QuePosition::VECIN, kBufferNum> inQ_;
  TQue<QuePosition::VECOUT, kBufferNum> outQ_;
  GlobalTensor<float> tokenGradGm_, dRowLossGm_, dLogpGm_;
  uint32_t cols_ = 0, tileLen_ = 0, rowBegin_ = 0, rowEnd_ = 0;
};

extern "C" __global__ __aicore__ void grpo_token_loss_grad(GM_ADDR token_grad, GM_ADDR d_row_loss, GM_ADDR d_logp,
                                                           GM_ADDR workspace, GM_ADDR tiling) {
  GET_TILING_DATA(tilingData, tiling);
  GrpoTokenLossGradKernel op;
  op.Init(token_grad, d_row_loss, d_logp, tilingData);
  op.Process();
}
