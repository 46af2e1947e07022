"""Rollout engines: the native KV-cache decoder against full-forward references, sampling semantics, buckets.

References are independent of the code under test: transformers' Qwen2 on the fixture weights, the
``mindgrpo.models`` forward (MindFormers' layers) on a small random Qwen2 (tied and untied), and transformers'
logits warpers for the sampling options. Engines are module-scoped: every distinct bucket costs a graph
compilation, so the tests share a few buckets (3 distinct prompts x num_generations=2 -> prompt batch 4, batch 8, prompt
length 16, max_tokens <= 32).
"""
import dataclasses
import json

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
import mindspore as ms
from mindspore import Tensor, ops

from mindgrpo.models import build_model
from mindgrpo.rollout import FINISH_LENGTH, FINISH_STOP, SamplingParams, build_rollout_engine
from mindgrpo.rollout.sampler import TokenSampler, process_logits, row_uniforms

VOCAB, PAD, EOS = 384, 382, 383
PROMPTS = [[5, 17, 42], [7, 7, 101, 250, 3, 77, 12, 9, 311], [99, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
ENGINE = dict(eos_token_id=EOS, pad_token_id=PAD, max_prompt_length=32, max_batch_size=8,
              prompt_length_buckets=(16, 32), min_decode_batch=2)  # compaction 8 -> 4 -> 2


# ----------------------------------------------------------------------------------------------- models
def write_random_qwen2(folder, *, tied: bool, seed: int):
    """A small random Qwen2 as a Hugging Face folder, with weights large enough for clear argmax margins."""
    from safetensors.numpy import save_file

    hidden, heads, kv_heads, inter, layers = 64, 4, 2, 112, 2
    kv = kv_heads * hidden // heads
    rng = np.random.default_rng(seed)

    def normal(std, *shape):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(0.5, VOCAB, hidden),
               "model.norm.weight": 1 + normal(0.1, hidden)}
    if not tied:
        tensors["lm_head.weight"] = normal(0.5, VOCAB, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": normal(0.15, hidden, hidden),
            p + "self_attn.q_proj.bias": normal(0.1, hidden),
            p + "self_attn.k_proj.weight": normal(0.15, kv, hidden), p + "self_attn.k_proj.bias": normal(0.1, kv),
            p + "self_attn.v_proj.weight": normal(0.15, kv, hidden), p + "self_attn.v_proj.bias": normal(0.1, kv),
            p + "self_attn.o_proj.weight": normal(0.1, hidden, hidden),
            p + "mlp.gate_proj.weight": normal(0.1, inter, hidden),
            p + "mlp.up_proj.weight": normal(0.1, inter, hidden),
            p + "mlp.down_proj.weight": normal(0.1, hidden, inter),
            p + "input_layernorm.weight": 1 + normal(0.1, hidden),
            p + "post_attention_layernorm.weight": 1 + normal(0.1, hidden)})
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
              "vocab_size": VOCAB, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": tied, "use_sliding_window": False,
              "bos_token_id": PAD, "pad_token_id": PAD, "eos_token_id": EOS, "torch_dtype": "float32"}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def random_models(tmp_path_factory):
    """variant -> (actor, native engine), built on first use and shared by the module's tests. Variants: "untied",
    "tied", "untied-plain" (the untied actor's engine on the plain-ops decode graph), and "untied-nocompact" and
    "untied-plain-nocompact" (those engines decoding every row of a chunk until the last one ends)."""
    built = {}

    def get(variant):
        if variant not in built:
            if variant.startswith("untied-"):
                actor = get("untied")[0]
                options = dict(decode_impl="plain" if "plain" in variant else "fused",
                               compact="nocompact" not in variant)
                built[variant] = (actor, build_rollout_engine("native", actor, **ENGINE, **options))
            else:
                folder = write_random_qwen2(tmp_path_factory.mktemp(variant), tied=variant == "tied", seed=3)
                actor = build_model(folder)
                built[variant] = (actor, build_rollout_engine("native", actor, **ENGINE))
        return built[variant]
    return get


# The shared model has an untied lm_head: a random tied one mostly repeats its input token (e . e dominates the
# logits), which would make the greedy and stop-token checks trivial. The tied path is checked on logits below
# and against transformers on the (tied) fixture.
@pytest.fixture(scope="module")
def random_actor(random_models):
    return random_models("untied")[0]


@pytest.fixture(scope="module")
def native(random_models):
    return random_models("untied")[1]


def full_forward_logits(actor, sequences):
    """float32 [rows, len, vocab]: the actor's own forward on each whole (unpadded, right-padded in batch) row."""
    width = max(map(len, sequences))
    ids = np.full((len(sequences), width), PAD, np.int32)
    mask = np.zeros((len(sequences), width), np.int32)
    for i, seq in enumerate(sequences):
        ids[i, :len(seq)], mask[i, :len(seq)] = seq, 1
    return actor.full_sequence(width)(Tensor(ids), Tensor(mask)).asnumpy()


