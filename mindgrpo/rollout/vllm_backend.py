"""The ``vllm`` rollout backend: vllm-mindspore on Ascend NPUs.

Ascend only, and untested in mindgrpo's CI: vllm-mindspore does not import on CPU, so this adapter is written
against vLLM's public ``LLM`` / ``SamplingParams`` / ``TokensPrompt`` API and MindRLHF's way of reaching the
MindSpore network inside vllm-mindspore, and is only exercised here for its missing-package error.

Differences from the native backend:

* ``logprobs`` are whatever vLLM reports for the sampled token (vLLM's V1 engine defaults to the raw model
  distribution before temperature/top-k/top-p; newer vLLM accepts ``logprobs_mode="processed_logprobs"``, pass it
  through ``llm_options`` when available);
* ``seed`` seeds vLLM's per-request generator, so completions differ from the native backend's for the same seed;
* ``sync_weights`` copies the actor's weights by MindFormers name into the network vllm-mindspore serves, which
  works with its MindFormers model backend (``vLLM_MODEL_BACKEND=MindFormers``, as MindRLHF runs it).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence


from mindgrpo.rollout.api import (FINISH_LENGTH, FINISH_STOP, EosIds, RolloutResult, SamplingParams,
                                  assemble_result, check_request, eos_tuple)

MISSING_VLLM = ("the 'vllm' rollout backend needs the vllm-mindspore package, which runs only on Ascend NPUs "
                "(it does not import on CPU machines); install it on an Ascend machine with "
                "`pip install mindgrpo[ascend]`, or choose the 'native' backend")


def import_vllm() -> Any:
    """Import vllm-mindspore (which must come before vllm: it patches vllm for MindSpore) and return ``vllm``."""
    try:
        import vllm_mindspore  # noqa: F401
        import vllm
    except ImportError as err:
        raise ImportError(f"{MISSING_VLLM} ({err})") from err
    except Exception as err:  # installed but unusable here, e.g. no Ascend driver: same advice
        raise RuntimeError(f"{MISSING_VLLM} (importing it failed: {type(err).__name__}: {err})") from err
    return vllm


class VllmRolloutEngine:
    """Rollouts through vllm-mindspore's ``LLM.generate`` (Ascend only)."""

    def __init__(self, actor: Any, *, eos_token_id: EosIds, pad_token_id: int, max_prompt_length: int,
                 max_batch_size: int = 32, model_dir: Optional[str] = None, max_model_len: int = 0,
                 max_tokens: int = 512, gpu_memory_utilization: float = 0.9, block_size: int = 32,
                 tensor_parallel_size: int = 1, dtype: str = "bfloat16", seed: int = 0,
                 llm_options: Optional[dict] = None):
        """
        Args:
            model_dir: Hugging Face folder vLLM loads its weights, config and tokenizer from (required).
            max_model_len: longest prompt + completion; 0 means ``max_prompt_length + max_tokens``.
            max_tokens: longest completion planned (only sizes ``max_model_len``).
            gpu_memory_utilization, block_size, tensor_parallel_size, dtype, seed: vLLM's ``LLM`` arguments.
            llm_options: further keyword arguments for ``vllm.LLM``.
            Other arguments as in :func:`mindgrpo.rollout.build_rollout_engine`.
        """
        vllm = import_vllm()
        if not model_dir:
            raise ValueError("the vllm backend needs model_dir: the Hugging Face folder vLLM loads the model from")
        self.actor = actor
        self.eos_ids = eos_tuple(eos_token_id)
        self.pad_token_id = int(pad_token_id)
        self.max_prompt_length = int(max_prompt_length)
        self.llm = vllm.LLM(model=str(model_dir), tensor_parallel_size=tensor_parallel_size, dtype=dtype,
                            block_size=block_size, max_num_seqs=max_batch_size,
                            max_model_len=max_model_len or (self.max_prompt_length + max_tokens),
                            gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                            enable_prefix_caching=False, **(llm_options or {}))
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.sync_weights()

    def _served_network(self) -> Any:
        """The MindSpore network vllm-mindspore runs (the attribute path MindRLHF uses)."""
        try:
            runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
        except AttributeError as err:
            raise RuntimeError("cannot reach the model inside vllm-mindspore (llm_engine.model_executor."
                               "driver_worker.worker.model_runner); this vllm version is not supported for weight "
                               "sync") from err
        return getattr(runner.model, "network", runner.model)

    def sync_weights(self) -> None:
        """Copy the actor's current weights into the network vLLM serves."""
        from mindgrpo.models import sync_weights
        sync_weights(self.actor, self._served_network())

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> RolloutResult:
        vllm = import_vllm()
        from vllm.inputs import TokensPrompt

        prompts = check_request(prompts, params, self.max_prompt_length, self.vocab_size)
        sampling = vllm.SamplingParams(
            n=params.n, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1, repetition_penalty=params.repetition_penalty,
            min_tokens=params.min_tokens, max_tokens=params.max_tokens, seed=params.seed,
            stop_token_ids=list(self.eos_ids + params.stop_token_ids), logprobs=0 if params.logprobs else None,
            detokenize=False)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sampling_params=sampling,
                                    use_tqdm=False)
        tokens: List[List[int]] = []
        logprobs: List[List[float]] = []
        reasons: List[str] = []
        for request in outputs:  # vLLM returns requests in prompt order
            for sample in sorted(request.outputs, key=lambda s: s.index):
                ids = [int(t) for t in sample.token_ids][:params.max_tokens]
                tokens.append(ids)
                reasons.append(FINISH_STOP if sample.finish_reason == "stop" else FINISH_LENGTH)
                if params.logprobs:
                    logprobs.append([float(step[t].logprob) for t, step in zip(ids, sample.logprobs)])
        return assemble_result(tokens, reasons, logprobs if params.logprobs else None, params.max_tokens,
                               self.pad_token_id)
