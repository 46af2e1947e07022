"""Record TRL 1.16's own GRPO losses and gradients: the committed tests/fixtures/grpo_loss_reference.npz and
tests/fixtures/trl_toolbox_reference.npz.

trl 1.16 needs transformers 5, which mindformers' pin (4.57.1) forbids, so this runs in a separate venv (it may
reuse the installed torch), on the project's generated tiny model (any Qwen2 folder does: the log-probs are fixed):

    bash tools/make_trl_venv.sh trlenv        # TRL 1.16.0 and transformers 5 over this Python's torch
    trlenv/bin/python tools/make_trl_loss_reference.py --model "$(python tests/fixtures/cache.py tiny-qwen2.5)"

Each case builds a real ``trl.GRPOTrainer`` on the tiny model, replaces its log-prob forward
(``_get_per_token_logps_and_entropies``) by a fixed leaf tensor, calls TRL's ``_compute_loss`` on a hand-made batch
and stores the loss and d loss / d per_token_logps (and / d entropies). ``grpo_loss_reference.npz`` (inputs seed 0):
the clipped surrogate with each reduction (grpo, bnpo, dr_grpo, dapo) x beta {0, 0.04} x epsilon_high {0.2, 0.28},
and for beta 0.04 with and without TRL's default ``use_bias_correction_kl``, 24 cases; per case ``loss``,
``grad_per_token_logps`` and ``config`` = [beta, epsilon_low, epsilon_high, use_bias_correction_kl].
``trl_toolbox_reference.npz`` (inputs seed 1): CISPO, SAPO, ``top_entropy_quantile``, ``entropy_coef`` (token-mean
reductions), GSPO (``importance_sampling_level="sequence"``) with each surrogate, and the four
``vllm_importance_sampling_mode`` values with two caps, off-policy (old log-probs given) and on-policy (none).

The rollout-correction weight is made by TRL too: ``_generate_and_score_completions`` runs with its generation
(``_generate``) returning the fixed completions and sampling log-probs, and its log-prob forward returning the fixed
old log-probs, on a trainer flagged ``use_vllm`` after it was built (vLLM itself is never imported); its output
batch, with the fixed advantages put in, goes to ``_compute_loss``.

Each case's settings are stored as JSON under ``case/<name>/settings`` in mindgrpo's names
(``mindgrpo.algorithm.LossConfig`` fields over ``LossConfig.trl()``'s defaults, plus ``on_policy``), so the test
reads them from the file.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
B, G, T, P = 8, 4, 12, 6  # completions, generations per prompt (2 prompts x 4), completion length, prompt length
EPS = 0.2


def make_inputs(seed: int) -> dict:
    """Fixed random batch. Log-ratios ~ N(0, 0.3) against the old policy, sampling log-probs ~ N(0, 0.15) off the
    old ones, so clips, caps and masks all bind somewhere."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([12, 12, 9, 5, 12, 7, 3, 10])
    completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    old = -(0.5 + 2.5 * torch.rand(B, T, generator=g))
    return {
        "completion_ids": torch.randint(5, 4000, (B, T), generator=g) * completion_mask,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.2, -0.4, 0.0, -0.8, 0.9, 0.9, -1.5, -0.3]),
        "old_per_token_logps": old,
        "ref_per_token_logps": old + 0.2 * torch.randn(B, T, generator=g),
        "sampling_per_token_logps": (old + 0.15 * torch.randn(B, T, generator=g)) * completion_mask,
        "per_token_logps": old + 0.3 * torch.randn(B, T, generator=g),
        "entropies": 2.0 * torch.rand(B, T, generator=g),
        "num_items_in_batch": completion_mask.sum(),
    }


def grpo_cases() -> list[tuple[str, dict]]:
    """The clipped surrogate's grid, named ``<loss_type>_beta<beta>_epshigh<eps_high>[_nokliscorr]``."""
    out = []
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        for beta in (0.0, 0.04):
            for eps_high in (0.2, 0.28):
                for corr in ((True, False) if beta else (True,)):  # the flag does nothing without the KL term
                    out.append((f"{loss_type}_beta{beta:g}_epshigh{eps_high:g}" + ("" if corr else "_nokliscorr"),
                                {"on_policy": False, "loss_type": loss_type, "beta": beta, "epsilon_high": eps_high,
                                 "use_bias_correction_kl": corr}))
    return out