def greedy_reference(last_logits_fn, prompts, steps):
    """Greedy decoding by recomputing the full sequences every step (no cache; ``last_logits_fn(seqs)`` returns
    the logits after each sequence's last token)."""
    seqs = [list(p) for p in prompts]
    for _ in range(steps):
        logits = last_logits_fn(seqs)
        top2 = np.sort(logits, axis=-1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0]).min() > 1e-3, "argmax too close to call: pick other prompts"
        for seq, token in zip(seqs, np.argmax(logits, axis=-1)):
            seq.append(int(token))
    return [seq[len(p):] for seq, p in zip(seqs, prompts)]


# ----------------------------------------------------------------------------------------------- fixture vs HF
def test_native_greedy_matches_transformers_on_fixture(tiny_model_dir):
    """Token-for-token greedy equality and per-step logits within 1e-4 against transformers' full forward, for
    prompts of different lengths decoded together (left-padded inside one bucket)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen2ForCausalLM.from_pretrained(str(tiny_model_dir), torch_dtype=torch.float32).eval()

    def hf_logits(seq):
        with torch.no_grad():
            return hf(torch.tensor([seq])).logits[0].numpy()

    engine = build_rollout_engine("native", build_model(tiny_model_dir), eos_token_id=4095, pad_token_id=4093,
                                  max_prompt_length=32, max_batch_size=4, prompt_length_buckets=(32,))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 4000, size=n).tolist() for n in (5, 9, 14, 23)]
    steps = 12
    result = engine.generate(prompts, SamplingParams(max_tokens=steps, temperature=0, logprobs=True))
    expected = greedy_reference(lambda seqs: np.stack([hf_logits(seq)[-1] for seq in seqs]), prompts, steps)
    forced = engine.forced_logits(prompts, expected)
    for row, prompt in enumerate(prompts):
        assert result.completion_ids[row].tolist() == expected[row]
        full = hf_logits(prompt + expected[row])[len(prompt) - 1:]  # logits predicting each completion token (+1)
        assert np.abs(forced[row] - full).max() < 1e-4
        reference_logprobs = full[np.arange(steps), expected[row]] - np.log(np.exp(full[:steps]).sum(-1))
        assert np.abs(result.logprobs[row] - reference_logprobs).max() < 1e-4
    assert result.finish_reasons == [FINISH_LENGTH] * len(prompts)


# ----------------------------------------------------------------------------------------------- random model
def check_logits_match_full_forward(random_actor, native):
    """Per-step logits (prefill + every decode step, each prompt forked to two rows) equal the actor's forward on
    the whole sequence within 1e-4."""
    rng = np.random.default_rng(1)
    rows = [p for p in PROMPTS for _ in range(2)]
    continuations = [rng.integers(0, VOCAB, size=n).tolist() for n in (20, 7, 13, 1, 25, 9)]
    forced = native.forced_logits(rows, continuations)
    full = full_forward_logits(random_actor, [p + c for p, c in zip(rows, continuations)])
    for row, (prompt, cont) in enumerate(zip(rows, continuations)):
        expected = full[row, len(prompt) - 1:len(prompt) + len(cont)]
        assert forced[row].shape == expected.shape
        assert np.abs(forced[row] - expected).max() < 1e-4


def test_native_logits_match_full_forward(random_actor, native, ms_mode):
    """... whatever mode the caller runs in (the engine compiles GRAPH-mode Cells), and its mode is restored."""
    mode = ms.get_context("mode")
    check_logits_match_full_forward(random_actor, native)
    assert ms.get_context("mode") == mode


def test_tied_lm_head_logits_match_full_forward(random_models):
    check_logits_match_full_forward(*random_models("tied"))


def test_plain_decode_graph_matches_full_forward_and_the_fused_kernels(random_models):
    """The plain-ops decode graph (the fused kernels' reference twin, and the path on other devices and dtypes)
    matches the full forward, and the fused engine's logits and greedy tokens match it to float32 rounding."""
    actor, plain = random_models("untied-plain")
    fused = random_models("untied")[1]
    assert fused.fused_decode and not plain.fused_decode
    check_logits_match_full_forward(actor, plain)
    rng = np.random.default_rng(4)
    rows = [p for p in PROMPTS for _ in range(2)]
    continuations = [rng.integers(0, VOCAB, size=n).tolist() for n in (30, 2, 17, 11, 24, 5)]
    for ours, twin in zip(fused.forced_logits(rows, continuations), plain.forced_logits(rows, continuations)):
        np.testing.assert_allclose(ours, twin, rtol=0, atol=1e-5 * np.abs(twin).max())
    params = SamplingParams(max_tokens=20, temperature=0, num_generations=2)
    fused_tokens, plain_tokens = (engine.generate(PROMPTS, params).completion_ids for engine in (fused, plain))
    assert np.array_equal(fused_tokens, plain_tokens)
    assert {type(graph).__name__ for graph in fused.bucket_for(rows, 20).decode.values()} == {"FusedDecodeGraph"}


def test_float16_compute_with_float32_weights(tmp_path):
    """Mixed precision as on Ascend (float32 master weights, half-precision compute, cast inside the graph): logits
    match the actor's own float16 forward to float16 resolution (bfloat16 has no CPU kernels)."""
    actor = build_model(write_random_qwen2(tmp_path, tied=False, seed=3), compute_dtype="float16")
    engine = build_rollout_engine("native", actor, **ENGINE)
    assert engine.weights.param_dtype == ms.float32 and engine.weights.compute_dtype == ms.float16
    assert not engine.fused_decode  # the fused kernels are float32: this engine decodes with the plain ops
    rows = [p for p in PROMPTS for _ in range(2)]
    continuation = [[1, 2, 3, 4, 5]] * len(rows)
    forced = engine.forced_logits(rows, continuation)
    full = full_forward_logits(actor, [p + c for p, c in zip(rows, continuation)])
    for row, prompt in enumerate(rows):
        assert np.abs(forced[row] - full[row, len(prompt) - 1:len(prompt) + 5]).max() < 0.05


def test_native_greedy_matches_recomputed_forward(random_actor, native):
    """Greedy rollouts, num_generations=2 per prompt (prompt-major), equal greedy decoding by full recomputation."""
    steps = 10
    result = native.generate(PROMPTS, SamplingParams(max_tokens=steps, temperature=0, num_generations=2))
    assert result.completion_ids.shape == (6, steps) and result.completion_ids.dtype == np.int32
    def last_logits(seqs):
        full = full_forward_logits(random_actor, seqs)
        return full[np.arange(len(seqs)), [len(seq) - 1 for seq in seqs]]

    for i, expected in enumerate(greedy_reference(last_logits, PROMPTS, steps)):
        assert result.completion_ids[2 * i].tolist() == expected
        assert result.completion_ids[2 * i + 1].tolist() == expected


def test_sampling_logprobs_rows_and_seeds(native):
    """Seeded sampling is reproducible and seed-dependent; rows are prompt-major (row r continues prompt r // n)
    and its log-probs are those of the tempered distribution recomputed from that prompt's forced logits."""
    params = SamplingParams(max_tokens=12, temperature=2.0, num_generations=2, seed=11, logprobs=True)
    first = native.generate(PROMPTS, params)
    again = native.generate(PROMPTS, params)
    other = native.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=2.0, num_generations=2, seed=12,
                                                    logprobs=True))
    assert np.array_equal(first.completion_ids, again.completion_ids)
    assert np.array_equal(first.logprobs, again.logprobs)
    assert not np.array_equal(first.completion_ids, other.completion_ids)
    for r in range(0, 6, 2):  # the two samples of each prompt differ
        assert not np.array_equal(first.completion_ids[r], first.completion_ids[r + 1])

    rows = [p for p in PROMPTS for _ in range(2)]
    completions = [first.completion_ids[r][first.completion_mask[r] == 1].tolist() for r in range(6)]
    forced = native.forced_logits(rows, completions)
    for r, completion in enumerate(completions):
        logp = process_logits(forced[r][:-1], params, 0, [EOS])  # temperature only: the step index is irrelevant
        expected = logp[np.arange(len(completion)), completion]
        got = first.logprobs[r][:len(completion)]
        assert np.abs(got - expected).max() < 1e-4
        assert np.all(first.logprobs[r][len(completion):] == 0)


