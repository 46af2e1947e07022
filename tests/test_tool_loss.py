"""Tool responses stay out of the loss (issue: multi-turn tools, token-in token-out). A ModelWorker's update on
completions that hold tool responses (``RolloutBatch.tool_mask``) must equal, padded and packed, TRL's GRPO loss
over the model's own tokens (float64 torch, tests/test_algorithm.torch_reference) chained through the actor's log-
probs of the whole sequences, tool tokens included as context: the loss from the reference formula, the weight
gradients as the vector-Jacobian product of its d loss / d log-probs with the actor's own full-sequence forward.
And whatever fails in a tool call (issue 46), its answer's tokens are marked so, and the rollout goes on."""
import sys
from pathlib import Path

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before MindSpore)
import mindspore as ms
from mindspore import Tensor, ops


from mindgrpo.tools import ToolCall

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_algorithm import torch_reference  # noqa: E402
from test_packing import B, NUM_GENERATIONS, VOCAB, W, capture_instead_of_applying, make_rollouts, worker  # noqa: E402
from tiny_qwen import make_tiny_qwen2  # noqa: E402


def with_tool_responses(rollouts):
    """The rollouts with tool responses inside some completions (after a model turn, followed by more model
    tokens), one at a completion's end, and none in others."""
    import dataclasses

    tool = np.zeros_like(rollouts.completion_mask)
    tool[0, 2:6] = 1   # a 9-token completion: 2 model tokens, a 4-token response, 3 model tokens
    tool[5, 1:4] = 1   # 8 tokens
    tool[8, 3:6] = 1   # 6 tokens: the response ends the completion
    tool[11, 2:4] = 1  # 7 tokens
    assert (tool <= rollouts.completion_mask).all()
    return dataclasses.replace(rollouts, tool_mask=tool)


def vjp_through_the_actor(pol, rollouts, cotangent: np.ndarray):
    """d/d weights of sum(cotangent * log-probs of the completion tokens), the log-probs from the actor's own
    full-sequence forward over [prompt | completion] rows (every completion token attended to, tool ones too)."""
    of_row = np.arange(len(rollouts.completion_ids)) // NUM_GENERATIONS
    ids = np.concatenate([rollouts.prompt_ids[of_row], rollouts.completion_ids], 1)
    mask = np.concatenate([rollouts.prompt_mask[of_row], rollouts.completion_mask], 1)
    p = rollouts.prompt_ids.shape[1]
    forward = pol.actor.full_sequence(ids.shape[1])
    target = Tensor(rollouts.completion_ids[..., None].astype(np.int32))
    weight = Tensor(cotangent.astype(np.float32))

    def objective(ids, mask):
        logits = forward(ids, mask)[:, p - 1:p - 1 + W]
        logp = ops.gather_elements(ops.log_softmax(logits, -1), 2, target)[..., 0]
        return (logp * weight).sum()

    grads = ms.grad(objective, grad_position=None, weights=pol.params)(Tensor(ids), Tensor(mask))
    return [g.asnumpy() for g in grads]


