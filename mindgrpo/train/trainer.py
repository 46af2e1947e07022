"""GRPOTrainer: rollout, score, advantages, reference and old log-probs, clipped update, weight sync.

What a default run computes (defaults in :mod:`mindgrpo.config.schema`), per step and data-parallel rank:

* **Rollout, on-policy.** ``batch_size`` = 4 prompts, ``num_generations`` = 8 completions each, sampled from the
  current actor; every completion is trained on in this same step, once (``num_iterations`` = 1).
* **Reward and advantages.** r = accuracy_reward + format_reward (``reward_config``), then the advantage of
  completion i of a prompt's num_generations is A_i = (r_i - mean(r)) / (std(r) + 1e-4) over those completions
  (``scale_rewards`` = group, unbiased std), the same for each of its tokens.
* **Ratio.** rho_t = exp(logp_t - old_t). On-policy, old is logp itself, detached: rho = 1 in value, but its
  gradient is that of logp, so the clipped term's gradient is the plain policy gradient -A * grad(logp) and the
  clip (``epsilon_low`` = ``epsilon_high`` = 0.2) never binds. With ``num_iterations`` > 1 old is the sampling
  policy's log-prob, computed once before the passes, and the clip does its PPO work.
* **KL.** k3 = exp(ref_t - logp_t) - (ref_t - logp_t) - 1 against the frozen reference (the actor's starting
  weights), weighted by ``beta`` = 0.04; ``beta`` = 0 drops the reference model altogether.
* **Loss** (``loss_type`` = grpo, DeepSeekMath's): per token l_t = -min(rho_t A, clip(rho_t, 0.8, 1.2) A) + 0.04 k3_t,
  averaged over each completion's tokens, then over the completions; ``dapo`` would average over all the step's
  tokens instead. The gradients of the micro-batches (``micro_batch_size`` = 8 completions, each loss divided by
  their number) add up to the step's; they are averaged over data-parallel ranks and clipped to a global norm of
  1.0, then one AdamW step at lr 1e-6.
* **Weight sync.** The rollout engine sees the new weights before the next step.

The per-token loss runs as one fused kernel (``loss_impl`` = fused); its readable twin in plain MindSpore ops,
held to the same outputs by the tests, is :func:`mindgrpo.algorithm.loss.plain_token_loss` (reductions in
``mindgrpo.algorithm.loss._reduce``).

Options that change what a generation is (:mod:`mindgrpo.train.generation`): ``dynamic_sampling`` (DAPO) keeps
generating from new prompts until ``batch_size`` groups with unequal rewards are kept; ``steps_per_generation``
(TRL) samples several steps' prompts at once, and the old policy's log-probs are then taken once, at generation.

``GRPOTrainer(config).train()`` runs the whole job; :meth:`GRPOTrainer.train_step` is one step, read top to bottom:
rollout and score (a new generation when the last one is used up), reference log-probs, update, weight sync.
Everything that touches MindSpore graphs lives in :class:`mindgrpo.train.model_worker.ModelWorker`; this module is
the orchestration and the bookkeeping (metrics, checkpoints, resume).
"""
from __future__ import annotations

import gc
import os
import random
import shutil
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from mindgrpo.algorithm.advantages import generation_advantages, zero_std_groups
from mindgrpo.config import Derived, GRPOConfig, dump_yaml
from mindgrpo.data import PromptBatch
from mindgrpo.parallel.groups import DP, DistInfo, all_gather, all_reduce_sum, barrier, init_distributed
from mindgrpo.rewards.overlong import OverlongPenalty
from mindgrpo.rewards.scorer import VerifierError
from mindgrpo.train import checkpoint as ckpt
from mindgrpo.train import peers
from mindgrpo.train.generation import Generation, Round, kept_groups
from mindgrpo.train.metrics import MetricsLogger, peak_rss_gib, throughput_tps
from mindgrpo.train.preflight import preflight
from mindgrpo.train.rollout_batch import RolloutBatch
from mindgrpo.train.run_lock import lock_output_dir
from mindgrpo.tools import ToolRunner, ToolTurns