def test_top_k_one_is_greedy(native):
    greedy = native.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0, num_generations=2))
    top1 = native.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=2.0, top_k=1, num_generations=2, seed=5))
    assert np.array_equal(greedy.completion_ids, top1.completion_ids)


def test_stop_tokens_mask_and_min_tokens(native):
    """A stop id ends the row (kept, mask 1, reason "stop", pad after); min_tokens suppresses it until reached."""
    greedy = native.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0, num_generations=2)).completion_ids
    # a row and a token that first appears at position >= 2 of its greedy completion
    row, stop_at = next((r, i) for r in range(0, 6, 2) for i in range(2, 10) if greedy[r, i] not in greedy[r, :i])
    stop = int(greedy[row, stop_at])
    result = native.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0, stop_token_ids=(stop,),
                                                     num_generations=2))
    for r in range(6):
        ids, mask = result.completion_ids[r], result.completion_mask[r]
        if r in (row, row + 1):
            assert ids.tolist() == greedy[r, :stop_at + 1].tolist() + [PAD] * (9 - stop_at)
            assert mask.tolist() == [1] * (stop_at + 1) + [0] * (9 - stop_at)
            assert result.finish_reasons[r] == FINISH_STOP
        else:  # other prompts stop only if they emit the stop token
            assert result.finish_reasons[r] == (FINISH_STOP if stop in ids[mask == 1] else FINISH_LENGTH)
            assert stop not in ids[mask == 1][:-1]

    held = native.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0, stop_token_ids=(stop,),
                                                   min_tokens=stop_at + 2, num_generations=2))
    ids = held.completion_ids[row].tolist()
    assert ids[:stop_at] == greedy[row, :stop_at].tolist() and ids[stop_at] != stop  # next-best token instead
    assert stop not in ids[:stop_at + 2]
    assert held.completion_mask[row].sum() >= stop_at + 2