def test_the_update_trains_on_the_models_tokens_only(tmp_path):
    """Padded and packed micro-batches (one model, one reference: the reference does not depend on the path)."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        model_dir = make_tiny_qwen2(tmp_path / "model", layers=2, vocab=VOCAB)
        plain = make_rollouts(2)
        rollouts = with_tool_responses(plain)
        rng = np.random.default_rng(3)
        advantages = rng.standard_normal(B * NUM_GENERATIONS).astype(np.float32)
        drift = (rng.normal(0, 0.3, plain.completion_mask.shape) * plain.completion_mask).astype(np.float32)
        noise = 0.2 * rng.standard_normal(drift.shape).astype(np.float32)
        results, expected = {}, None
        for name, budget in (("padded", 0), ("packed", 4 * W)):
            grads = []
            # two passes per rollout (so the old log-probs given are used: ratio and clip live), no clipping (the
            # captured gradients are then the loss's own)
            pol = capture_instead_of_applying(worker(model_dir, "grpo", budget, max_grad_norm=0.0), grads)
            # the reference is the actor's initial weights: moved off them, so the KL term is live too
            ref = pol.reference_logprobs(rollouts) + noise
            logp = pol.actor_logprobs(rollouts)
            old = logp + drift  # an off-policy ratio: the clip and KL terms are live
            metrics = pol.update(rollouts, advantages, old, ref, total_steps=1)
            pol.update(plain, advantages, old, ref, total_steps=1)  # the same rollouts, every token in the loss
            results[name] = (metrics, grads[0], grads[2])  # each update's first pass (the weights never move)
            if expected is None:
                model_mask = rollouts.completion_mask * (1 - rollouts.tool_mask)
                loss, dlogp, _ = torch_reference(logp, old, ref, advantages, model_mask, loss_type="grpo", beta=0.04,
                                                 epsilon_low=0.2, epsilon_high=0.2, use_bias_correction_kl=False)
                expected = vjp_through_the_actor(pol, rollouts, dlogp)
    finally:
        ms.set_context(mode=previous)
    for name, (metrics, ours, everything) in results.items():
        assert metrics["actor/loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7), name
        differs = 0
        for grad, want, unmasked in zip(ours, expected, everything):
            scale = np.abs(want).max()
            assert scale > 0 and np.abs(grad - want).max() <= 2e-5 * scale, name
            differs += np.abs(unmasked - want).max() > 1e-2 * scale
        assert differs > len(expected) // 2  # the tool tokens would have moved the gradients had they been in the loss


# ------------------------------------------------------------------------------------------------ tool failures
# Whatever goes wrong with a tool call, a rollout answers it with text the model reads (or ends the completion), the
# answer's tokens are marked in tool_mask and so stay out of the loss, and the run goes on. Each failure a rollout
# meets, in the native engine with the real ToolTurns and ToolRunner (tool worker processes, the python sandbox),
# on the fixture model, its turns ended by stop ids it samples early.
FAILURES = {
    "malformed call": ([ToolCall(error="the tool call is not valid JSON (Expecting value at character 0)")],
                       "Error: the tool call is not valid JSON"),
    "unknown tool": ([ToolCall("websearch", {"q": "weather"})], "Error: there is no tool 'websearch'"),
    "wrong arguments": ([ToolCall("calculator", {"expr": "1"})], "Error: calculator takes (expression)"),
    "tool raises": ([ToolCall("calculator", {"expression": "1 / 0"})], "Error: calculator raised ZeroDivisionError"),
    "tool times out": ([ToolCall("hang", {"seconds": 60})], "Error: hang took longer than 2 s and was stopped"),
    "tool kills its worker": ([ToolCall("die", {})], "exit status 3"),
    "code fails in the sandbox": ([ToolCall("python", {"code": "import os\nos.fork()"})], "PermissionError"),
}
TOOLS = ["calculator", "python", "tool_examples:hang", "tool_examples:die"]


@pytest.fixture(scope="module")
def tool_engine(tiny_model_dir):
    """The fixture model's native engine and its tokenizer."""
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.models import build_model
    from mindgrpo.rollout import build_rollout_engine

    engine = build_rollout_engine("native", build_model(tiny_model_dir), eos_token_id=4095, pad_token_id=4093,
                                  max_prompt_length=32, max_batch_size=4, prompt_length_buckets=(32,))
    return engine, load_tokenizer(tiny_model_dir)


PROMPT_IDS = [[17, 250, 3001, 42, 9], [800, 12, 7, 1999]]
# The random fixture model samples about uniformly from its 4096 ids: with every 12th id a stop, its turns end after
# a dozen tokens or so, and a completion holds more than one.
STOPS = tuple(range(1, 4000, 12))


def tool_rollout(tool_engine, calls, monkeypatch, *, max_tokens=128, max_turns=2, max_response_tokens=64,
                 timeout=2.0, runner=None, stops=STOPS):
    """A rollout in which every model turn makes ``calls``: (the result, the ToolTurns' stats, each tool span's
    text per row)."""
    from mindgrpo.rollout import SamplingParams
    from mindgrpo.tools import ToolRunner, ToolTurns, resolve_tools, turns

    engine, tokenizer = tool_engine
    monkeypatch.setattr(turns, "parse_calls", lambda text: list(calls))
    runner = runner or ToolRunner(resolve_tools(TOOLS), processes=2, timeout=timeout)
    handler = ToolTurns(tokenizer, runner, max_turns=max_turns, max_response_tokens=max_response_tokens)
    try:
        result = engine.generate(PROMPT_IDS, SamplingParams(max_tokens=max_tokens, num_generations=2, seed=5,
                                                            stop_token_ids=stops), turns=handler)
    finally:
        runner.close()
    return result, handler.take_stats(), tool_spans(result, tokenizer, stops)