SHARD_STAGING = ".shards-step_"  # per-rank optimizer files wait here until rank 0 commits the checkpoint


class TrainingError(RuntimeError):
    """The run cannot continue (e.g. repeated non-finite updates)."""


class PeerLostError(TrainingError):
    """Another rank of a multi-rank run died; this one cannot continue (its collectives are broken)."""


class GRPOTrainer:
    """Trains a Qwen2.5 policy with GRPO from a :class:`~mindgrpo.config.GRPOConfig`."""

    def __init__(self, config: GRPOConfig, *, check_paths: bool = True):
        # Every check first: a bad config, data, verifier, device or launch stops here, before MindSpore is set up,
        # a model is built or the output folder is touched (mindgrpo/train/preflight.py).
        inputs = preflight(config, check_paths=check_paths)
        import mindspore as ms

        from mindgrpo.train.model_worker import ModelWorker

        self.config = config
        rl = config.rl_config
        ms.set_context(mode=ms.GRAPH_MODE if rl.mode == "graph" else ms.PYNATIVE_MODE)
        if rl.device_target != "auto":
            ms.set_device(rl.device_target)  # before the process group: MindSpore refuses it after init()
        self.dist: DistInfo = init_distributed(model_parallel=config.actor_config.parallel_config.model_parallel)
        if self.dist.world_size > 1:  # so a rank whose peer dies can name it (mindgrpo/train/peers.py)
            peers.register(rl.output_dir, self.dist.rank)
        ms.set_seed(rl.seed)
        random.seed(rl.seed)
        np.random.seed(rl.seed)

        if self.dist.is_main:  # a second run on the same output folder stops here (mindgrpo/train/run_lock.py)
            lock_output_dir(rl.output_dir)
        self.tokenizer, self.dataset, self.scorer = inputs.tokenizer, inputs.dataset, inputs.scorer
        # Multi-turn rollouts: the tools answer the turns that call them (mindgrpo.tools); None: one turn.
        self.tool_turns: Optional[ToolTurns] = None
        if inputs.tools:
            self.tool_turns = ToolTurns(self.tokenizer, ToolRunner(inputs.tools, rl.tool_parallel, rl.tool_timeout),
                                        rl.max_tool_turns, rl.max_tool_response_tokens, self.dist)
        # Rollouts stop where eval and chat stop: the tokenizer's eos and generation_config's (an Instruct model's
        # turns end with <|im_end|> even when its tokenizer names <|endoftext|> as eos)
        self.worker = ModelWorker(config, self.dist, eos_token_id=self.tokenizer.stop_token_ids,
                                  pad_token_id=self.tokenizer.pad_token_id)
        self.overlong = OverlongPenalty(config.generate_config.sampling_config.max_tokens,
                                        rl.overlong_buffer_length, rl.overlong_penalty_factor)

        # Ranks of one tensor-parallel group share prompts: the data is split over data-parallel ranks only.
        self.total_steps = Derived(config).total_steps(self.dataset.steps_per_epoch(rl.batch_size, self.dist.dp_size))
        self.output_dir = Path(rl.output_dir)
        self.checkpoints = ckpt.CheckpointManager(config.checkpoint_dir, keep_last=rl.save_max_ckpt_num)
        if self.dist.is_main:  # optimizer shards staged by a run that died before committing its checkpoint
            for stale in self.checkpoints.save_dir.glob(f"{SHARD_STAGING}*"):
                shutil.rmtree(stale, ignore_errors=True)
        self.step = 0
        self.skipped_in_a_row = 0
        self.last_rollouts: Optional[RolloutBatch] = None  # the latest step's batch (for inspection and benchmarks)
        # The current generation (what the rollout stage returned, frozen) and what is computed from it, until its
        # steps are used up: its advantages, the sampling policy's log-probs of each step (when later passes or
        # steps need them; empty on-policy) and how many of its steps have been trained on.
        self._generation: Optional[Generation] = None
        self._advantages = np.zeros(0, np.float32)
        self._old_logp: Tuple[np.ndarray, ...] = ()
        self._taken = 0
        if rl.resume_training:
            self._resume()
        if self.dist.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            dump_yaml(config, self.output_dir / "config.yaml")
        self.metrics = MetricsLogger(self.output_dir, rank=self.dist.rank, total_steps=self.total_steps)
        if rl.resume_training:  # also from step 0: drop the steps a run killed before its first checkpoint logged
            self.metrics.truncate_after(self.step)
        self._batches: Iterator[PromptBatch] = self.dataset.batches(
            rl.batch_size, seed=rl.seed, rank=self.dist.dp_rank, world_size=self.dist.dp_size)

    # ------------------------------------------------------------------------------------------------------------
    def precompile(self) -> None:
        """Compile, before training, the graphs of every prompt width the remaining steps will meet, so no step
        after it compiles: the rollout engine's prefill/decode and the reference (and old) log-probs and the update
        per width. The batch order is fixed by the seed, so the widths are known in advance, and widths no batch
        reaches are not compiled (each keeps memory for the life of the process). Optional: without it each width
        compiles the first time a batch needs it. Largest first, so the memory pool grows once and smaller graphs
        reuse it."""
        rl = self.config.rl_config
        completions = Derived(self.config).completions_per_rank
        max_tokens = self.config.generate_config.sampling_config.max_tokens
        # Dynamic sampling may read up to max_generation_batches batches a step: plan for all of them. A generation
        # of several batches (steps_per_generation) is padded to the widest of them, one of the planned widths.
        rounds = rl.max_generation_batches if rl.dynamic_sampling else 1
        longest = self.dataset.planned_longest_prompts(rl.batch_size, (self.total_steps - self.step) * rounds,
                                                       seed=rl.seed, rank=self.dist.dp_rank,
                                                       world_size=self.dist.dp_size)
        widths = sorted({Derived(self.config).prompt_width(int(length)) for length in longest}, reverse=True)
        if self.dataset.has_images:  # the vision tower's patch buckets of every image the run may meet
            self.worker.precompile_vision(self.dataset.image_patch_counts())
        for width in widths:
            prompts, images = self.worker.dummy_prompts(rl.batch_size * rl.steps_per_generation, width,
                                                        self.dataset.has_images)
            self.worker.generate(list(prompts), seed=0, images=images)
        for width in widths:
            prompts, images = self.worker.dummy_prompts(rl.batch_size, width, self.dataset.has_images)
            self.worker.precompile(RolloutBatch(prompts, np.ones_like(prompts),
                                                np.zeros((completions, max_tokens), np.int32),
                                                np.ones((completions, max_tokens), np.int32),
                                                vision=self.worker.vision_batch(prompts, np.ones_like(prompts),
                                                                                images)))

    def train(self) -> Dict[str, float]:
        """Run until ``total_steps``; returns the last step's metrics."""
        rl, dist = self.config.rl_config, self.dist
        last: Dict[str, float] = {}
        peer_watch = peers.sigterm_raises(rl.output_dir, dist.rank, dist.world_size) if dist.world_size > 1 \
            else nullcontext()
        # MindSpore runs a full gc.collect() before compiling each graph, over every object of the process (some
        # 10^5 to 10^6: MindSpore's own, the models'): about 0.15 s each. What exists now outlives the run, so it is
        # kept out of the collector's sight until the run ends (reference counting still frees it).
        gc.collect()
        gc.freeze()
        try:
            with peer_watch:
                while self.step < self.total_steps:
                    last = self.train_step()
                    if rl.save_ckpt_interval and self.step % rl.save_ckpt_interval == 0:
                        self.save_checkpoint()
                if not self.checkpoints.step_dir(self.step).exists():
                    self.save_checkpoint()
        except VerifierError:
            raise  # this rank's own verdict on its verifiers: the peers' state would only hide it
        except (Exception, peers.Terminated) as err:
            # A failed collective (or msrun's SIGTERM) says nothing of its cause when a peer died: name the peer.
            lost = peers.lost_peers(rl.output_dir, dist.rank, dist.world_size) if dist.world_size > 1 else []
            if not lost:
                raise
            raise PeerLostError(peers.describe_lost(lost, dist.rank)) from err
        finally:
            gc.unfreeze()
            self.metrics.close()
            self.scorer.close()  # the verifier workers, if any (a later train_step starts them again)
            if self.tool_turns is not None:
                self.tool_turns.runner.close()  # the tool workers, likewise
        return last

    def train_step(self) -> Dict[str, float]:
        """One GRPO step on this rank's batch of prompts."""
        rl = self.config.rl_config
        timings: Dict[str, float] = {}
        step_start = time.perf_counter()

        # 1-3. Rollout, scores and group-relative advantages: a new generation every steps_per_generation steps,
        # with dynamic sampling's extra rounds (for Qwen2.5-VL the vision tower runs there, once per prompt of a
        # round). The old policy's log-probs are taken from it, once, when later passes or steps need them.
        if self._generation is None or self._taken == self._generation.steps:
            self._generation = self._rollout_and_score(timings)
            self._advantages = generation_advantages(
                self._generation.rewards, rl.num_generations, rl.scale_rewards,
                None if self.dist.dp_size == 1 else lambda values: all_reduce_sum(values, self.dist))
            self._old_logp = self._old_logprobs(self._generation, timings)
            self._taken = 0
        generation, index = self._generation, self._taken
        self._taken += 1
        rows = generation.step_slice(index)
        rollouts = self.last_rollouts = generation.step(index)
        advantages = self._advantages[rows]

        # 4. Reference log-probs for the KL penalty (skipped when beta = 0).
        with _timed(timings, "timing/reference_model"):
            ref_logp = self.worker.reference_logprobs(rollouts) if rl.beta > 0 else None

        # 5. num_iterations optimizer steps over the rollouts, micro-batched with gradient accumulation.
        old_logp = self._old_logp[index] if self._old_logp else None
        with _timed(timings, "timing/update"):
            update = self.worker.update(rollouts, advantages, old_logp, ref_logp, total_steps=self.total_steps)
        self._check_rollout_gap(update, first_step_of_generation=index == 0)
        if update["skipped"]:
            self.skipped_in_a_row += 1
            if self.skipped_in_a_row > rl.max_skipped_updates:
                raise TrainingError(
                    f"step {self.step + 1}: {self.skipped_in_a_row} steps in a row had a non-finite loss or gradient; "
                    "the weights are those of the last good update. Lower actor_config.lr_schedule.learning_rate, "
                    "keep actor_config.optimizer.max_grad_norm > 0, or check the data and rewards")
        else:
            self.skipped_in_a_row = 0

        # 6. Make the rollout engine see the new weights.
        with _timed(timings, "timing/weight_sync"):
            self.worker.sync_weights()

        for key in ("timing/rollout", "timing/old_log_p"):
            timings.setdefault(key, 0.0)  # the steps that reuse a generation spend nothing on it
        timings["timing/all"] = time.perf_counter() - step_start
        self.step += 1
        metrics = self._step_metrics(rollouts, generation, index, advantages, update, timings)
        self.metrics.log(self.step, metrics)
        if rl.save_prompt_completions_data and self.step % max(1, rl.save_prompt_completions_interval) == 0:
            self._log_completions(generation, rows)
        return metrics

    def _check_rollout_gap(self, update: Dict[str, float], *, first_step_of_generation: bool) -> None:
        """Stop when the rollout sampled from other weights than the ones trained: a weight (or LoRA adapter) sync
        to the rollout engine that did not take effect leaves the loss looking normal while the run samples a stale
        policy. Only a generation's first step is measured against the sampling weights (later ones train on
        after an update, where a gap is the point)."""
        limit = Derived(self.config).max_rollout_logprob_gap
        gap = update.get("rollout/logprob_diff_max")
        if limit <= 0 or gap is None or not first_step_of_generation or gap <= limit:
            return
        what = "the LoRA adapters" if self.config.actor_config.lora_rank else "the weights"
        raise TrainingError(
            f"step {self.step + 1}: the rollout engine's log-probs of its own samples differ from the training "
            f"forward's by up to {gap:.3g} (rl_config.max_rollout_logprob_gap = {limit:g}): the "
            f"{self.config.generate_config.backend} engine sampled with other weights than the actor's, so the sync "
            f"of {what} to the rollout engine did not take effect. Fix the sync; set "
            "rl_config.max_rollout_logprob_gap: 0 only where such a gap is expected")

    # ------------------------------------------------------------------------------------------------------------
    def _rollout_and_score(self, timings: Dict[str, float]) -> Generation:
        """Generate, score and keep groups until the generation is full (mindgrpo.train.generation): one round
        without dynamic sampling; with it, rounds until ``batch_size x steps_per_generation`` groups with unequal
        rewards are kept on every data-parallel rank, or ``max_generation_batches`` rounds ran. Every rank runs as
        many rounds (an AllReduce of what is still missing) and reads the same number of prompt batches, so the
        dataset position, saved by rank 0 for all, stays exact; a rank already full reads its batch and skips it."""
        rl = self.config.rl_config
        wanted = rl.batch_size * rl.steps_per_generation
        rounds: List[Round] = []
        kept: List[np.ndarray] = []
        longest, total_rounds = 0, 0
        for round_index in range(rl.max_generation_batches if rl.dynamic_sampling else 1):
            batches = [next(self._batches) for _ in range(rl.steps_per_generation)]
            total_rounds += 1
            missing = wanted - sum(int(k.sum()) for k in kept)
            if missing > 0:
                rounds.append(self._generate_round(batches, round_index, timings))
                longest = max(longest, max(int(b.lengths.max()) for b in batches))
                kept.append(kept_groups(rounds[-1].zero_std, rl.num_generations) if rl.dynamic_sampling
                            else np.ones(wanted, bool))
                missing -= int(kept[-1].sum())
            if not rl.dynamic_sampling or all_reduce_sum(np.array([max(missing, 0)]), self.dist)[0] == 0:
                break
        return Generation.assemble(
            rounds, kept, wanted=wanted, steps=rl.steps_per_generation,
            width=Derived(self.config).prompt_width(longest), num_generations=rl.num_generations,
            pad_token_id=self.tokenizer.pad_token_id, mask_truncated=rl.mask_truncated_completions,
            total_rounds=total_rounds, vision=self.worker.actor.vision)

    def _old_logprobs(self, generation: Generation, timings: Dict[str, float]) -> Tuple[np.ndarray, ...]:
        """The sampling policy's log-probs of each step of ``generation``, taken once, before any update: the ratio
        of every later pass and step. Empty on-policy (one pass, one step: the loss detaches the current ones)."""
        if Derived(self.config).on_policy:
            return ()
        with _timed(timings, "timing/old_log_p"):
            return tuple(self.worker.actor_logprobs(generation.step(k)) for k in range(generation.steps))

    def _generate_round(self, batches: List[PromptBatch], round_index: int, timings: Dict[str, float]) -> Round:
        """One round: ``num_generations`` completions per prompt of ``batches`` from the current policy, decoded
        and scored (a verifier that fails on all of them raises), with DAPO's overlong penalty added (0 if off)."""
        rl = self.config.rl_config
        prompts = [ids for batch in batches for ids in batch.prompt_ids]
        with _timed(timings, "timing/vision"):  # Qwen2.5-VL: each prompt's images, once; None for text
            images = self.worker.embed_images(_joined([batch.images for batch in batches]))
        with _timed(timings, "timing/rollout"):
            generated = self.worker.generate(prompts, seed=self._sampling_seed(round_index), images=images,
                                             prompt_keys=self._prompt_keys(batches), turns=self.tool_turns)
        tool_stats = {} if self.tool_turns is None else self.tool_turns.take_stats()
        # What the verifiers read: the model's own tokens (with tools, its turns without the tools' responses, so
        # a number a tool printed cannot score for a completion that never states it).
        mask = generated.model_mask.astype(bool)
        completions = self.tokenizer.batch_decode([ids[row] for ids, row in zip(generated.completion_ids, mask)])
        golds = [gold for batch in batches for gold in batch.golds]
        questions = [question for batch in batches for question in batch.questions]
        rewards = self.scorer.score(completions, _each(golds, rl.num_generations),
                                    question=_each(questions, rl.num_generations))
        overlong = self.overlong.add_to(rewards, generated.completion_mask.sum(1))
        return Round(prompts, golds, generated, completions, rewards, overlong,
                     zero_std=zero_std_groups(rewards.aggregated, rl.num_generations), images=images,
                     tool_stats=tool_stats)

    def _sampling_seed(self, round_index: int = 0) -> int:
        """Derived from (seed, step, generation round) alone, so a resumed run samples exactly what the original
        would, and every rank draws from the same seed: a prompt's completions then depend on its place in the
        global batch (:meth:`_prompt_keys`), not on the rank or the layout."""
        rl = self.config.rl_config
        key = [rl.seed, self.step] if round_index == 0 else [rl.seed, self.step, round_index]
        return int(np.random.SeedSequence(key).generate_state(1)[0] & 0x7FFFFFFF)

    def _prompt_keys(self, batches: List[PromptBatch]) -> List[int]:
        """Each prompt's place in the round's global batches: prompt p of this rank's batch j is global prompt
        j * (batch_size x dp_size) + dp_rank * batch_size + p, as the dataset deals them out
        (``PromptDataset._schedule``), which is its place in one process reading all of them."""
        size, dist = self.config.rl_config.batch_size, self.dist
        return [j * size * dist.dp_size + dist.dp_rank * size + p
                for j, batch in enumerate(batches) for p in range(len(batch.prompt_ids))]

    def _step_metrics(self, rollouts: RolloutBatch, generation: Generation, index: int, advantages: np.ndarray,
                      update: Dict[str, float], timings: Dict[str, float]) -> Dict[str, float]:
        rl = self.config.rl_config
        # The reward figures describe the first round's share of this step (a plain sample of the policy, the same
        # with or without dynamic sampling, whose kept groups are biased by the filter); lengths and the rest the
        # trained batch. Verifier failures count every round of the generation, on its first step.
        first, rows = generation.first_round, generation.step_slice(index)
        rewards, overlong = first.rewards, first.overlong[rows]
        # Rewards and lengths are reduced over ranks so every rank logs (and rank 0 writes) global figures.
        resp = rollouts.completion_mask.sum(1).astype(np.float64)
        prompt = rollouts.prompt_lengths.astype(np.float64)
        local = {"reward": rewards.total[rows].astype(np.float64), "resp": resp, "prompt": prompt}
        sums = all_reduce_sum(np.array([local[k].sum() for k in local] + [len(resp)]), self.dist)
        count = sums[-1]
        # each rank's minima and negated maxima, gathered: the lowest over ranks of both gives min and max
        mins_maxs = np.concatenate([[v.min(), -v.max()] for v in local.values()])
        lowest = all_gather(mins_maxs, self.dist, over=DP).min(0)
        lo, neg_hi = lowest[0::2], lowest[1::2]
        metrics: Dict[str, float] = {
            "grpo/rewards/mean": sums[0] / count, "grpo/rewards/min": lo[0], "grpo/rewards/max": -neg_hi[0],
            "response_length/mean": sums[1] / count, "response_length/min": lo[1], "response_length/max": -neg_hi[1],
            "prompt_length/mean": sums[2] / count, "prompt_length/min": lo[2], "prompt_length/max": -neg_hi[2],
        }
        counted = float(index == 0)
        zero_std = first.zero_std[rows.start // rl.num_generations:rows.stop // rl.num_generations].sum()
        verifier_sums = all_reduce_sum(np.array([v[rows].sum() for v in rewards.per_verifier.values()] +
                                                [counted * f for f in generation.failures.values()] +
                                                [counted * t for t in generation.timeouts.values()] +
                                                [float(zero_std), float(generation.unfilled_groups) * counted,
                                                 rollouts.truncated.sum(), overlong.sum()]), self.dist)
        k = len(rewards.per_verifier)
        for i, name in enumerate(rewards.per_verifier):
            metrics[f"grpo/rewards/{short_name(name)}"] = verifier_sums[i] / count
        for i, name in enumerate(rewards.failures):
            metrics[f"grpo/verifier_failures/{short_name(name)}"] = verifier_sums[k + i]
            metrics[f"grpo/verifier_timeouts/{short_name(name)}"] = verifier_sums[2 * k + i]
        zero_std, unfilled, truncated, penalty = verifier_sums[3 * k:]
        metrics["grpo/zero_std_groups"] = zero_std
        # Dynamic sampling: the rounds of generation (the same on every rank) and the slots left to filler groups.
        metrics["grpo/generation_batches"] = generation.rounds
        metrics["grpo/unfilled_groups"] = unfilled
        # DAPO's two length controls: how many completions ran into max_tokens, and the mean overlong penalty.
        metrics["grpo/truncated_frac"] = truncated / count
        metrics["grpo/overlong_penalty/mean"] = penalty / count
        metrics["grpo/advantages/abs_mean"] = float(np.abs(advantages).mean())
        if rollouts.tool_mask is not None:
            metrics.update(self._tool_metrics(rollouts, generation, counted, count))
        metrics.update(update)
        metrics.update(timings)
        per_sample_prompt, per_sample_resp = sums[2] / count, sums[1] / count
        prompts, world = rl.batch_size * self.dist.dp_size, self.dist.world_size
        for name, key in (("e2e_tps", "timing/all"), ("update_tps", "timing/update"),
                          ("rollout_tps", "timing/rollout")):
            if timings[key] == 0:  # a step that reuses its generation's rollouts has no rollout throughput
                continue
            metrics[name] = throughput_tps(per_sample_prompt, per_sample_resp, prompts, rl.num_generations, world,
                                           timings[key])
        metrics["epoch"] = float(self.dataset.state_dict()["epoch"])
        metrics["memory/peak_rss_gib"] = peak_rss_gib()
        return {k: float(v) for k, v in metrics.items()}

    def _tool_metrics(self, rollouts: RolloutBatch, generation: Generation, counted: float,
                      completions: float) -> Dict[str, float]:
        """Tool use, global over ranks: calls, failed calls (timeouts included), timeouts, results cut, turns past
        max_tool_turns (counted on a generation's first step, over all its rounds, as verifier failures are),
        model turns and tool tokens per completion of this step, and the seconds tools took."""
        tool = rollouts.tool_mask.astype(bool)
        responses = (tool[:, 1:] & ~tool[:, :-1]).sum() + tool[:, 0].sum()  # each tool response starts a run of 1s
        stats = generation.tool_stats
        keys = ("calls", "errors", "timeouts", "truncated", "over_turn_limit", "seconds")
        sums = all_reduce_sum(np.array([counted * stats[k] for k in keys] + [float(responses), float(tool.sum())]),
                              self.dist)
        calls, errors, timeouts, truncated, over_limit, seconds, responses, tool_tokens = sums
        generated = counted * completions * generation.steps * generation.rounds  # all the generation's completions
        return {"tools/calls_per_completion": calls / max(generated, 1.0), "tools/errors": errors,
                "tools/timeouts": timeouts, "tools/truncated": truncated, "tools/over_turn_limit": over_limit,
                "tools/turns_per_completion": 1.0 + responses / completions,
                "tools/response_tokens_per_completion": tool_tokens / completions,
                "timing/tools": seconds / self.dist.world_size}
    def _log_completions(self, generation: Generation, rows: slice) -> None:
        num_generations = self.config.rl_config.num_generations
        rollouts = generation.rollouts
        records = []
        for i in range(rows.start, rows.stop):
            record = {
                "prompt": self.tokenizer.decode(generation.prompts[i // num_generations], skip_special_tokens=False),
                "completion": generation.completions[i], "gold": generation.golds[i],
                "reward": float(generation.totals[i]),
                "rewards": {name: float(v[i]) for name, v in generation.per_verifier.items()},
            }
            if rollouts.tool_mask is not None:  # the whole exchange: each turn and tool response as the model read it
                ids = rollouts.completion_ids[i][rollouts.completion_mask[i] > 0]
                record["transcript"] = self.tokenizer.decode(ids, skip_special_tokens=False)
            records.append(record)
        self.metrics.log_completions(self.step, records)

    # ------------------------------------------------------------------------------------------------------------
    def save_checkpoint(self) -> Optional[Path]:
        """Actor weights (one HF folder, gathered from the tensor-parallel slices), each rank's optimizer shard and
        the trainer state, committed atomically by rank 0. Every rank must call it.

        Every rank writes its optimizer shard to a staging folder first; rank 0 moves those files into the
        checkpoint it is building, so the manifest's checksums cover them and the whole step still appears by one
        rename. (Several machines must share the checkpoint folder.)

        Only between generations: the rollouts of a generation that later steps would still train on
        (``steps_per_generation`` > 1) are not saved, so a checkpoint in its middle could not resume exactly."""
        if self._generation is not None and self._taken < self._generation.steps:
            raise TrainingError(f"step {self.step}: a checkpoint can only be saved between generations (every "
                                f"rl_config.steps_per_generation = {self.config.rl_config.steps_per_generation} "
                                f"steps); {self._generation.steps - self._taken} more step(s) train on "
                                "the current one")
        staging = self.checkpoints.save_dir / f"{SHARD_STAGING}{self.step:08d}"
        staging.mkdir(parents=True, exist_ok=True)
        self.worker.save_optimizer_shard(staging)
        barrier(self.dist)
        saved = None
        if self.dist.is_main:
            state = {"step": self.step, "data": self.dataset.state_dict(), "rng": ckpt.rng_state(),
                     "skipped_in_a_row": self.skipped_in_a_row, "seed": self.config.rl_config.seed}

            def optimizer(folder: Path) -> None:
                for shard in sorted(staging.iterdir()):
                    os.replace(shard, folder / shard.name)

            saved = self.checkpoints.save(self.step, {
                "model": self.worker.export,  # first: its gathers pair with serve_export on the peers
                "optimizer": optimizer,
                "trainer": lambda d: ckpt.save_json(d / "trainer_state.json", state),
            })
            shutil.rmtree(staging, ignore_errors=True)
        elif self.dist.dp_rank == 0 and self.dist.tp_size > 1:
            self.worker.serve_export()
        barrier(self.dist)
        return saved

    def _resume(self) -> None:
        path = self.checkpoints.latest()
        if path is None:
            if self.dist.is_main:
                print(f"[mindgrpo] --resume_training: no complete checkpoint in {self.checkpoints.save_dir}; "
                      "starting from step 0", flush=True)
            return
        state = ckpt.load_json(path / "trainer" / "trainer_state.json")
        # Each rank reads its own slices of the full HF weights and its moments, resharded if the checkpoint was
        # written under another layout.
        self.worker.load_weights(path / "model")
        self.worker.load_optimizer(path / "optimizer")
        self.dataset.load_state_dict(state["data"])
        ckpt.set_rng_state(state["rng"])
        self.step, self.skipped_in_a_row = int(state["step"]), int(state["skipped_in_a_row"])
        if self.dist.is_main:
            print(f"[mindgrpo] resumed from {path} at step {self.step}", flush=True)


def _each(values: List[str], times: int) -> List[str]:
    """Each value ``times`` times in a row: a prompt's entry for each of its completions."""
    return [value for value in values for _ in range(times)]


def _joined(per_batch: List[Optional[list]]) -> Optional[list]:
    """The prompts' images of several batches, in order; None when they are text (all batches alike)."""
    return None if any(images is None for images in per_batch) else [entry for images in per_batch for entry in images]


def short_name(verifier: str) -> str:
    """Metric-friendly verifier name: ``pkg.mod:func`` -> ``func`` (TensorBoard tags do not keep ':')."""
    return verifier.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


@contextmanager
def _timed(timings: Dict[str, float], key: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - start