def test_weight_updates_reach_the_next_rollout(random_actor, native):
    """The native engine reads the actor's Parameters: an in-place update (as an optimizer does) and a
    set_data both change the next rollout, which then matches the forward with the new weights."""
    params = SamplingParams(max_tokens=6, temperature=0, num_generations=2)
    before = native.generate(PROMPTS, params).completion_ids
    head = random_actor.model.norm_out.weight
    saved = head.asnumpy().copy()
    try:
        scale = np.linspace(0.2, 3.0, saved.size).astype(np.float32)
        ops.assign(head, Tensor(saved * scale))
        native.sync_weights()  # a no-op for native, called as the trainer would
        after_assign = native.generate(PROMPTS, params).completion_ids
        assert not np.array_equal(before, after_assign)
        full = full_forward_logits(random_actor, [PROMPTS[0] + after_assign[0].tolist()])
        assert after_assign[0].tolist() == np.argmax(full[0, len(PROMPTS[0]) - 1:-1], -1).tolist()

        head.set_data(Tensor(saved * scale[::-1].copy()))
        after_set = native.generate(PROMPTS, params).completion_ids
        assert not np.array_equal(after_assign, after_set)
    finally:
        head.set_data(Tensor(saved))
    assert np.array_equal(native.generate(PROMPTS, params).completion_ids, before)


def ragged_stop_ids(engine, params):
    """Stop ids that end the rows of ``engine.generate(PROMPTS, params)`` at different steps. Up to its stop, a row
    samples what it samples without stop ids, so they are picked from a rollout without any: for row r, the first
    token it samples for the first time at step 4r + 1 or later (unless an earlier pick already ends it)."""
    completions = engine.generate(PROMPTS, params).completion_ids
    stops = []
    for row, target in enumerate(range(1, 4 * len(completions), 4)):
        ends = [next((i for i, t in enumerate(c) if t in stops), len(c)) for c in completions]
        fresh = [pos for pos in range(target, ends[row]) if completions[row, pos] not in completions[row, :pos]]
        if fresh:
            stops.append(int(completions[row, fresh[0]]))
    return tuple(stops)


def decode_batches_used(engine, rows, params):
    """Rollout of ``rows`` (as ``engine.generate(PROMPTS, params)`` sends them) and the decode batch of each step."""
    bucket = engine.bucket_for(rows, params.max_tokens)
    graphs, used = dict(bucket.decode), []

    def counted(batch):
        def decode(*args):
            used.append(batch)
            return graphs[batch](*args)
        return decode

    bucket.decode = {batch: counted(batch) for batch in graphs}
    try:
        return engine.generate(PROMPTS, params), used
    finally:
        bucket.decode = graphs


@pytest.mark.parametrize("variant", ["untied", "untied-plain"])
def test_compaction_samples_what_decoding_every_row_samples(random_models, variant):
    """Rows that end at different steps (stop ids) leave the decode batch, which drops to the smaller compiled
    batches (8 -> 4 -> 2): tokens and finish reasons are bit for bit those of the same engine decoding every row to
    the end, greedy and sampled (top-p, top-k, repetition penalty), on the fused kernels and on the plain ops, and
    the log-probs equal them to float32 rounding: the CPU GEMM picks its kernel by the row count, so on some CPUs
    (an AMD EPYC here) products at 8 and at 4 rows differ in the last bit, and the KV cache carries it on (1.5e-6
    measured)."""
    engine, reference = random_models(variant)[1], random_models(variant + "-nocompact")[1]
    rows = [p for p in PROMPTS for _ in range(2)]
    for settings in (dict(temperature=0), dict(temperature=1.5, top_p=0.9, top_k=200, repetition_penalty=1.2)):
        settings.update(max_tokens=24, num_generations=2, seed=7, logprobs=True)
        stops = ragged_stop_ids(reference, SamplingParams(**settings))
        params = SamplingParams(**settings, stop_token_ids=stops)
        ours, used = decode_batches_used(engine, rows, params)
        theirs, every_row = decode_batches_used(reference, rows, params)
        lengths = ours.completion_mask.sum(1)
        assert len(set(lengths.tolist())) >= 3 and lengths.max() > 8, lengths  # ragged
        assert np.array_equal(ours.completion_ids, theirs.completion_ids)
        np.testing.assert_allclose(ours.logprobs, theirs.logprobs, rtol=0, atol=1e-5)
        assert ours.finish_reasons == theirs.finish_reasons and FINISH_STOP in ours.finish_reasons
        assert set(every_row) == {8} and len(used) == len(every_row) == lengths.max() - 1
        assert used == sorted(used, reverse=True) and used[-1] < 8  # the batch only ever shrinks
        live = [(lengths > step + 1).sum() for step in range(len(used))]  # rows fed at each decode step
        assert used == [min(b for b in (2, 4, 8) if b >= n) for n in live]


