"""``ModelWorker``: the MindSpore side of a GRPO step on one rank (verl calls it ``ActorRolloutRefWorker``).

It holds the actor, the reference model, the rollout engine and the optimizer, and runs the compiled graphs of
:mod:`mindgrpo.train.step_graphs` on them. The trainer hands it numpy batches (:class:`RolloutBatch`) and gets
numpy results and float metrics back, so the orchestration in :mod:`mindgrpo.train.trainer` reads as plain Python:

* ``generate``: ``num_generations`` completions per prompt from the rollout engine; ``sync_weights`` after an update;
* ``reference_logprobs`` / ``actor_logprobs``: per-token log-probs of the completions (KL term, old policy);
* ``update``: ``num_iterations`` optimizer steps, each accumulating the gradients of the micro-batches (padded,
  or packed rows: :mod:`mindgrpo.train.packing`), reducing them over ranks, clipping by the global norm, AdamW;
* ``export`` / ``load_weights`` / ``save_optimizer_shard`` / ``load_optimizer``: what a checkpoint holds.

A Qwen2.5-VL actor holds its frozen vision tower (``actor.vision``, :mod:`mindgrpo.models.prompt_images`):
``embed_images`` runs it once per prompt per step, ``generate`` takes the result, ``vision_batch`` makes the step's
M-RoPE positions and features, which ride in the ``RolloutBatch`` to every forward (actor and reference alike, so
the reference is built without a tower); checkpoints export it as ``visual.*``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

from mindgrpo.algorithm import METRICS, LossConfig, step_row_weights
from mindgrpo.config import Derived, GRPOConfig
from mindgrpo.models import build_model, export_hf, hf_parameters
from mindgrpo.models.export import export_hf_arrays
from mindgrpo.models.lora import LoraSpec, adapter_parameters, save_peft
from mindgrpo.models.prompt_images import VisionBatch
from mindgrpo.models.weights import host_array
from mindgrpo.parallel.groups import DP, TP, WORLD, DistInfo, all_gather, all_reduce_sum
from mindgrpo.rollout import PromptImages, SamplingParams, build_rollout_engine
from mindgrpo.rollout.api import EosIds, TurnHandler
from mindgrpo.train import checkpoint as ckpt
from mindgrpo.train.optim import AdamW, learning_rate_at
from mindgrpo.train.optim_state import layout_record, load_resharded, rank_metadata
from mindgrpo.train.packing import MicroBatch, micro_batches
from mindgrpo.train.rollout_batch import RolloutBatch
from mindgrpo.train.step_batch import step_batch
from mindgrpo.train.step_graphs import (AccumulateGradients, ApplyGradients, CompletionLogProbs, GRPOLossCell,
                                        PackedLossCell, ReduceAndClip, completion_forward, gradient_buffers)


class ModelWorker:
    """One rank's models and what runs on them: the actor (trained), the reference (frozen, for the KL term), the
    rollout engine on the actor's weights, and the optimizer (verl's ``ActorRolloutRefWorker``)."""

    def __init__(self, config: GRPOConfig, dist: DistInfo, *, eos_token_id: EosIds, pad_token_id: int):
        rl, actor_cfg = config.rl_config, config.actor_config
        sampling = config.generate_config.sampling_config
        self.config, self.dist = config, dist
        # Under tensor parallelism each model is this rank's slices, read straight from the HF folder.
        tp = dict(tp_rank=dist.tp_rank, tp_size=dist.tp_size, tp_group=dist.tp_group)
        # LoRA: adapters on a frozen backbone, which is also the reference policy (the adapters off)
        self.lora = (LoraSpec(actor_cfg.lora_rank, actor_cfg.lora_alpha, tuple(actor_cfg.lora_target_modules))
                     if actor_cfg.lora_rank else None)
        self.actor = build_model(actor_cfg.load, role="actor", compute_dtype=actor_cfg.compute_dtype,
                                 param_dtype=actor_cfg.param_dtype, lora=self.lora, **tp)
        self.hf_config = self.actor.hf_config
        reference_dtype = Derived(config).reference_dtype
        # a Qwen2.5-VL reference reads the actor's image features: it holds no tower of its own
        self.reference = (build_model(config.ref_load, role="reference", compute_dtype=config.ref_config.compute_dtype,
                                      param_dtype=reference_dtype, vision=False, **tp)
                          if reference_dtype else None)
        self.engine = build_rollout_engine(
            config.generate_config.backend, self.actor, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
            max_prompt_length=rl.max_prompt_length, max_batch_size=config.generate_config.infer_model_batch_size,
            **rollout_options(config))
        self.sampling = sampling
        self.params = self.actor.trainable_params()  # with LoRA, the adapters alone
        self._hf_params = hf_parameters(self.actor)  # the same Parameter objects for the run's lifetime
        self._adapters = adapter_parameters(self.actor)  # {PEFT name: Parameter}; empty without LoRA
        hf_name_of = {id(param): name for name, param in {**self._hf_params, **self._adapters}.items()}
        self.param_names = [hf_name_of[id(param)] for param in self.params]
        self.layout, self.full_shapes = self.actor.layout, self.actor.full_shapes
        # the full shape of each trained tensor, by name: what the optimizer's state is resharded by and what an
        # export gathers (with LoRA, the adapters)
        self.trained_shapes = self.actor.adapter_shapes if self.lora else self.full_shapes
        self.optimizer = AdamW(self.params, actor_cfg.optimizer, names=self.param_names, dist=dist,
                               optimizer_shard=actor_cfg.parallel_config.optimizer_shard)
        self.settings = LossConfig.of(rl)
        derived = Derived(config)
        self.pack_rows = derived.packed_rows  # rows of max_tokens per packed forward; 0: padded micro-batches
        actor_forward = completion_forward(self.actor, config, backward=True)
        # One pass over rollouts sampled by the current weights: the old log-probs are the detached current ones.
        on_policy = derived.on_policy
        loss_cell = (PackedLossCell(actor_forward, sampling.temperature, self.settings, on_policy=on_policy)
                     if self.pack_rows else
                     GRPOLossCell(actor_forward, sampling.temperature, self.settings, on_policy=on_policy,
                                  grad_accum_steps=derived.grad_accum_steps, dp_size=dist.dp_size,
                                  max_completion_length=sampling.max_tokens))
        accumulators = gradient_buffers(self.params, actor_cfg.grad_reduce_dtype)
        self._accumulate = AccumulateGradients(loss_cell, self.params, accumulators)
        self._reduce_and_clip = ReduceAndClip(accumulators, actor_cfg.optimizer.max_grad_norm, dist,
                                              self.layout if dist.tp_size > 1 else None, self.param_names)
        self._apply = ApplyGradients(accumulators, self.optimizer)
        self._accumulators = accumulators
        # old-logprob scoring has no backward: the training forward serves unless it is marked for recompute
        scoring_forward = completion_forward(self.actor, config) if actor_cfg.recompute else actor_forward
        self._actor_logprobs = CompletionLogProbs(scoring_forward, sampling.temperature)
        if self.reference is not None:
            self._ref_logprobs = CompletionLogProbs(completion_forward(self.reference, config), sampling.temperature)
        elif self.lora is not None and rl.beta > 0:  # the backbone over the actor's own Parameters: no copy
            self._ref_logprobs = CompletionLogProbs(completion_forward(self.actor, config, adapters=False),
                                                    sampling.temperature)
        else:
            self._ref_logprobs = None

    # ------------------------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[np.ndarray], *, seed: int,
                 images: Optional[Sequence[Optional[PromptImages]]] = None, prompt_keys: Sequence[int] = (),
                 turns: Optional[TurnHandler] = None):
        """``num_generations`` completions per prompt; ``images``: a Qwen2.5-VL step's :meth:`embed_images`;
        ``prompt_keys``: each prompt's place in the global batch (``SamplingParams.prompt_keys``); ``turns``: a
        multi-turn rollout's handler (tools; native engine only, which config validation ensures)."""
        s = self.sampling
        params = SamplingParams(max_tokens=s.max_tokens, min_tokens=s.min_tokens, temperature=s.temperature,
                                top_p=s.top_p, top_k=s.top_k, repetition_penalty=s.repetition_penalty, seed=seed,
                                num_generations=self.config.rl_config.num_generations, logprobs=True,
                                prompt_keys=tuple(prompt_keys))
        return self.engine.generate([list(map(int, p)) for p in prompts], params, images, turns)

    def embed_images(self, images) -> Optional[List[Optional[PromptImages]]]:
        """A batch's images (``PromptBatch.images``) through the vision tower, once per prompt; None for text."""
        if images is None:
            return None
        if self.actor.vision is None:
            raise ValueError(f"the prompts carry images but actor_config.load = {self.config.actor_config.load} is a "
                             "text model; train a Qwen2.5-VL folder on image data, or convert a text dataset")
        return self.actor.vision.embed(images)

    def vision_batch(self, prompt_ids: np.ndarray, prompt_mask: np.ndarray,
                     images: Optional[Sequence[Optional[PromptImages]]]) -> Optional[VisionBatch]:
        """The M-RoPE positions and features of a step's left-padded prompts (None for text)."""
        return None if images is None else self.actor.vision.batch(prompt_ids, prompt_mask, images)

    def dummy_prompts(self, count: int, width: int, with_images: bool):
        """``count`` distinct dummy prompts of ``width`` tokens and, ``with_images`` (a Qwen2.5-VL run on image
        data), their images (else None), to precompile (the rollout engine computes each distinct prompt once, so
        its graph shapes depend on how many there are)."""
        prompts = np.arange(1, count + 1, dtype=np.int32)[:, None] * np.ones((1, width), np.int32)
        return (prompts, self.actor.vision.dummy_images(prompts)) if with_images else (prompts, None)

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def export(self, out_dir: Path) -> None:
        """The actor as a Hugging Face folder (the checkpoint manager hands us a fresh, empty folder). Under tensor
        parallelism each tensor is gathered from the ranks' slices as it is written, one at a time; the other
        ranks of this tensor-parallel group must run :meth:`serve_export` meanwhile. The weights are written in
        their own dtype (``actor_config.param_dtype``: bf16 working weights export as bf16, exactly). With LoRA
        the folder is the adapters' PEFT folder (the backbone is ``actor_config.load``, unchanged)."""
        if self.lora is not None:
            save_peft({name: self._gather_full(name) for name in self.trained_shapes}, self.lora, out_dir,
                      base_model=str(Path(self.config.actor_config.load).resolve()))
            return
        dtype = self.config.actor_config.param_dtype
        if self.dist.tp_size == 1:
            export_hf(self.actor, out_dir, hf_config=self.hf_config, tokenizer_dir=self.config.tokenizer_dir,
                      dtype=dtype, overwrite=True)
            return
        export_hf_arrays(out_dir, self.full_shapes, self._gather_full, hf_config=self.hf_config,
                         tokenizer_dir=self.config.tokenizer_dir, dtype=dtype, overwrite=True)

    def serve_export(self) -> None:
        """A tensor-parallel peer's side of :meth:`export`: the same gathers, in the same order (the trained
        tensors': with LoRA the adapters, else ``full_shapes``, which are the same names)."""
        for name in self.trained_shapes:
            self._gather_full(name)

    def _gather_full(self, hf_name: str) -> np.ndarray:
        """One full tensor (a backbone weight or an adapter) from this tensor-parallel group's slices (every rank
        of the group must call it)."""
        param = self._adapters[hf_name] if hf_name in self._adapters else self._hf_params[hf_name]
        if self.dist.tp_size == 1:
            return host_array(param)
        pieces = all_gather(host_array(param), self.dist, over=TP)
        return self.layout.assemble(hf_name, list(pieces), self.trained_shapes[hf_name])

    def load_weights(self, model_dir: Path) -> None:
        """The actor's weights from an HF folder (with LoRA: the adapters from a PEFT folder, the backbone staying
        ``actor_config.load``'s); under mixed precision the fp32 masters restart from them (a resume then restores
        the exact masters with :meth:`load_optimizer`)."""
        if self.lora is not None:
            self.actor.load_adapters(model_dir)
        else:
            self.actor.load_weights(model_dir)  # a Qwen2.5-VL actor's tower with it
        self.optimizer.sync_master_from_weights()
        self.sync_weights()

    def save_optimizer_shard(self, folder: Path) -> None:
        """This rank's AdamW moments (keyed by HF name; under ZeRO-1 only the parameters it owns) as
        ``rank_<rank>.safetensors``, and, from rank 0, the layout they were written under. Every rank writes one,
        so a checkpoint can be resharded to any layout (without ZeRO-1 data-parallel ranks write copies)."""
        ckpt.save_arrays(folder / f"rank_{self.dist.rank:05d}.safetensors", self.optimizer.state_arrays(),
                         metadata=rank_metadata(tp_rank=self.dist.tp_rank, dp_rank=self.dist.dp_rank))
        if self.dist.is_main:
            ckpt.save_json(folder / "layout.json", layout_record(tp=self.dist.tp_size, dp=self.dist.dp_size,
                                                                 optimizer_shard=self.optimizer.sharded))

    def load_optimizer(self, folder: Path) -> None:
        """This rank's moments (and fp32 master weights under mixed precision) from a checkpoint's ``optimizer/``
        folder, resharded from the layout it was written under (tensor-parallel degree, data-parallel size, ZeRO-1
        or not) to this one."""
        files = sorted(folder.glob("rank_*.safetensors"))
        state = load_resharded(files, ckpt.load_json(folder / "layout.json"), self.layout,
                               self.optimizer.owned_names, self.trained_shapes)
        self.optimizer.load_state_arrays(state)
        self.optimizer.weights_from_masters()

    def compiled_graphs(self) -> int:
        """Graphs MindSpore has compiled for this worker so far (its per-Cell compile caches and the engine's)."""
        cells = (self._accumulate, self._reduce_and_clip, self._apply, self._actor_logprobs, self._ref_logprobs,
                 None if self.actor.vision is None else self.actor.vision.tower)
        return self.engine.compiled_graphs() + sum(len(cell.compile_cache) for cell in cells if cell is not None)

    def precompile(self, rollouts: RolloutBatch) -> None:
        """Compile the training graphs for a batch shaped like ``rollouts`` (dummy tokens): the
        reference (and old) log-probs and one accumulated micro-batch, whose gradients are then dropped. Weights
        and optimizer state are untouched. Every micro-batch of a prompt width has one shape, padded or packed."""
        if self._ref_logprobs is not None:
            self.reference_logprobs(rollouts)
        if not Derived(self.config).on_policy:
            self.actor_logprobs(rollouts)
        zeros = np.zeros(rollouts.completion_mask.shape, np.float32)
        batch, _ = next(self._loss_batches(rollouts, zeros[:, 0], zeros, zeros, zeros, global_tokens=1.0))
        self._accumulate(batch)
        self._drop_gradients()

    def precompile_vision(self, patch_counts: Sequence[int]) -> None:
        """Compile the vision tower for images of these patch counts (see ``prompt_images.patch_bucket``)."""
        self.actor.vision.precompile(patch_counts)

    def _drop_gradients(self) -> None:
        """Zero the accumulated gradients (after precompiling, or for a skipped, non-finite update). Done from
        the host: it is rare, and a compiled graph for it would keep its memory for the whole run."""
        for accumulator in self._accumulators:
            accumulator.set_data(Tensor(np.zeros(accumulator.shape, np.float32), accumulator.dtype))

    # ------------------------------------------------------------------------------------------------------------
    def reference_logprobs(self, rollouts: RolloutBatch) -> np.ndarray:
        return self._score(self._ref_logprobs, rollouts, self.config.ref_config.ref_model_batch_size)

    def actor_logprobs(self, rollouts: RolloutBatch) -> np.ndarray:
        return self._score(self._actor_logprobs, rollouts, self.config.ref_config.ref_model_batch_size)

    def _score(self, cell: nn.Cell, rollouts: RolloutBatch, chunk: int) -> np.ndarray:
        if self.pack_rows:  # log-probs of the packed rows, put back in place (0 on padding)
            out = np.zeros(rollouts.completion_mask.shape, np.float32)
            for batch in micro_batches(rollouts, self.pack_rows, self.config.rl_config.num_generations):
                logp, _ = cell(step_batch(self._packed_inputs(rollouts, batch)))
                loss_rows, tokens = np.nonzero(batch.mask)
                out[batch.completions[loss_rows], tokens] = logp.asnumpy().reshape(-1)[batch.unpack[loss_rows, tokens]]
            return out
        out = []
        for start in range(0, len(rollouts.completion_ids), chunk):
            logp, _ = cell(step_batch(self._model_inputs(rollouts, start, chunk)))
            out.append(logp.asnumpy())
        return np.concatenate(out)

    def _model_inputs(self, rollouts: RolloutBatch, start: int, count: int) -> Dict[str, np.ndarray]:
        """The pass inputs of completions [start, start + count) (:mod:`mindgrpo.train.step_batch`): shared,
        their prompts ``[count / num_generations, P]`` once each (and a Qwen2.5-VL batch's image inputs);
        unshared, ``[prompt | completion]`` rows."""
        num_generations = self.config.rl_config.num_generations
        rows = slice(start, start + count)
        completion_ids = rollouts.completion_ids[rows]
        if not self.config.rl_config.share_prompt:
            of_row = np.arange(len(rollouts.completion_ids))[rows] // num_generations
            return {"input_ids": np.concatenate([rollouts.prompt_ids[of_row], completion_ids], 1),
                    "attention_mask": np.concatenate([rollouts.prompt_mask[of_row], rollouts.completion_mask[rows]], 1),
                    "completion_ids": completion_ids}
        prompts = slice(start // num_generations, (start + count) // num_generations)
        prompt = rollouts.prompt_ids[prompts]
        fields = {"prompt_ids": prompt, "prompt_mask": rollouts.prompt_mask[prompts], "completion_ids": completion_ids}
        if rollouts.vision is not None:
            fields.update(rollouts.vision.forward_inputs(np.arange(len(rollouts.prompt_ids))[prompts], prompt,
                                                         with_deltas=True))
        return fields

    @staticmethod
    def _packed_inputs(rollouts: RolloutBatch, batch: MicroBatch) -> Dict[str, np.ndarray]:
        """The packed pass's inputs of one micro-batch (see mindgrpo.train.packing.MicroBatch), and a Qwen2.5-VL
        batch's image inputs for its slots."""
        prompt = rollouts.prompt_ids[batch.prompts]
        fields = {"prompt_ids": prompt, "prompt_mask": rollouts.prompt_mask[batch.prompts],
                  "completion_ids": batch.completion_ids, "positions": batch.positions, "segments": batch.segments,
                  "row_prompt": batch.row_prompt, "source": batch.source}
        if rollouts.vision is not None:
            fields.update(rollouts.vision.forward_inputs(batch.prompts, prompt, with_deltas=False))
        return fields

    def _loss_batches(self, rollouts: RolloutBatch, advantages: np.ndarray, old: np.ndarray, ref: np.ndarray,
                      sampling: np.ndarray, *, global_tokens: float):
        """Each micro-batch's named batch (:mod:`mindgrpo.train.step_batch`) and its active tokens. ``global_tokens``: the step's active tokens
        on all ranks (dapo's normaliser). ``sampling``: the rollout engine's log-probs (``rollouts.sampling_logp``),
        zeros when the engine gave none (the loss reads them only under rl_config.rollout_correction)."""
        micro = self.config.actor_config.micro_batch_size
        loss_mask = rollouts.loss_mask  # without truncated completions under rl_config.mask_truncated_completions
        sampling = sampling.astype(np.float32, copy=False)
        if self.pack_rows:
            weights = step_row_weights(self.settings, loss_mask.sum(1), micro,
                                       dp_size=self.dist.dp_size, num_items_in_batch=global_tokens,
                                       max_completion_length=self.config.generate_config.sampling_config.max_tokens)
            for batch in micro_batches(rollouts, self.pack_rows, self.config.rl_config.num_generations):
                rows = batch.completions
                mask = batch.mask * loss_mask[rows]  # the mask's columns are its completions' own tokens
                yield (step_batch({**self._packed_inputs(rollouts, batch), "unpack": batch.unpack, "loss_mask": mask,
                                   "advantages": advantages[rows], "old_logp": old[rows], "ref_logp": ref[rows],
                                   "sampling_logp": sampling[rows], "row_weights": weights[rows]}),
                       int(mask.sum()))
            return
        num_items = Tensor(max(1.0, global_tokens), ms.float32)
        for start in range(0, len(rollouts.completion_ids), micro):
            rows = slice(start, start + micro)
            yield (step_batch({**self._model_inputs(rollouts, start, micro), "loss_mask": loss_mask[rows],
                               "advantages": advantages[rows], "old_logp": old[rows], "ref_logp": ref[rows],
                               "sampling_logp": sampling[rows], "num_items": num_items}),
                   int(loss_mask[rows].sum()))

    def update(self, rollouts: RolloutBatch, advantages: np.ndarray, old_logp: Optional[np.ndarray],
               ref_logp: Optional[np.ndarray], *, total_steps: int) -> Dict[str, float]:
        """``num_iterations`` optimizer steps over this rank's rollouts; returns metrics averaged over them:
        ``actor/loss`` is an optimizer step's loss (the sum of its micro-batches'), the other ``actor/`` metrics
        token means over the step's global batch, whatever its micro-batches and data-parallel ranks are."""
        rl = self.config.rl_config
        zeros = np.zeros(rollouts.completion_mask.shape, np.float32)
        old = old_logp if old_logp is not None else zeros  # ignored on-policy: the cell uses detached logp
        ref = ref_logp if ref_logp is not None else zeros  # ignored when beta = 0
        if rollouts.sampling_logp is None and self.settings.rollout_correction != "none":
            # zeros would make every weight exp(old) and silently rescale the loss
            raise ValueError(f"rl_config.rollout_correction={self.settings.rollout_correction} needs the rollout "
                             "engine's log-prob of every sampled token, and this batch has none: set "
                             "rl_config.rollout_correction=none or use a backend that reports them")
        sampling = rollouts.sampling_logp if rollouts.sampling_logp is not None else zeros
        gap = np.zeros(3)  # the first pass's [sum |d|, max |d|, sum exp(d)]: the weights that sampled the rollouts
        # dapo normalises by the active tokens of the whole optimizer step on all ranks (see mindgrpo.algorithm.loss).
        global_tokens = all_reduce_sum(np.array([rollouts.loss_mask.sum()]), self.dist)[0]
        # the token means are of the global batch (as TRL logs them): each rank weighs its tokens by the global
        # count times dp_size, and the data-parallel average below sums those shares
        step_tokens = max(1.0, float(global_tokens)) / self.dist.dp_size
        totals: Dict[str, float] = {}
        skipped = 0
        for iteration in range(rl.num_iterations):
            sums: Dict[str, float] = {}
            # No collective runs per micro-batch (only tensor-parallel ones, within identical ranks), so
            # data-parallel ranks may take different numbers of packed micro-batches.
            for batch, tokens in self._loss_batches(rollouts, advantages.astype(np.float32), old, ref, sampling,
                                                    global_tokens=global_tokens):
                loss, metrics, entropy, micro_gap = self._accumulate(batch)
                if iteration == 0:
                    micro_gap = micro_gap.asnumpy().astype(np.float64)
                    gap = np.array([gap[0] + micro_gap[0], max(gap[1], micro_gap[1]), gap[2] + micro_gap[2]])
                named = dict(zip(METRIC_KEYS, metrics.asnumpy().tolist()))
                sums["actor/loss"] = sums.get("actor/loss", 0.0) + float(loss)
                for key, value in {"actor/entropy": float(entropy), **named}.items():
                    sums[key] = sums.get(key, 0.0) + value * tokens / step_tokens
            norm = self._reduce_and_clip.reduce_and_clip()
            lr = learning_rate_at(self.config.actor_config.lr_schedule, self.optimizer.step_count,
                                  total_steps * rl.num_iterations)
            # Every rank must take the same branch: the norm is already global; the loss flag is made global.
            local_bad = not all(np.isfinite(v) for v in sums.values())
            if np.isfinite(norm) and not all_reduce_sum(np.array([float(local_bad)]), self.dist, over=WORLD)[0]:
                self._apply(*self.optimizer.hyper_tensors(lr))
                self.optimizer.publish()
            else:
                self._drop_gradients()
                skipped += 1  # keep the last good weights; the trainer counts and eventually stops
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + value
            totals["grad_norm"] = totals.get("grad_norm", 0.0) + norm
            totals["grpo/lr"] = lr
        out = {k: v / rl.num_iterations if k != "grpo/lr" else v for k, v in totals.items()}
        reduced = all_reduce_sum(np.array(list(out.values())), self.dist) / self.dist.dp_size
        out = dict(zip(out, map(float, reduced)))
        if rollouts.sampling_logp is not None:
            out.update(self._rollout_gap(gap, float(rollouts.loss_mask.sum())))
        out["skipped"] = float(skipped > 0)
        out["grpo/skipped_updates"] = float(skipped)
        return out

    def _rollout_gap(self, gap: np.ndarray, tokens: float) -> Dict[str, float]:
        """The gap between the training forward's log-probs and the rollout engine's over the step's active tokens,
        on all data-parallel ranks: the mean and largest |difference| and the mean importance ratio
        exp(train - sampling) (1 when both compute the same distribution)."""
        sums = all_reduce_sum(np.array([gap[0], gap[2], tokens]), self.dist)
        largest = -all_gather(np.array([-gap[1]]), self.dist, over=DP).min()  # the gather-and-min of a maximum
        count = max(sums[2], 1.0)
        return {"rollout/logprob_diff_mean": sums[0] / count, "rollout/logprob_diff_max": float(largest),
                "rollout/is_ratio_mean": sums[1] / count}


def rollout_options(config: GRPOConfig) -> dict:
    """Backend-specific engine settings from the config."""
    gen = config.generate_config
    if gen.backend == "vllm":
        return {"model_dir": gen.load or config.actor_config.load,
                "max_model_len": gen.max_model_len or config.rl_config.seq_length,
                "gpu_memory_utilization": gen.gpu_memory_utilization, "block_size": gen.block_size,
                "tensor_parallel_size": gen.parallel_config.model_parallel,
                "max_tokens": gen.sampling_config.max_tokens, "dtype": config.actor_config.compute_dtype,
                "seed": config.rl_config.seed}
    if gen.backend == "native":
        return {"prompt_length_buckets": Derived(config).prompt_widths, "decode_impl": gen.decode_impl}
    return {}


# grpo_loss's metric vector (mindgrpo.algorithm.METRICS) under the seeds' metric names.
METRIC_KEYS = tuple({"pg_loss": "actor/pg_loss", "kl": "actor/kl_loss", "clipfrac": "actor/pg_clipfrac",
                     "clipfrac_low": "actor/pg_clipfrac_low", "clipfrac_high": "actor/pg_clipfrac_high",
                     "ppo_kl": "actor/ppo_kl"}[name] for name in METRICS)
