// GrpoTokenLoss and GrpoTokenLossGrad: host side (shape inference, tiling, operator definitions) of the fused GRPO
// token loss. Both operators live in this one file so the shared tiling header is compiled once.
//
// UNTESTED: needs the CANN toolkit and an Ascend device; it cannot be compiled on the CPU-only development
// machines. Build and install with `python -m mindgrpo.ops --ascend` on an Ascend host; MindSpore then calls it
// through aclnn (mindgrpo/ops/token_loss.py selects it when the device target is Ascend). Semantics: see
// ../../grpo_token_loss_cpu.cc, the CPU twin that the test suite holds to TRL.
//
//   GrpoTokenLoss     inputs : logp, old_logp, ref_logp [B, T]; advantages [B] or [B, T]; mask [B, T]; hyper [6]
//                     outputs: row_loss [B], row_stats [B, 8], token_grad [B, T]
//   GrpoTokenLossGrad inputs : token_grad [B, T] (stored by the forward), d_row_loss [B]
//                     outputs: d_logp [B, T] = d_row_loss[b] * token_grad[b, t]                      (all float32)
#include "grpo_token_loss_tiling.h"
#include "register/op_def_registry.h"

namespace ge {
static graphStatus InferShapeGrpoTokenLoss(gert::InferShapeContext *context) {
  const gert::Shape *logp = context->GetInputShape(0);
  gert::Shape *rowLoss = context->GetOutputShape(0);
  gert::Shape *rowStats = context->GetOutputShape(1);
  *context->GetOutputShape(2) = *logp;  // token_grad
  rowLoss->SetDimNum(1);
  rowLoss->SetDim(0, logp->GetDim(0));
  rowStats->SetDimNum(2);
  rowStats->SetDim(0, logp->GetDim(0));
  rowStats->SetDim(1, 8);
  return GRAPH_SUCCESS;
}

static graphStatus InferDataTypeGrpoTokenLoss(gert::InferDataTypeContext *context) {
  context->SetOutputDataType(0, DT_FLOAT);
  context->SetOutputDataType(1, DT_FLOAT);
  context->SetOutputDataType(2, DT_FLOAT);
  return GRAPH_SUCCESS;
}

static graphStatus InferShapeGrpoTokenLossGrad(gert::InferShapeContext *context) {
  *context->GetOutputShape(0) = *context->GetInputShape(0);
  return GRAPH_SUCCESS;
}

static graphStatus InferDataTypeGrpoTokenLossGrad(gert::InferDataTypeContext *context) {
  context->SetOutputDataType(0, DT_FLOAT);
  return GRAPH_SUCCESS;
}
}  // namespace ge

namespace ops {
class GrpoTokenLoss : public OpDef {
 public:
  explicit GrpoTokenLoss(const char *name) : OpDef(name) {
    for (const char *input : {"logp", "old_logp", "ref_logp", "advantages", "mask", "hyper"}) {
      this->Input(input).ParamType(REQUIRED).DataType({ge::DT_FLOAT}).Format({ge::FORMAT_ND});
    }
    this->Output("row_loss").ParamType(REQUIRED).DataType({ge::DT_FLOAT}).Format({ge::FORMAT_ND});
    this->Output("row_stats").ParamType(REQUIRED).DataType({ge::DT_FLOAT}).Format({ge::FORMAT_ND});
    this->Output("token_grad").ParamType(REQUIRED).DataType({ge::DT_FLOAT}).Format({ge::FORMAT_ND});
    this->SetInferShape(ge::InferShapeGrpoTokenLoss).SetInferDataType(ge::InferDataTypeGrpoTokenLoss);
    this->AICore().SetTiling(optiling::GrpoTokenLossTiling);
    this->AICore().AddConfig("ascend910b");
    this->AICore().AddConfig("ascend910_93");
  }
};

OP_ADD(GrpoTokenLoss);

class GrpoTokenLossGrad : public OpDef {
 public:
  explicit GrpoTokenLossGrad(const char *name) : OpDef(name) {
    for (const char *input : {"token_grad", "d_row_loss"}) {
      this->Input(input).ParamType(REQUIRED).DataType({ge::DT_FLOAT}).Format({ge::FORMAT_ND});
    }
    this->Output("d_logp").ParamType(REQUIRED).DataType({ge::DT_FLOAT}).Format({ge::FORMAT_ND});
    this->SetInferShape(ge::InferShapeGrpoTokenLossGrad).SetInferDataType(ge::InferDataTypeGrpoTokenLossGrad);
    this->AICore().SetTiling(optiling::GrpoTokenLossGradTiling);
    this->AICore().AddConfig("ascend910b");
    this->AICore().AddConfig("ascend910_93");
  }
};

OP_ADD(GrpoTokenLossGrad);
}  // namespace ops
