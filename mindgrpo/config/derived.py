"""The values that follow from a config, computed here and only here (the trainer, the policy, the planner and
the doctor read them from :class:`Derived`).

Each is computed when read, from the config as it is then: the doctor reads them from a config that may have
failed validation, and only a value that needs a bad key fails.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

if TYPE_CHECKING:
    from mindgrpo.config.schema import GRPOConfig


class Derived:
    """``Derived(config).completions_per_rank`` and the rest: what a run's shapes and step counts are."""

    def __init__(self, config: "GRPOConfig"):
        self.config = config

    @property
    def completions_per_rank(self) -> int:
        """One step's rollouts on a data-parallel rank: ``batch_size`` prompts x ``num_generations`` each."""
        rl = self.config.rl_config
        return rl.batch_size * rl.num_generations

    @property
    def on_policy(self) -> bool:
        """Whether every update trains on rollouts the current weights sampled: one pass (``num_iterations``) over
        one step's generation (``steps_per_generation``). Then the old log-probs are the detached current ones and
        no scoring pass computes them; otherwise they are taken once, at generation."""
        rl = self.config.rl_config
        return rl.num_iterations == 1 and rl.steps_per_generation == 1

    @property
    def grad_accum_steps(self) -> int:
        """Padded micro-batches whose gradients one optimizer step sums (the loss's divisor G)."""
        return self.completions_per_rank // self.config.actor_config.micro_batch_size

    @property
    def packed_rows(self) -> int:
        """Rows of ``max_tokens`` in one packed forward (``actor_config.max_tokens_per_micro_batch`` rounded down to
        whole rows); 0: padded micro-batches."""
        return (self.config.actor_config.max_tokens_per_micro_batch
                // self.config.generate_config.sampling_config.max_tokens)

    @property
    def prompt_widths(self) -> Tuple[int, ...]:
        """Every padded prompt width a step can meet: multiples of ``prompt_bucket`` up to ``max_prompt_length``
        (the native rollout engine's prompt-length buckets and the reference and training graphs' widths)."""
        step, cap = self.config.rl_config.prompt_bucket, self.config.rl_config.max_prompt_length
        return tuple(sorted({min(cap, width) for width in range(step, cap + step, step)}))

    @property
    def reference_dtype(self) -> Optional[str]:
        """The dtype the reference model's weights are stored in; None without one (``beta`` 0). The reference is
        the actor's starting point: with bf16 actor weights (``actor_config.param_dtype``) it is stored in bf16 too,
        so it is exactly the actor's first weights (step 1's KL is 0, not the rounding of a float32 copy) at half
        the bytes; otherwise in its compute dtype (``ref_config.compute_dtype``)."""
        if self.config.rl_config.beta <= 0 or self.config.actor_config.lora_rank > 0:
            return None  # no reference model; with LoRA the reference is the actor's backbone, adapters off
        if self.config.actor_config.param_dtype == "bfloat16":
            return "bfloat16"
        return self.config.ref_config.compute_dtype

    @property
    def max_rollout_logprob_gap(self) -> float:
        """``rl_config.max_rollout_logprob_gap`` resolved: its default (-1) is 1e-3 where the rollout engine's
        log-probs are of the distribution the training forward computes, in the same float32 math, else 0 (off).
        The engine reports the log-probs of the distribution it drew from, after the repetition penalty, the EOS
        ban of ``min_tokens``, top-k and top-p (the temperature both sides apply), so any of those makes a gap."""
        gap = self.config.rl_config.max_rollout_logprob_gap
        if gap >= 0:
            return gap
        sampling = self.config.generate_config.sampling_config
        plain = (sampling.repetition_penalty == 1.0 and sampling.min_tokens == 0 and sampling.top_k <= 0
                 and sampling.top_p >= 1.0)
        same_math = (self.config.generate_config.backend == "native"
                     and self.config.actor_config.compute_dtype == "float32")
        return 1e-3 if same_math and plain else 0.0

    def fused_head(self, device: str, *, compute_dtype: str, head_dtype: str, model_parallel: int,
                   backward: bool) -> bool:
        """Whether a pass's vocabulary head runs as the fused kernel (``actor_config.head_impl: fused``,
        mindgrpo.ops.head_logprobs): on ``device`` ``cpu`` (the kernel is CPU C++), at one tensor-parallel rank (the
        vocabulary-parallel log-softmax has its own path), with a float32 head computed in float32, and for a
        training forward (``backward``) without the entropy bonus (the kernel's entropy has no gradient). The
        trainer asks with the built model's own dtypes, the planner with :attr:`actor_head_dtype`."""
        return (self.config.actor_config.head_impl == "fused" and device.lower() == "cpu" and model_parallel == 1
                and compute_dtype == "float32" and head_dtype == "float32"
                and not (backward and self.config.rl_config.entropy_coef > 0))

    def actor_head_dtype(self, device: str) -> str:
        """The dtype the actor's head is stored in on ``device``: its param_dtype, except a LoRA backbone's bf16
        head, which CPU keeps float32 (models/qwen2.py: CPU has no bf16 Gather or MatMul)."""
        actor = self.config.actor_config
        return "float32" if actor.lora_rank > 0 and device.lower() == "cpu" else actor.param_dtype

    def prompt_width(self, longest_prompt: int) -> int:
        """The padded width of a batch whose longest prompt has ``longest_prompt`` tokens: the smallest of
        :attr:`prompt_widths` that holds it (few distinct shapes: GRAPH mode compiles each once)."""
        widths = self.prompt_widths
        return next((width for width in widths if width >= longest_prompt), widths[-1])

    def total_steps(self, steps_per_epoch: int) -> int:
        """Training steps of the run: ``max_steps``, or ``epochs`` passes of ``steps_per_epoch`` (the dataset's
        full global batches) when it is 0, rounded down to whole generations (``steps_per_generation``)."""
        rl = self.config.rl_config
        per_generation = max(1, rl.steps_per_generation)
        return rl.max_steps or rl.epochs * steps_per_epoch // per_generation * per_generation