def tool_spans(result, tokenizer, stops):
    """Each row's tool responses, checked to be whole template answers right after a turn the model ended, and the
    loss mask checked to hold none of their tokens."""
    from mindgrpo.tools import responses_text

    assert np.array_equal(result.model_mask + result.tool_mask, result.completion_mask)
    assert not (result.model_mask * result.tool_mask).any()  # no tool token in the loss
    spans = []
    for ids, tool, valid in zip(result.completion_ids, result.tool_mask, result.completion_mask):
        ids, tool = ids[valid == 1].tolist(), tool[valid == 1].tolist()
        row, at = [], 0
        while at < len(ids):
            if tool[at]:
                end = at + tool[at:].index(0) if 0 in tool[at:] else len(ids)
                assert ids[at - 1] in stops + (4095,) and not tool[at - 1]  # right after a turn the model ended
                text = tokenizer.decode(ids[at:end], skip_special_tokens=False)
                inner = text.split("<tool_response>\n", 1)[1].rsplit("\n</tool_response>", 1)[0]
                assert ids[at:end] == tokenizer.encode(responses_text([inner]))  # whole: never cut
                row.append(inner)
                at = end
            else:
                at += 1
        spans.append(row)
    return spans


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failing_tool_call_is_answered_and_never_trained(failure, tool_engine, monkeypatch):
    calls, said = FAILURES[failure]
    result, stats, spans = tool_rollout(tool_engine, calls, monkeypatch)
    answers = [inner for row in spans for inner in row]
    assert answers and all(said in inner for inner in answers), answers
    assert stats["calls"] >= len(answers)  # an answer longer than the room left ends its row unanswered
    assert stats["errors"] == (0 if failure.startswith("code") else stats["calls"])  # the code's own error is its
    assert stats["timeouts"] == (stats["calls"] if failure == "tool times out" else 0)


def test_the_turn_cap_ends_the_completion_without_an_answer(tool_engine, monkeypatch):
    from mindgrpo.rollout import FINISH_STOP
    from mindgrpo.tools import ToolCall

    result, stats, spans = tool_rollout(tool_engine, [ToolCall("calculator", {"expression": "127 * 46"})],
                                        monkeypatch, max_turns=1)
    assert all(row == ["5842"] for row in spans if row) and any(spans)
    assert stats["over_turn_limit"] == sum(reason == FINISH_STOP for reason in result.finish_reasons) > 0


def test_a_completion_cut_inside_a_call_or_before_a_response_fits_holds_no_tool_token(tool_engine, monkeypatch):
    """Cut inside a call: the turn never ends, its tokens are the model's own (in the loss), nothing answers. A
    response longer than the room left is not appended at all (the engine never cuts one), the row ends there."""
    from mindgrpo.rollout import FINISH_LENGTH
    from mindgrpo.tools import ToolCall

    cut, stats, spans = tool_rollout(tool_engine, [ToolCall("calculator", {"expression": "2 + 2"})], monkeypatch,
                                     stops=(), max_tokens=12)  # no turn ends: every row is cut inside its first
    assert not cut.tool_mask.any() and stats["calls"] == 0 and set(cut.finish_reasons) == {FINISH_LENGTH}
    assert np.array_equal(cut.model_mask, cut.completion_mask)
    loud = [ToolCall("python", {"code": "print('word ' * 500)"})]
    long, stats, spans = tool_rollout(tool_engine, loud, monkeypatch, max_tokens=40)
    assert stats["calls"] > 0 and stats["truncated"] == stats["calls"]  # cut to 64 tokens, still longer than the room
    assert not long.tool_mask.any() and not any(spans) and set(long.finish_reasons) == {FINISH_LENGTH}


