"""msrun worker for the tensor-parallel parity tests (tests/test_tensor_parallel.py): every rank builds the full
model (TP=1, no collectives) and its TP slice, and compares log-probs, entropies, gradients (the shared-prompt
pass), the log-probs of the completions pass (``share_prompt: false``) and rollouts (greedy, sampled, and ragged:
rows ending at different steps, which compacts the decode batch on both ranks).

Usage: msrun --worker_num=2 ... tp_worker.py OUT_DIR MODE MODEL_DIR [MODE MODEL_DIR ...]: each (mode, model) in
turn in one launch (the process group is set up once), each writing OUT_DIR/rank{R}_{MODE}.json."""
import json
import sys
from pathlib import Path

import numpy as np

import mindgrpo  # noqa: F401
import mindspore as ms
from mindspore import ParameterTuple, Tensor, nn

from mindgrpo.parallel.groups import all_gather, init_distributed


def main() -> None:
    out, runs = Path(sys.argv[1]), sys.argv[2:]
    ms.set_context(device_target="CPU")
    dist = init_distributed(model_parallel=2)
    for mode, model_dir in zip(runs[::2], runs[1::2]):
        ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
        compare(model_dir, mode, out, dist)


def compare(model_dir: str, mode: str, out: Path, dist) -> None:
    from mindgrpo.models import SharedPromptForward, build_model, hf_parameters
    from mindgrpo.train.step_batch import step_batch
    from mindgrpo.train.step_graphs import CompletionLogProbs
    from mindgrpo.rollout import SamplingParams
    from mindgrpo.rollout.backends.native import NativeRolloutEngine

    full = build_model(model_dir)
    shard = build_model(model_dir, tp_rank=dist.tp_rank, tp_size=dist.tp_size, tp_group=dist.tp_group)
    layout = shard.layout
    vocab, g, t = full.spec.vocab_size, 4, 6
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, vocab - 3, (2, 8)).astype(np.int32)
    mask = np.ones_like(prompt)
    mask[1, :3] = 0  # left padding
    completion = rng.integers(0, vocab, (2 * g, t)).astype(np.int32)
    weights = Tensor(rng.standard_normal((2 * g, t)).astype(np.float32))
    inputs = (step_batch({"prompt_ids": prompt, "prompt_mask": mask, "completion_ids": completion}),)

    class Objective(nn.Cell):
        def __init__(self, model):
            super().__init__(auto_prefix=False)
            self.logprobs = CompletionLogProbs(SharedPromptForward(model, g, 64), 0.7)

        def construct(self, batch, w):
            logp, entropy = self.logprobs(batch)
            return (logp * w).sum(), logp, entropy

    results = {}
    for name, model in (("full", full), ("shard", shard)):
        objective = Objective(model)
        params = ParameterTuple(model.trainable_params())
        grad_fn = ms.value_and_grad(objective, None, params, has_aux=True)

        class Step(nn.Cell):
            def __init__(self):
                super().__init__(auto_prefix=False)
                self.grad_fn = grad_fn

            def construct(self, *args):
                return self.grad_fn(*args)

        (value, logp, entropy), grads = Step()(*inputs, weights)
        names = {id(p): n for n, p in hf_parameters(model).items()}
        results[name] = {"logp": logp.asnumpy(), "entropy": entropy.asnumpy(),
                         "grads": {names[id(p)]: gr.asnumpy() for p, gr in zip(params, grads)}}
    errors = {"logp": float(np.abs(results["full"]["logp"] - results["shard"]["logp"]).max()),
              "logp_scale": float(np.abs(results["full"]["logp"]).max()),
              "entropy": float(np.abs(results["full"]["entropy"] - results["shard"]["entropy"]).max())}
    grad_err = 0.0
    for hf_name, piece in results["shard"]["grads"].items():
        if layout.is_replicated_kv(hf_name):  # each replica saw its own query heads: the trainer sums them
            pieces = all_gather(piece, dist)
            piece = sum(pieces[r] for r in range(layout.tp)
                        if r // layout.kv_replicas == layout.rank // layout.kv_replicas)
        expected = layout.take(hf_name, results["full"]["grads"][hf_name])
        scale = max(1e-3, float(np.abs(expected).max()))
        grad_err = max(grad_err, float(np.abs(piece - expected).max()) / scale)
    errors["grad_rel"] = grad_err
    # rl_config.share_prompt: false: the completions pass over [prompt | completion] rows, on the slices too
    rows = np.concatenate([np.repeat(prompt, g, 0), completion], 1)
    row_mask = np.concatenate([np.repeat(mask, g, 0), np.ones_like(completion)], 1)
    unshared_batch = step_batch({"input_ids": rows, "attention_mask": row_mask, "completion_ids": completion})
    unshared = {name: CompletionLogProbs(model.completions(64), 0.7)(unshared_batch)[0].asnumpy()
                for name, model in (("full", full), ("shard", shard))}
    errors["unshared_logp"] = float(np.abs(unshared["shard"] - unshared["full"]).max())
    errors["unshared_vs_shared"] = float(np.abs(unshared["full"] - results["full"]["logp"]).max())
    errors["shard_param_elements"] = int(sum(p.size for p in shard.trainable_params()))
    errors["full_param_elements"] = int(sum(p.size for p in full.trainable_params()))

    # rollouts: the same tokens from the full model and from the TP slices; "ragged" ends rows at different steps
    # (stop ids the sampled rows draw early), so the ranks must compact the decode batch in step
    prompts = [list(map(int, prompt[0])), list(map(int, prompt[1][3:]))]
    sampled = SamplingParams(max_tokens=10, temperature=1.0, num_generations=2, seed=3)
    kinds = [("greedy", SamplingParams(max_tokens=10, top_k=1, num_generations=2, seed=3)), ("sampled", sampled),
             ("ragged", None)]
    for kind, sampling in kinds:
        if kind == "ragged":
            first = errors["sampled_tokens"]
            sampling = SamplingParams(max_tokens=10, temperature=1.0, num_generations=2, seed=3,
                                      stop_token_ids=(first[0][1], first[2][4]))
        tokens = {}
        for name, model in (("full", full), ("shard", shard)):
            engine = NativeRolloutEngine(model, eos_token_id=vocab - 1, pad_token_id=vocab - 3,
                                         max_prompt_length=16, max_batch_size=4, min_decode_batch=2)
            result = engine.generate(prompts, sampling)
            tokens[name] = [list(map(int, row)) for row in result.completion_ids]
            errors[f"{kind}_lengths"] = result.completion_mask.sum(1).tolist()
        errors[f"{kind}_equal"] = tokens["full"] == tokens["shard"]
        errors[f"{kind}_tokens"] = tokens["shard"]
    (out / f"rank{dist.rank}_{mode}.json").write_text(json.dumps(errors), encoding="utf-8")
    print("TP_RESULT", json.dumps(errors), flush=True)


if __name__ == "__main__":
    main()