class ScriptedTurns:
    """A TurnHandler that answers each row's first ``answered`` turns with ``response`` and ends the next one."""

    def __init__(self, response, answered):
        self.response, self.answered, self.seen = list(response), answered, []

    def respond(self, turns, turn_numbers):
        self.seen += [(list(turn), number) for turn, number in zip(turns, turn_numbers)]
        return [list(self.response) if number <= self.answered else None for number in turn_numbers]


@pytest.mark.parametrize("variant", ["untied", "untied-plain"])
def test_turns_append_exactly_their_tokens_and_the_model_samples_on_after_them(random_models, variant):
    """Multi-turn rollouts (a TurnHandler, as tools use): after a row's turn ends, the handler's tokens follow it
    exactly, marked in tool_mask (an EOS among them ends nothing), and the row samples again; every model token's
    log-prob equals the full forward's over the whole prompt + completion, so the appended tokens reached the KV
    cache as if the row had been prefilled with them. Compaction changes nothing (same tokens as decoding every
    row), and a handler that ends every turn gives the single-turn rollout bit for bit."""
    actor, engine = random_models(variant)
    reference = random_models(variant + "-nocompact")[1]
    settings = dict(max_tokens=32, num_generations=2, seed=11, logprobs=True, temperature=1.0)
    stops = ragged_stop_ids(reference, SamplingParams(**settings))
    params = SamplingParams(**settings, stop_token_ids=stops)
    response = [11, 12, EOS, 13]
    turns = ScriptedTurns(response, answered=2)
    result = engine.generate(PROMPTS, params, turns=turns)
    again = reference.generate(PROMPTS, params, turns=ScriptedTurns(response, answered=2))
    assert np.array_equal(result.completion_ids, again.completion_ids)
    assert np.array_equal(result.tool_mask, again.tool_mask)
    rows = [p for p in PROMPTS for _ in range(2)]
    stop_set = set(stops) | {EOS}
    resumed = 0
    for r, prompt in enumerate(rows):
        n = int(result.completion_mask[r].sum())
        ids, tool = result.completion_ids[r, :n].tolist(), result.tool_mask[r, :n].tolist()
        # walk the row: model turns end at a sampled stop id, each answered turn is followed by the response
        i, turn, starts = 0, 0, [0]
        while i < n:
            if tool[i] == 0 and ids[i] in stop_set:
                turn += 1
                if turn <= 2 and i + 1 < n:
                    assert ids[i + 1:i + 1 + len(response)] == response and tool[i + 1:i + 1 + len(response)] == [1] * 4
                    i += len(response)
                    starts.append(i + 1)
                    resumed += i + 1 < n
            else:
                assert tool[i] == 0, (r, i)
            i += 1
        assert sum(tool) == len(response) * (len(starts) - 1)
        logits = full_forward_logits(actor, [prompt + ids])[0, len(prompt) - 1:len(prompt) - 1 + n]
        log_softmax = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        model = np.array(tool) == 0
        expected = log_softmax[np.arange(n), ids][model]
        np.testing.assert_allclose(result.logprobs[r, :n][model], expected, rtol=0, atol=2e-5)
        assert np.all(result.logprobs[r, :n][~model] == 0)
    assert resumed >= 3  # rows sampled on after a response (not all ended at the limit right after one)
    assert np.array_equal(result.model_mask, result.completion_mask * (1 - result.tool_mask))
    first_turns = {tuple(turn) for turn, number in turns.seen if number == 1}
    for r in range(len(rows)):
        ids = result.completion_ids[r].tolist()
        stop_at = next((i for i, t in enumerate(ids) if t in stop_set), None)
        if stop_at is not None and result.completion_mask[r, stop_at]:
            assert tuple(ids[:stop_at + 1]) in first_turns  # the handler got the sampled turn itself
    single = engine.generate(PROMPTS, params)
    ended = engine.generate(PROMPTS, params, turns=ScriptedTurns(response, answered=0))
    assert single.tool_mask is None and not ended.tool_mask.any()
    assert np.array_equal(single.completion_ids, ended.completion_ids)
    assert np.array_equal(single.logprobs, ended.logprobs) and single.finish_reasons == ended.finish_reasons
    # a response that leaves no room to answer ends the row there, without it
    too_long = engine.generate(PROMPTS, params, turns=ScriptedTurns([13] * 40, answered=9))
    assert not too_long.tool_mask.any() and np.array_equal(too_long.completion_ids, single.completion_ids)
    assert all(reason == FINISH_LENGTH for reason, ids in zip(too_long.finish_reasons, too_long.completion_ids)
               if set(ids.tolist()) & stop_set)