def test_a_run_stopped_mid_rollout_leaves_no_call_behind_and_the_next_rollout_is_whole(tool_engine, monkeypatch):
    """Ctrl-C while tool calls run (raised where the runner waits for them, as SIGINT raises it there): the workers
    are killed with their calls, the rollout ends, and the next rollout (a resumed run) answers whole and masked."""
    from mindgrpo.tools import ToolCall, ToolRunner, resolve_tools

    runner = ToolRunner(resolve_tools(TOOLS), processes=2, timeout=30)
    running = []

    def interrupted(*args):
        running.extend(worker.process for worker in runner.pool._workers)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.pool, "_wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tool_rollout(tool_engine, [ToolCall("hang", {"seconds": 60})], monkeypatch, runner=runner)
    assert running and all(process.poll() is not None for process in running)  # killed, with the calls they ran
    result, stats, spans = tool_rollout(tool_engine, [ToolCall("calculator", {"expression": "127 * 46"})],
                                        monkeypatch)
    assert any(spans) and all(inner == "5842" for row in spans for inner in row) and stats["errors"] == 0


PROMPT_LENGTH = 1024  # the demo tokenizer spends about 950 tokens on a prompt offering both tools
FAILING = [ToolCall("python", {"code": "try:\n    print(open('/etc/passwd').read())\nexcept OSError as err:\n"
                                         "    print(type(err).__name__)"}),
           ToolCall(error="the tool call is not valid JSON (Expecting value at character 0)"),
           ToolCall("websearch", {"q": "weather"}), ToolCall("calculator", {"expression": "1 / 0"})]


@pytest.fixture(scope="module")
def failing_tool_run(tmp_path_factory, demo_plain):
    """One GRPO step of the demo model with the calculator and the python tool (in its bwrap sandbox), in which each
    model turn makes the next of FAILING's calls."""
    import itertools
    import json
    import shutil

    from conftest import convert_demo_rows, small_run_config
    from mindgrpo.tools import turns
    from mindgrpo.train.trainer import GRPOTrainer

    folder = tmp_path_factory.mktemp("failing_tools")
    shutil.copytree(demo_plain.model_dir, folder / "model")
    config = json.loads((folder / "model" / "config.json").read_text())
    config["max_position_embeddings"] = 2048  # room for the tool system turn (RoPE: only the limit changes)
    (folder / "model" / "config.json").write_text(json.dumps(config))
    prompts = convert_demo_rows(folder, demo_plain, 4, max_prompt_length=PROMPT_LENGTH,
                                tools=["calculator", "python"])
    run = small_run_config(folder / "run", prompts, folder / "model", max_prompt_length=PROMPT_LENGTH,
                           seq_length=PROMPT_LENGTH + 256, max_tokens=256, verifiers=["accuracy"], mode="pynative",
                           tools=["calculator", "python"], max_tool_turns=2, max_tool_response_tokens=12,
                           max_steps=1, save_ckpt_interval=0)
    calls = itertools.cycle(FAILING)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(turns, "parse_calls", lambda text: [next(calls)])  # the random demo model writes no call
        trainer = GRPOTrainer(run)
        metrics = trainer.train()
    return trainer, metrics


def test_a_run_whose_tool_calls_all_fail_trains_on_the_models_tokens_only_and_goes_on(failing_tool_run):
    trainer, metrics = failing_tool_run
    rollouts = trainer.last_rollouts
    tool = rollouts.tool_mask.astype(bool)
    assert tool.any() and trainer.step == 1 and np.isfinite(metrics["actor/loss"])
    np.testing.assert_array_equal(rollouts.loss_mask, rollouts.completion_mask * ~tool)
    answers = [trainer.tokenizer.decode(ids[mask], skip_special_tokens=False).split("<tool_response>\n")[1]
               for ids, mask in zip(rollouts.completion_ids, tool) if mask.any()]
    assert all(answer.startswith(("Error: ", "PermissionError\n")) for answer in answers), answers  # no root: line
    assert any(answer.startswith("PermissionError\n") for answer in answers)  # the python tool's sandbox answered
    assert metrics["tools/errors"] > 0 and metrics["tools/response_tokens_per_completion"] > 0