def toolbox_cases() -> list[tuple[str, dict]]:
    """(name, mindgrpo settings). TRL's keys follow from them in ``trl_args``."""
    out = []
    for on_policy in (False, True):
        tag = "onpolicy" if on_policy else "offpolicy"
        base = {"on_policy": on_policy}
        for eps_high in (5.0, 1.1):
            out.append((f"cispo_eps{eps_high:g}_{tag}", {**base, "loss_type": "cispo", "epsilon_high": eps_high}))
        out.append((f"sapo_{tag}", {**base, "loss_type": "sapo"}))
        out.append((f"sapo_beta0.04_{tag}", {**base, "loss_type": "sapo", "beta": 0.04}))
        for rho, loss_type in ((0.2, "grpo"), (0.5, "dapo")):
            out.append((f"entropy{rho:g}_{loss_type}_{tag}", {**base, "loss_type": loss_type,
                                                               "top_entropy_quantile": rho}))
        # TRL's entropy bonus is always the token mean over the loss mask: verl's (and mindgrpo's) "aggregated as the
        # loss" is the same for the token-mean reductions only, so those are the cases TRL can check.
        for loss_type in ("dapo", "bnpo"):
            out.append((f"entropy_coef0.05_{loss_type}_{tag}", {**base, "loss_type": loss_type,
                                                                "entropy_coef": 0.05}))
        for loss_type in ("grpo", "cispo", "sapo"):
            eps = {"epsilon_high": 1.1} if loss_type == "cispo" else {}
            out.append((f"gspo_{loss_type}_{tag}", {**base, "loss_type": loss_type,
                                                    "importance_sampling_level": "sequence", **eps}))
        for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
            for cap in ((3.0, 1.2) if not on_policy else (1.2,)):
                out.append((f"is_{mode}_cap{cap:g}_{tag}", {**base, "loss_type": "dapo", "rollout_correction": mode,
                                                            "rollout_correction_cap": cap}))
    out.append(("is_token_truncate_gspo_sapo_beta0.04_offpolicy",
                {"on_policy": False, "loss_type": "sapo", "importance_sampling_level": "sequence", "beta": 0.04,
                 "rollout_correction": "token_truncate", "rollout_correction_cap": 1.2}))
    return out


def trl_args(settings: dict, out_dir: str) -> GRPOConfig:
    correction = settings.get("rollout_correction", "none")
    return GRPOConfig(
        output_dir=out_dir, loss_type=settings["loss_type"], beta=settings.get("beta", 0.0), epsilon=EPS,
        epsilon_high=settings.get("epsilon_high", EPS),
        use_bias_correction_kl=settings.get("use_bias_correction_kl", True),
        importance_sampling_level=settings.get("importance_sampling_level", "token"),
        top_entropy_quantile=settings.get("top_entropy_quantile", 1.0),
        entropy_coef=settings.get("entropy_coef", 0.0),
        vllm_importance_sampling_correction=correction != "none",
        vllm_importance_sampling_mode=correction if correction != "none" else "sequence_mask",
        vllm_importance_sampling_clip_max=settings.get("rollout_correction_cap", 3.0),
        per_device_train_batch_size=B, num_generations=G, max_completion_length=T,
        gradient_accumulation_steps=1, bf16=False, fp16=False, use_cpu=True, report_to=[],
        gradient_checkpointing=False, seed=0, logging_steps=1)


def make_trainer(model_dir: str, args: GRPOConfig) -> GRPOTrainer:
    data = Dataset.from_dict({"prompt": ["2+2=?"] * B})
    trainer = GRPOTrainer(model=model_dir, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=data)
    trainer.current_gradient_accumulation_steps = 1  # normally set by Trainer's training loop
    trainer.model.train()  # _compute_loss uses the "train" normalisers
    return trainer


