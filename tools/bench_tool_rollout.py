#!/usr/bin/env python
"""What a tool call costs a rollout: the native engine's multi-turn rollouts against single-turn ones.

Model: tools/benchlib.py's random `small` Qwen2 (hidden 512, 8 layers, vocabulary 4,096) with its GSM8K-trained
tokenizer. 4 prompts of about 100 tokens x 8 samples = 32 rows, `--max-tokens` (128) tokens per row, temperature 1.
A random model writes no tool call, and its rows would rarely end a turn, so:
- turns end at stop ids (tools/bench_rollout.py's ragged mix: about geometric lengths);
- every ended turn, up to `--turns` per row, is answered by the real calculator: a call through mindgrpo's
  ToolRunner worker processes, whose answer is tokenised as Qwen2.5's `<tool_response>` turn and fed to the row by
  the engine (one token per decode step, beside the rows still sampling), exactly as a tool run does. Later turns
  end the row.

Three runs, interleaved (best of `--repeats`): single-turn; multi-turn with each answer precomputed (the same
text, no call); multi-turn with the calls. The two multi-turn runs decode the very same tokens (printed), so their
difference is what the calls cost the rollout (the decoding waits for them); the answers' tokens each take one
decode step of their row, in the batch with the rows still sampling, costed at the multi-turn run's seconds per
token. Reported per run: seconds, tokens decoded (the model's / the tools'), tokens per second, calls, seconds in
ToolRunner.

    python tools/bench_tool_rollout.py [--max-tokens 128] [--turns 2] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from benchlib import VOCAB, bench_assets, cpu_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--turns", type=int, default=2, help="answered turns per row")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import mindgrpo  # noqa: F401  (before MindSpore)
    import mindspore as ms

    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.models import build_model
    from mindgrpo.rollout import SamplingParams, build_rollout_engine
    from mindgrpo.tools import ToolCall, ToolRunner, ToolTurns, resolve_tools

    ms.set_context(mode=ms.GRAPH_MODE)
    assets = bench_assets()
    model_dir = assets.model("small")
    tokenizer = load_tokenizer(model_dir)
    hf = json.loads((model_dir / "config.json").read_text())
    pad, eos = hf["pad_token_id"], hf["eos_token_id"]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, pad - 1, size=int(n)).tolist() for n in (96, 104, 112, 120)]
    count = max(1, round(VOCAB * math.log(10) / args.max_tokens))
    stops = tuple(np.linspace(7, pad - 7, count).astype(int).tolist())
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, num_generations=8, seed=0,
                            stop_token_ids=stops)
    engine = build_rollout_engine("native", build_model(model_dir), eos_token_id=eos, pad_token_id=pad,
                                  max_prompt_length=128, max_batch_size=32)
    runner = ToolRunner(resolve_tools(["calculator"]), processes=2, timeout=30)

    from mindgrpo.tools import responses_text

    class EveryTurnCalls(ToolTurns):
        """Reads each of a row's first ``max_turns`` turns as a calculator call (a random model writes none); with
        ``call=False`` answers with the same text without calling (the rollouts are then token for token the same,
        and the difference in time is the calls')."""

        call = True

        def _answer(self, turns, turn_numbers):
            wanted = [f"{127 + len(t)} * 46" for t, k in zip(turns, turn_numbers) if k <= self.max_turns]
            start = time.perf_counter()
            if self.call:
                texts = [r.text for r in self.runner.run([ToolCall("calculator", {"expression": e}) for e in wanted])]
            else:
                texts = [str(eval(e)) for e in wanted]  # noqa: S307  (our own arithmetic strings)
            self._stats["seconds"] += time.perf_counter() - start
            self._stats["calls"] += len(texts)
            answers = iter(texts)
            return [self.tokenizer.encode(responses_text([next(answers)])) if k <= self.max_turns else None
                    for k in turn_numbers]

    calling = EveryTurnCalls(tokenizer, runner, max_turns=args.turns, max_response_tokens=64)
    precomputed = EveryTurnCalls(tokenizer, runner, max_turns=args.turns, max_response_tokens=64)
    precomputed.call = False
    runs = {"single-turn": (None, lambda: engine.generate(prompts, params)),
            "multi-turn, answers precomputed": (precomputed, lambda: engine.generate(prompts, params,
                                                                                    turns=precomputed)),
            "multi-turn, calculator calls": (calling, lambda: engine.generate(prompts, params, turns=calling))}
    for handler, run in runs.values():  # compiles, starts the tool workers
        run()
    calling.take_stats()
    precomputed.take_stats()
    best, ids = {}, {}
    for _ in range(args.repeats):
        for name, (handler, run) in runs.items():
            start = time.perf_counter()
            result = run()
            seconds = time.perf_counter() - start
            stats = handler.take_stats() if handler is not None else {"calls": 0, "seconds": 0.0}
            tool = 0 if result.tool_mask is None else int(result.tool_mask.sum())
            row = {"seconds": round(seconds, 3), "model_tokens": int(result.model_mask.sum()), "tool_tokens": tool,
                   "calls": int(stats["calls"]), "tool_seconds": round(stats["seconds"], 4)}
            ids[name] = result.completion_ids
            if name not in best or seconds < best[name]["seconds"]:
                best[name] = row
    runner.close()
    same = np.array_equal(ids["multi-turn, answers precomputed"], ids["multi-turn, calculator calls"])
    single, quiet, calls_run = best.values()
    calls = max(calls_run["calls"], 1)
    per_token = calls_run["seconds"] / (calls_run["model_tokens"] + calls_run["tool_tokens"])
    print(f"# {cpu_model()}; small random Qwen2, 4 prompts x 8 x {args.max_tokens} tokens, up to {args.turns} "
          f"calculator calls per row; best of {args.repeats}")
    for name, row in best.items():
        tokens = row["model_tokens"] + row["tool_tokens"]
        print(json.dumps({"run": name, **row, "tokens_per_s": round(tokens / row["seconds"], 1)}))
    print(f"the two multi-turn runs decode the same tokens: {same}")
    print(f"per tool call: {(calls_run['seconds'] - quiet['seconds']) / calls * 1e3:.1f} ms of rollout time for the "
          f"call itself ({calls_run['tool_seconds'] / calls * 1e3:.1f} ms in ToolRunner), and "
          f"{calls_run['tool_tokens'] / calls:.1f} answer tokens fed to the row, at the multi-turn rollout's "
          f"{per_token * 1e3:.2f} ms per token ({calls_run['tool_tokens'] / calls * per_token * 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