def test_nothing_compiles_after_a_bucket_is_built(random_actor):
    """A bucket compiles its prefill and all its decode batches when it is built, so later rollouts in known
    buckets compile nothing, whatever their lengths (compaction picks among batches compiled up front)."""
    engine = build_rollout_engine("native", random_actor, **ENGINE)
    # every row to the limit
    engine.generate(PROMPTS, SamplingParams(max_tokens=8, min_tokens=8, num_generations=2, seed=0))
    assert (engine.compiled_graphs(), len(engine.buckets_built)) == (1 + 3, 1)  # prefill, decode batches 2, 4, 8
    for seed in range(3):  # rows end at other steps each time
        sampled = SamplingParams(max_tokens=24, temperature=1.5, num_generations=2, seed=seed)
        ragged = dataclasses.replace(sampled, stop_token_ids=ragged_stop_ids(engine, sampled))
        lengths = engine.generate(PROMPTS, ragged).completion_mask.sum(1)
        assert lengths.min() < lengths.max()
    other_prompts = [[1, 2], [3] * 15, [4, 5, 6, 7]]  # other lengths, same prompt-length bucket (16)
    engine.generate(other_prompts, SamplingParams(max_tokens=30, temperature=0.5, top_p=0.9, num_generations=2, seed=1))
    engine.generate(PROMPTS + [[8]], SamplingParams(max_tokens=5, num_generations=2, seed=2))  # 4 prompts x 2 still fit
    assert (engine.compiled_graphs(), len(engine.buckets_built)) == (4, 1)
    # a longer prompt, 2 rows: one new bucket
    engine.generate([[1] * 20], SamplingParams(max_tokens=4, num_generations=2))
    assert (engine.compiled_graphs(), len(engine.buckets_built)) == (4 + 2, 2)


def test_requests_larger_than_a_batch_run_in_chunks(native):
    """9 prompts x num_generations=2 = 18 rows > max_batch_size 8: chunks keep prompt-major order and match single
    calls."""
    prompts = [[i + 1, 2 * i + 3, 50 + i] for i in range(9)]
    params = SamplingParams(max_tokens=5, temperature=0, num_generations=2)
    result = native.generate(prompts, params)
    assert result.completion_ids.shape == (18, 5)
    single = native.generate(prompts[7:8], params)
    assert np.array_equal(result.completion_ids[14:16], single.completion_ids)


def test_a_share_of_a_batch_keyed_by_its_place_samples_what_the_whole_batch_samples(native):
    """Data-parallel ranks each sample their share of a global batch with the seed of the step and their prompts'
    places in it (``prompt_keys``): they must draw the tokens one process sampling the whole batch draws (here 9
    prompts x 2, in chunks of 8 rows, against shares of 3 prompts whose rows fall in other chunks and places)."""
    prompts = [[i + 1, 2 * i + 3, 50 + i] for i in range(9)]
    params = SamplingParams(max_tokens=6, temperature=1.5, num_generations=2, seed=5, logprobs=True)
    whole = native.generate(prompts, params)
    assert len({tuple(row) for row in whole.completion_ids}) > 9
    for first in (0, 3, 6):
        keys = tuple(range(first, first + 3))
        share = native.generate(prompts[first:first + 3], dataclasses.replace(params, prompt_keys=keys))
        rows = slice(2 * first, 2 * first + 6)
        assert np.array_equal(share.completion_ids, whole.completion_ids[rows]), first
        # the same distributions, computed in decode batches of other members: equal up to float32 rounding
        np.testing.assert_allclose(share.logprobs, whole.logprobs[rows], atol=1e-5, rtol=0, err_msg=str(first))
    unkeyed = native.generate(prompts[3:6], params)  # keyed by its own places 0..2: other draws
    assert not np.array_equal(unkeyed.completion_ids, whole.completion_ids[6:12])
    with pytest.raises(ValueError, match="2 prompt_keys for 3 prompts"):
        native.generate(prompts[:3], dataclasses.replace(params, prompt_keys=(0, 1)))
    with pytest.raises(ValueError, match="prompt_keys must be distinct non-negative integers"):
        dataclasses.replace(params, prompt_keys=(1, 1))


