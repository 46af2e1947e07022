"""Record TRL 1.16's GRPO loss and LoRA gradients with a PEFT adapter: the committed
tests/fixtures/trl_lora_reference.npz that tests/test_lora_trl.py holds mindgrpo's LoRA to.

Runs in TRL's venv (TRL 1.16 needs transformers 5; see tools/make_trl_loss_reference.py) on the project's generated
tiny model:

    bash tools/make_trl_venv.sh trlenv
    trlenv/bin/python tools/make_trl_lora_reference.py --model "$(python tests/fixtures/cache.py tiny-qwen2.5)"

Each case builds a real ``trl.GRPOTrainer`` with ``peft_config=LoraConfig(r=4, lora_alpha=8, every linear)``, sets
the adapters to fixed nonzero values (so the policy differs from the reference, the backbone with the adapters
off, and every product of the LoRA path carries a gradient), lets TRL generate and score its own completions
(``_generate_and_score_completions``: two prompts of equal length x 4 completions, the reward the completion's
length, so the advantages vary; the completions are then cut to ragged lengths by their mask), and calls TRL's ``_compute_loss`` on that batch; it stores the batch, the
adapters, TRL's per-token log-probs, reference log-probs (beta > 0), the loss and every adapter's gradient, under
PEFT's saved names (``model.layers.N.self_attn.q_proj.lora_A.weight``). Cases: loss_type grpo, dapo and dr_grpo,
each with beta 0 and 0.04 (on-policy, one iteration, TRL's defaults otherwise).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import tempfile

import numpy as np
import torch
from datasets import Dataset
from peft import LoraConfig
from safetensors.numpy import load_file
from trl import GRPOConfig, GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
B, G, T = 8, 4, 10  # completions, completions per prompt, completion limit
LENGTHS = [10, 7, 4, 10, 9, 2, 6, 10]
RANK, ALPHA = 4, 8.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = ["What is 3 plus 4?", "What is 5 minus 2?"]  # the same token length: TRL's arange positions are ours


def cases():
    return [(f"{loss}_beta{beta}", {"loss_type": loss, "beta": beta}) for loss in ("grpo", "dapo", "dr_grpo")
            for beta in (0.0, 0.04)]


def adapter_name(name: str) -> str:
    return name.replace("base_model.model.", "").replace(".default", "")


def run_case(model_dir: str, out_dir: str, settings: dict) -> dict:
    args = GRPOConfig(output_dir=out_dir, loss_type=settings["loss_type"], beta=settings["beta"],
                      per_device_train_batch_size=B, num_generations=G, max_completion_length=T,
                      gradient_accumulation_steps=1, bf16=False, fp16=False, use_cpu=True, report_to=[],
                      gradient_checkpointing=False, seed=0, logging_steps=1, temperature=1.0)
    data = Dataset.from_dict({"prompt": PROMPTS * 4})
    trainer = GRPOTrainer(model=model_dir, args=args, train_dataset=data,
                          reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
                          peft_config=LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0,
                                                 bias="none", task_type="CAUSAL_LM"))
    trainer.current_gradient_accumulation_steps = 1
    generator = torch.Generator().manual_seed(7)
    adapters = {}
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_" in name:
                scale = 1.0 / param.shape[1] ** 0.5 if "lora_A" in name else 0.05
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
                adapters[adapter_name(name)] = param.detach().numpy().copy()
    torch.manual_seed(0)
    trainer.model.eval()
    batch = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(G)])
    assert bool(batch["prompt_mask"].all()), "the prompts were padded: pick prompts of one token length"
    # The random tiny model never samples EOS, so every completion would run to the limit, where grpo, dapo and
    # dr_grpo reduce alike; ragged lengths (the tail masked, as an EOS would) make each reduction its own.
    lengths = torch.tensor(LENGTHS)
    batch["completion_mask"] = batch["completion_mask"] * (torch.arange(T)[None] < lengths[:, None])
    batch["num_items_in_batch"] = batch["completion_mask"].sum()
    trainer.model.train()
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention,
                                                           batch["completion_ids"].shape[1])[0]
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    grads = {adapter_name(n): p.grad.numpy().copy() for n, p in trainer.model.named_parameters() if p.requires_grad}
    out = {"loss": np.float32(loss.item()), "per_token_logps": logps.numpy(),
           "settings": np.array(json.dumps({**settings, "epsilon": args.epsilon,
                                            "epsilon_high": args.epsilon_high or args.epsilon,
                                            "max_completion_length": T}))}
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages"):
        out[key] = batch[key].numpy()
    out["num_items_in_batch"] = np.float32(batch["num_items_in_batch"])
    if settings["beta"]:
        out["ref_per_token_logps"] = batch["ref_per_token_logps"].numpy()
    out.update({f"adapter/{k}": v for k, v in adapters.items()})  # the same every case (one seed): kept once
    out.update({f"grad/{k}": v for k, v in grads.items()})
    print(f"{settings}: loss {loss.item():+.8f}, |grad|_1 {sum(np.abs(g).sum() for g in grads.values()):.6f}, "
          f"completion lengths {batch['completion_mask'].sum(1).tolist()}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the generated tiny-qwen2.5 folder (with its tokenizer)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "trl_lora_reference.npz"))
    a = ap.parse_args()
    record = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, settings in cases():
            for key, value in run_case(a.model, tmp, settings).items():
                if key.startswith("adapter/"):
                    assert key not in record or np.array_equal(record[key], value)
                    record[key] = value
                else:
                    record[f"case/{name}/{key}"] = value
    record["cases"] = np.array([name for name, _ in cases()])
    # which model the references were made on: the test checks its own fixture is that model
    record["model/abs_sum"] = np.float64(sum(np.abs(t.astype(np.float64)).sum()
                                             for t in load_file(str(Path(a.model) / "model.safetensors")).values()))
    np.savez_compressed(a.out, **record)
    print(f"wrote {len(cases())} cases to {a.out}")


if __name__ == "__main__":
    main()
