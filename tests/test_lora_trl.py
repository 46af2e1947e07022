"""mindgrpo's LoRA GRPO loss against TRL 1.16's GRPOTrainer with a PEFT LoraConfig, on completions TRL generated and
scored itself (tests/fixtures/trl_lora_reference.npz, made by tools/make_trl_lora_reference.py on the generated tiny
model): the policy's log-probs, the reference's (the backbone, adapters off), the loss and every adapter's gradient,
for grpo, dapo and dr_grpo with beta 0 and 0.04, in PyNative and GRAPH."""
import json
from pathlib import Path

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
import mindspore as ms
from mindspore import Tensor, nn

from mindgrpo.algorithm import LossConfig, grpo_loss
from mindgrpo.algorithm.logprobs import token_logprobs
from mindgrpo.models import build_model
from mindgrpo.models.lora import LoraSpec, adapter_parameters

REFERENCE = Path(__file__).parent / "fixtures" / "trl_lora_reference.npz"


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    from safetensors.numpy import load_file

    ref = np.load(REFERENCE)
    ours = sum(np.abs(t.astype(np.float64)).sum() for t in load_file(str(tiny_model_dir / "model.safetensors")).values())
    assert ours == pytest.approx(float(ref["model/abs_sum"]), rel=1e-12), \
        "the generated tiny model is not the one the TRL references were made on: regenerate them"
    return ref


class LoraLoss(nn.Cell):
    """A LoRA policy's GRPO loss on [prompt | completion] rows; the reference log-probs come from the same model's
    backbone (adapters off)."""

    def __init__(self, model, settings, limit):
        super().__init__(auto_prefix=False)
        self.policy = model.completions(64)
        self.settings, self.limit = settings, limit

    def construct(self, input_ids, attention_mask, completion_ids, mask, advantages, ref_logp, num_items):
        logp = token_logprobs(self.policy(input_ids, attention_mask, completion_ids), completion_ids)
        return grpo_loss(logp, None, ref_logp if self.settings.beta > 0 else None, advantages, mask,
                         cfg=self.settings, num_items_in_batch=num_items, max_completion_length=self.limit)[0]


def _case(ref, name):
    return {key[len(f"case/{name}/"):]: ref[key] for key in ref.files if key.startswith(f"case/{name}/")}


CASES = ("grpo_beta0.0", "grpo_beta0.04", "dapo_beta0.0", "dapo_beta0.04", "dr_grpo_beta0.0", "dr_grpo_beta0.04")
# GRAPH compiles three graphs per case (15 s each on 2 busy cores): two of the six cases, one with the KL term and
# one without, run in GRAPH too; the loss types' GRAPH math is tests/test_algorithm.py's, against TRL's own loss
GRAPH_CASES = ("grpo_beta0.04", "dapo_beta0.0")


@pytest.mark.parametrize("ms_mode,name", [("pynative", name) for name in CASES]
                         + [("graph", name) for name in GRAPH_CASES], indirect=["ms_mode"])
def test_lora_loss_and_adapter_gradients_equal_trl_with_peft(ms_mode, tiny_model_dir, reference, name):
    case = _case(reference, name)
    settings = json.loads(str(case["settings"]))
    model = build_model(tiny_model_dir, lora=LoraSpec(4, 8.0))
    adapters = adapter_parameters(model)
    for key, param in adapters.items():
        param.set_data(Tensor(reference[f"adapter/{key}"]))
    ids = np.concatenate([case["prompt_ids"], case["completion_ids"]], 1).astype(np.int32)
    attention = np.concatenate([case["prompt_mask"], case["completion_mask"]], 1).astype(np.int32)
    completion_ids = case["completion_ids"].astype(np.int32)
    mask = case["completion_mask"].astype(np.float32)
    real = mask.astype(bool)
    inputs = (Tensor(ids), Tensor(attention), Tensor(completion_ids))

    logp = token_logprobs(model.completions(64)(*inputs), inputs[2]).asnumpy()
    assert np.abs(logp - case["per_token_logps"])[real].max() < 1e-5
    ref_logp = token_logprobs(model.completions(64, adapters=False)(*inputs), inputs[2]).asnumpy()
    if settings["beta"]:  # TRL's reference for a PEFT model: the adapters disabled
        assert np.abs(ref_logp - case["ref_per_token_logps"])[real].max() < 1e-5

    cfg = LossConfig.trl(loss_type=settings["loss_type"], beta=settings["beta"], epsilon_low=settings["epsilon"],
                         epsilon_high=settings["epsilon_high"])
    grad_fn = ms.value_and_grad(LoraLoss(model, cfg, settings["max_completion_length"]), None,
                                model.trainable_params())
    if ms_mode == "graph":
        grad_fn = ms.jit(grad_fn)
    loss, grads = grad_fn(*inputs, Tensor(mask), Tensor(case["advantages"].astype(np.float32)), Tensor(ref_logp),
                          Tensor(np.float32(case["num_items_in_batch"])))
    assert abs(float(loss) - float(case["loss"])) < 1e-5
    for (key, _), grad in zip(adapters.items(), grads):
        want = case[f"grad/{key}"]
        assert np.abs(grad.asnumpy() - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), key