def test_row_uniforms_are_uniform_and_independent_of_neighbours():
    """The counter-based draws: uniform on [0, 1) (a Kolmogorov-Smirnov distance far below 1.36 / sqrt(n)'s 5%
    bound), uncorrelated between neighbouring keys and positions, and a row's value is the same alone or in a
    crowd."""
    keys = np.arange(100000)
    u = row_uniforms(3, keys, 0)
    assert ((u >= 0) & (u < 1)).all()
    assert np.abs(np.sort(u) - (np.arange(len(u)) + 0.5) / len(u)).max() < 1.36 / np.sqrt(len(u))
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02
    assert abs(np.corrcoef(u, row_uniforms(3, keys, 1))[0, 1]) < 0.02
    assert abs(np.corrcoef(u, row_uniforms(4, keys, 0))[0, 1]) < 0.02
    assert row_uniforms(3, keys[[777]], 0)[0] == u[777]


# ----------------------------------------------------------------------------------------------- other backends
def test_mindformers_backend_agrees_with_native_and_syncs(random_actor, native):
    """MindFormers' generate with mindgrpo's processor gives the native greedy tokens and log-probs (with a
    repetition penalty and min_tokens); it sees new actor weights only after sync_weights()."""
    engine = build_rollout_engine("mindformers", random_actor, eos_token_id=EOS, pad_token_id=PAD,
                                  max_prompt_length=32, max_batch_size=8)
    params = SamplingParams(max_tokens=8, temperature=0, num_generations=2, repetition_penalty=1.3, min_tokens=3,
                            logprobs=True)
    ours, theirs = native.generate(PROMPTS, params), engine.generate(PROMPTS, params)
    assert np.array_equal(ours.completion_ids, theirs.completion_ids)
    assert np.abs(ours.logprobs - theirs.logprobs).max() < 1e-4

    sampled = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, num_generations=2, seed=4)
    assert np.array_equal(engine.generate(PROMPTS, sampled).completion_ids,
                          engine.generate(PROMPTS, sampled).completion_ids)

    head = random_actor.model.norm_out.weight
    saved = head.asnumpy().copy()
    try:
        head.set_data(Tensor(saved * np.linspace(3.0, 0.2, saved.size).astype(np.float32)))
        stale = engine.generate(PROMPTS, params)
        assert np.array_equal(stale.completion_ids, theirs.completion_ids)  # a separate copy until synced
        engine.sync_weights()
        assert np.array_equal(engine.generate(PROMPTS, params).completion_ids,
                              native.generate(PROMPTS, params).completion_ids)
    finally:
        head.set_data(Tensor(saved))
        engine.sync_weights()


def test_vllm_backend_names_the_missing_package(random_actor):
    try:
        import vllm_mindspore  # noqa: F401
        pytest.skip("vllm-mindspore is installed")
    except Exception:  # not installed, or installed but unusable off Ascend: both must give the clear error
        pass
    with pytest.raises((ImportError, RuntimeError)) as err:
        build_rollout_engine("vllm", random_actor, eos_token_id=EOS, pad_token_id=PAD, max_prompt_length=32,
                             model_dir="unused")
    message = str(err.value)
    assert "vllm-mindspore" in message and "pip install mindgrpo[ascend]" in message and "Ascend" in message


def test_bad_requests_are_clear_errors(native):
    with pytest.raises(ValueError, match="unknown rollout backend 'sglang'"):
        build_rollout_engine("sglang", None, eos_token_id=EOS, pad_token_id=PAD, max_prompt_length=8)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="min_tokens must be in"):
        SamplingParams(max_tokens=4, min_tokens=5)
    with pytest.raises(ValueError, match="prompt 1 has 33 tokens, more than max_prompt_length=32"):
        native.generate([[1], [2] * 33], SamplingParams())
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        native.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 384\)"):
        native.generate([[1, 384]], SamplingParams())
    with pytest.raises(ValueError, match=r"stop_token_ids \[500\] are outside the vocabulary"):
        native.generate([[1]], SamplingParams(stop_token_ids=[500]))
    with pytest.raises(ValueError, match="min_decode_batch must be a power of two >= 2, got 1"):
        build_rollout_engine("native", None, **{**ENGINE, "min_decode_batch": 1})
    with pytest.raises(TypeError, match="not a mindgrpo Qwen2Model"):
        build_rollout_engine("native", ms.nn.Dense(2, 2), eos_token_id=EOS, pad_token_id=PAD, max_prompt_length=8)


