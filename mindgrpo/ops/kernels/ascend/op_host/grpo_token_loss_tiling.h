// Tiling of the GRPO token-loss operators (Ascend C host side), shared by GrpoTokenLoss and GrpoTokenLossGrad.
//
// UNTESTED: needs the CANN toolkit and an Ascend device; it cannot be compiled on the CPU-only development
// machines. Build with `python -m mindgrpo.ops --ascend` on an Ascend host. The CPU twin with the same semantics
// is ../../grpo_token_loss_cpu.cc.
//
// Each AI core takes a contiguous block of rows (sequences); a row is streamed in tiles of `tileLen` tokens.
#ifndef MINDGRPO_GRPO_TOKEN_LOSS_TILING_H
#define MINDGRPO_GRPO_TOKEN_LOSS_TILING_H
#include "register/tilingdata_base.h"
#include "tiling/platform/platform_ascendc.h"

namespace optiling {
BEGIN_TILING_DATA_DEF(GrpoTokenLossTilingData)
TILING_DATA_FIELD_DEF(uint32_t, rows);         // B
TILING_DATA_FIELD_DEF(uint32_t, cols);         // T
TILING_DATA_FIELD_DEF(uint32_t, rowsPerCore);  // rows handled by one AI core (the last core may get fewer)
TILING_DATA_FIELD_DEF(uint32_t, tileLen);      // tokens per tile, a multiple of 8 (32-byte blocks)
TILING_DATA_FIELD_DEF(uint32_t, tokenAdv);     // 1 when advantages are [B, T], 0 when [B]
END_TILING_DATA_DEF;

REGISTER_TILING_DATA_CLASS(GrpoTokenLoss, GrpoTokenLossTilingData)
REGISTER_TILING_DATA_CLASS(GrpoTokenLossGrad, GrpoTokenLossTilingData)

// Unified-buffer budget: ~32 float buffers of tileLen (inputs and token_grad double-buffered, 11 temporaries, 8
// per-row accumulators) must fit in the 192 KiB UB of an Atlas A2 vector core, so 1024 tokens per tile.
constexpr uint32_t kMaxTileLen = 1024;
// Per-core output staging holds rowsPerCore * 9 floats in UB.
constexpr uint32_t kMaxRowsPerCore = 1024;

// Shared by both operators: input 0 is [B, T] (logp forward, token_grad backward) and rows are split the same way.
// Returns GRAPH_FAILED for shapes the kernels do not handle.
static ge::graphStatus GrpoTokenTiling(gert::TilingContext *context, bool forward) {
  const gert::Shape &logp = context->GetInputShape(0)->GetStorageShape();
  if (logp.GetDimNum() != 2) return ge::GRAPH_FAILED;
  const uint32_t rows = static_cast<uint32_t>(logp.GetDim(0));
  const uint32_t cols = static_cast<uint32_t>(logp.GetDim(1));
  if (rows == 0 || cols == 0) return ge::GRAPH_FAILED;
  auto platform = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
  const uint32_t cores = platform.GetCoreNumAiv();
  const uint32_t rowsPerCore = (rows + cores - 1) / cores;
  if (rowsPerCore > kMaxRowsPerCore) return ge::GRAPH_FAILED;
  const uint32_t usedCores = (rows + rowsPerCore - 1) / rowsPerCore;
  const uint32_t tileLen = cols >= kMaxTileLen ? kMaxTileLen : (cols + 7) / 8 * 8;

  GrpoTokenLossTilingData tiling;
  tiling.set_rows(rows);
  tiling.set_cols(cols);
  tiling.set_rowsPerCore(rowsPerCore);
  tiling.set_tileLen(tileLen);
  uint32_t tokenAdv = 0;
  if (forward) {
    const gert::Shape &adv = context->GetInputShape(3)->GetStorageShape();
    tokenAdv = adv.GetDimNum() == 2 && adv.GetDim(1) == logp.GetDim(1) ? 1 : 0;
  }
  tiling.set_tokenAdv(tokenAdv);
  context->SetBlockDim(usedCores);
  tiling.SaveToBuffer(context->GetRawTilingData()->GetData(), context->GetRawTilingData()->GetCapacity());
  context->GetRawTilingData()->SetDataSize(tiling.GetDataSize());
  size_t *workspace = context->GetWorkspaceSizes(1);
  workspace[0] = platform.GetLibApiWorkSpaceSize();  // Ascend C's system workspace; the kernels need none
  return ge::GRAPH_SUCCESS;
}

static ge::graphStatus GrpoTokenLossTiling(gert::TilingContext *context) { return GrpoTokenTiling(context, true); }
static ge::graphStatus GrpoTokenLossGradTiling(gert::TilingContext *context) {
  return GrpoTokenTiling(context, false);
}
}  // namespace optiling
#endif  // MINDGRPO_GRPO_TOKEN_LOSS_TILING_H