def correction_batch(trainer: GRPOTrainer, inputs: dict, old: torch.Tensor) -> dict:
    """TRL's own batch with ``importance_sampling_ratio``, from ``_generate_and_score_completions`` with the
    generation and the log-prob forward replaced by the fixed tensors."""
    mask = inputs["completion_mask"].bool()
    completion_lists = [row[m].tolist() for row, m in zip(inputs["completion_ids"], mask)]
    sampling_lists = [row[m].tolist() for row, m in zip(inputs["sampling_per_token_logps"], mask)]
    prompt_lists = [[11, 12, 13, 14, 15, 16]] * B
    trainer.use_vllm = True  # after construction: only _compute_loss's and the scoring's branches read it
    trainer._generate = lambda prompts: (prompt_lists, completion_lists, None, ["x"] * B, sampling_lists, {}, None,
                                         None)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (old.clone(), None, None)
    batch = trainer._generate_and_score_completions([{"prompt": "2+2=?"}] * B)
    assert torch.equal(batch["completion_mask"], inputs["completion_mask"]), "TRL padded the completions otherwise"
    assert torch.equal(batch["old_per_token_logps"], old)
    batch["advantages"] = inputs["advantages"].clone()  # the ratio does not depend on them; keep them fixed
    batch["num_items_in_batch"] = inputs["num_items_in_batch"]
    return batch


def trl_case(model_dir: str, out_dir: str, settings: dict, inputs: dict):
    """TRL's loss, its gradients with respect to the log-probs and the entropies, and the rollout-correction weight
    it used (ones without correction)."""
    trainer = make_trainer(model_dir, trl_args(settings, out_dir))
    logps = inputs["per_token_logps"].clone().requires_grad_(True)
    old = logps.detach().clone() if settings["on_policy"] else inputs["old_per_token_logps"]
    if settings.get("rollout_correction", "none") != "none":
        batch = correction_batch(trainer, inputs, old)
        weight = batch["importance_sampling_ratio"].expand(B, T).numpy().copy()
    else:
        batch = {"prompt_ids": torch.full((B, P), 11), "prompt_mask": torch.ones(B, P, dtype=torch.long),
                 **{k: inputs[k] for k in ("completion_ids", "completion_mask", "advantages", "ref_per_token_logps",
                                           "num_items_in_batch")}}
        if not settings["on_policy"]:
            batch["old_per_token_logps"] = old
        weight = np.ones((B, T), np.float32)
    if settings.get("beta", 0.0):
        batch["ref_per_token_logps"] = inputs["ref_per_token_logps"]
    entropies = inputs["entropies"].clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logps, entropies, None)
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    grad_entropy = np.zeros((B, T), np.float32) if entropies.grad is None else entropies.grad.numpy().copy()
    return loss.item(), logps.grad.numpy().copy(), grad_entropy, weight


def record(model: str, out_path: str, seed: int, named_cases: list, only: str) -> None:
    """Run `named_cases` through TRL and write them to `out_path` (or print just `only`)."""
    torch.manual_seed(0)
    inputs = make_inputs(seed)
    out = {f"input/{k}": v.numpy() for k, v in inputs.items()}
    out["input/epsilon_low"] = np.float32(EPS)
    names = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, settings in named_cases:
            if only and name != only:
                continue
            loss, grad, grad_entropy, weight = trl_case(model, tmp, settings, inputs)
            out[f"case/{name}/loss"] = np.float32(loss)
            if "use_bias_correction_kl" in settings:  # the grpo grid, in the layout tests/test_algorithm.py reads
                out[f"case/{name}/grad_per_token_logps"] = grad.astype(np.float32)
                out[f"case/{name}/config"] = np.array([settings["beta"], EPS, settings["epsilon_high"],
                                                      settings["use_bias_correction_kl"]], np.float32)
            else:
                out[f"case/{name}/grad"] = grad.astype(np.float32)
                out[f"case/{name}/grad_entropy"] = grad_entropy.astype(np.float32)
                out[f"case/{name}/correction_weight"] = weight.astype(np.float32)
                out[f"case/{name}/settings"] = np.array(json.dumps(settings))
            names.append(name)
            print(f"{name:48s} loss={loss:+.8f} |grad|_1={np.abs(grad).sum():.6f}")
    if only:
        return
    out["cases"] = np.array(names)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out_path, **out)
    print(f"wrote {len(names)} cases to {out_path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Qwen2 folder with its tokenizer (the generated tiny-qwen2.5)")
    ap.add_argument("--out-dir", default=str(ROOT / "tests" / "fixtures"))
    ap.add_argument("--only", default="", help="run just this case and print it (nothing is written)")
    a = ap.parse_args()
    out_dir = Path(a.out_dir)
    record(a.model, str(out_dir / "grpo_loss_reference.npz"), 0, grpo_cases(), a.only)
    record(a.model, str(out_dir / "trl_toolbox_reference.npz"), 1, toolbox_cases(), a.only)


if __name__ == "__main__":
    main()