# ----------------------------------------------------------------------------------------------- host sampler
def test_processing_matches_transformers_warpers():
    """Penalty -> temperature -> top-k -> top-p equal transformers' processors applied in the same order."""
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((6, 50)) * 3).astype(np.float32)
    history = rng.integers(0, 50, size=(6, 7))
    seen = np.zeros((6, 50), bool)
    np.put_along_axis(seen, history, True, axis=1)
    for kw in (dict(temperature=0.7), dict(top_k=5), dict(top_p=0.8), dict(top_k=10, top_p=0.5, temperature=1.5),
               dict(repetition_penalty=1.4, top_p=0.95)):
        params = SamplingParams(**kw)
        ours = process_logits(logits, params, 0, [49], seen)
        ids, scores = torch.tensor(history), torch.tensor(logits)
        if params.repetition_penalty != 1.0:
            scores = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(ids, scores)
        scores = TemperatureLogitsWarper(params.temperature)(ids, scores)
        if params.top_k > 0:
            scores = TopKLogitsWarper(params.top_k)(ids, scores)
        if params.top_p < 1:
            scores = TopPLogitsWarper(params.top_p)(ids, scores)
        theirs = torch.log_softmax(scores, -1).numpy()
        assert np.array_equal(np.isinf(ours), np.isinf(theirs)), kw
        assert np.abs(ours[np.isfinite(ours)] - theirs[np.isfinite(theirs)]).max() < 1e-5, kw


def test_two_level_draw_is_the_inverse_cdf_over_a_whole_vocabulary():
    """The block-then-token walk picks what a flat cumulative sum over the vocabulary picks for the same uniform
    (up to float rounding at a boundary), never a filtered token, with the right frequencies across blocks."""
    rng = np.random.default_rng(0)
    vocab, rows = 1000, 4000  # not a multiple of the block: the last block is padded
    probs = rng.random((rows, vocab)) ** 8  # peaked, mass spread over many blocks
    probs[:, rng.random(vocab) < 0.3] = 0  # filtered tokens, whole runs of them
    probs = (probs / probs.sum(-1, keepdims=True)).astype(np.float32)
    sampler = TokenSampler(SamplingParams(), [0], vocab, 7, np.arange(rows), [[0]] * rows)
    tokens = sampler._draw(probs, np.arange(rows), 0)
    u = 1.0 - row_uniforms(7, np.arange(rows), 0)  # the same uniforms
    cdf = np.cumsum(probs.astype(np.float64), -1)
    flat = (cdf < (u * cdf[:, -1])[:, None]).sum(-1)
    assert (probs[np.arange(rows), tokens] > 0).all()
    assert (tokens != flat).mean() < 0.002
    one = np.repeat(probs[:1], 50000, axis=0)
    many = TokenSampler(SamplingParams(), [0], vocab, 1, np.arange(50000), [[0]] * 50000)
    freq = np.bincount(many._draw(one, np.arange(50000), 0), minlength=vocab) / 50000
    assert np.abs(freq - probs[0]).max() < 4 * np.sqrt(probs[0].max() / 50000)


def test_sampler_gives_a_row_the_same_draw_whichever_rows_come_along():
    """The native engine samples only the rows still generating: a row's token and log-prob must not depend on
    which other rows are sampled with it, down to a single row (one uniform per row of the rollout every step,
    row-wise processing whatever the logits' layout), here with top-k, top-p and the repetition penalty."""
    rng = np.random.default_rng(0)
    vocab, prompts = 300, [[1, 2], [3], [4, 5, 6], [7], [8, 9], [10]]
    params = SamplingParams(temperature=0.9, top_k=100, top_p=0.8, repetition_penalty=1.3)
    everyone, live_only = (TokenSampler(params, [0], vocab, 3, np.arange(6), prompts) for _ in range(2))
    for step, live in enumerate(([0, 1, 2, 3, 4, 5], [1, 2, 4], [2, 4], [4])):
        logits_t = (rng.standard_normal((vocab, 6)) * 3).astype(np.float32)  # as the decode graph returns them
        tokens, logprobs = everyone.sample(logits_t.T, step)
        ours, our_logprobs = live_only.sample(np.ascontiguousarray(logits_t[:, live]).T, step, np.array(live))
        assert np.array_equal(ours, tokens[live]) and np.array_equal(our_logprobs, logprobs[live])


def test_sampler_draws_from_the_processed_distribution():
    """Empirical frequencies of 20,000 draws match the probabilities (and never pick a filtered token)."""
    logits = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]], np.float32))
    params = SamplingParams(top_p=0.8)  # keeps the first three tokens: 0.5 + 0.2 < 0.8 <= 0.85
    sampler = TokenSampler(params, [4], 5, 0, np.arange(20000), [[0]] * 20000)
    tokens, logprobs = sampler.sample(np.repeat(logits, 20000, axis=0), 0)
    freq = np.bincount(tokens, minlength=5) / 20000
    expected = np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85
    assert np.abs(freq - expected).max() < 0.015
    assert np.allclose(np.exp(logprobs), expected[tokens], atol=1e-6)
    eos_blocked = process_logits(logits, SamplingParams(min_tokens=2), 1, [0])
    assert np.isneginf(eos_blocked[0, 0]) and np.isclose(np.exp(eos_blocked[0, 1:]).sum(), 1, atol=1e-6)
