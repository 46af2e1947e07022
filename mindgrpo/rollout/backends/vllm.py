"""The ``vllm`` rollout backend: vllm-mindspore on Ascend NPUs.

Ascend only, and it has never run: vllm-mindspore does not import on CPU (it is imported through the Ascend
boundary, :mod:`mindgrpo.ops.ascend`, which says what is verified where), so this adapter is written against
vLLM's public ``LLM`` / ``SamplingParams`` / ``TokensPrompt`` API and MindRLHF's way of reaching the MindSpore
network inside vllm-mindspore. mindgrpo's tests exercise its missing-package error and its weight sync
(:func:`sync_into_vllm`, into a fake network laid out as vLLM's), nothing else.

Differences from the native backend:

* ``logprobs`` are whatever vLLM reports for the sampled token (vLLM's V1 engine defaults to the raw model
  distribution before temperature/top-k/top-p; newer vLLM accepts ``logprobs_mode="processed_logprobs"``, pass it
  through ``llm_options`` when available);
* ``seed`` seeds vLLM's per-request generator, so completions differ from the native backend's for the same seed;
* ``sync_weights`` reshards the actor's weights from the training layout (tensor parallel ``a``) to vLLM's
  (``tensor_parallel_size = b``, merged ``qkv_proj`` / ``gate_up_proj``; :mod:`mindgrpo.parallel.resharding`) and
  writes them into vllm-mindspore's native Qwen2 model (its default for ``Qwen2ForCausalLM``; do not set
  ``VLLM_MS_MODEL_BACKEND=MindFormers``, whose network has other parameter names).
* Under msrun every process runs one vLLM rank (``distributed_executor_backend="external_launcher"``, as MindRLHF's
  ``InferWorker`` does), so vLLM's tensor-parallel groups are runs of ``b`` consecutive ranks, like the training
  ones; each process reshards only its own vLLM rank's weights.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Mapping, Optional, Sequence

import numpy as np

from mindgrpo.ops.ascend import import_vllm
from mindgrpo.rollout.api import (FINISH_LENGTH, FINISH_STOP, EosIds, PromptImages, RolloutResult, SamplingParams,
                                  TurnHandler, assemble_result, check_request, eos_tuple, refuse_images,
                                  refuse_turns)


class VllmRolloutEngine:
    """Rollouts through vllm-mindspore's ``LLM.generate`` (Ascend only)."""

    def __init__(self, actor: Any, *, eos_token_id: EosIds, pad_token_id: int, max_prompt_length: int,
                 max_batch_size: int = 32, model_dir: Optional[str] = None, max_model_len: int = 0,
                 max_tokens: int = 512, gpu_memory_utilization: float = 0.9, block_size: int = 32,
                 tensor_parallel_size: int = 1, dtype: str = "bfloat16", seed: int = 0,
                 llm_options: Optional[dict] = None, train_layout: Any = None,
                 gather: Optional[Callable[[str, np.ndarray], Sequence[np.ndarray]]] = None):
        """
        Args:
            model_dir: Hugging Face folder vLLM loads its weights, config and tokenizer from (required).
            max_model_len: longest prompt + completion; 0 means ``max_prompt_length + max_tokens``.
            max_tokens: longest completion planned (only sizes ``max_model_len``).
            gpu_memory_utilization, block_size, tensor_parallel_size, dtype, seed: vLLM's ``LLM`` arguments.
            llm_options: further keyword arguments for ``vllm.LLM``.
            train_layout: this rank's training :class:`~mindgrpo.parallel.layout.TPLayout` (the slices the
                actor's Parameters hold); None means the actor's own ``layout``.
            gather: ``gather(hf_name, piece)`` -> the training tensor-parallel group's pieces in rank order; None
                means :func:`mindgrpo.parallel.groups.all_gather` over that group.
            Other arguments as in :func:`mindgrpo.rollout.build_rollout_engine`.
        """
        vllm = import_vllm()
        if not model_dir:
            raise ValueError("the vllm backend needs model_dir: the Hugging Face folder vLLM loads the model from")
        from mindgrpo.parallel.groups import launched_by_msrun

        self.actor = actor
        self.train_layout = train_layout or actor.layout
        self.gather = gather or _tp_gather(self.train_layout.tp)
        options = dict(llm_options or {})
        if launched_by_msrun():  # one vLLM rank per msrun process (MindRLHF's InferWorker does the same)
            options.setdefault("distributed_executor_backend", "external_launcher")
        self.eos_ids = eos_tuple(eos_token_id)
        self.pad_token_id = int(pad_token_id)
        self.max_prompt_length = int(max_prompt_length)
        self.llm = vllm.LLM(model=str(model_dir), tensor_parallel_size=tensor_parallel_size, dtype=dtype,
                            block_size=block_size, max_num_seqs=max_batch_size,
                            max_model_len=max_model_len or (self.max_prompt_length + max_tokens),
                            gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                            enable_prefix_caching=False, **options)
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        from vllm.distributed import get_tensor_model_parallel_rank

        self.vllm_layout = dataclasses.replace(self.train_layout, tp=tensor_parallel_size,
                                               rank=get_tensor_model_parallel_rank())
        self.sync_weights()

    def _served_network(self) -> Any:
        """The model vllm-mindspore runs (MindRLHF's attribute path; native models are ``model_runner.model``
        itself, MindFormers-backend ones wrap a ``.network``)."""
        try:
            runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
        except AttributeError as err:
            raise RuntimeError("cannot reach the model inside vllm-mindspore (llm_engine.model_executor."
                               "driver_worker.worker.model_runner); this vllm version is not supported for weight "
                               "sync") from err
        return getattr(runner.model, "network", runner.model)

    def compiled_graphs(self) -> int:
        """vLLM compiles and caches its graphs itself, outside the MindSpore Cells this process counts."""
        return 0

    def sync_weights(self) -> None:
        """Reshard the actor's current weights into this process's vLLM rank."""
        from mindgrpo.models import hf_parameters

        sync_into_vllm(hf_parameters(self.actor), self._served_network(), source=self.train_layout,
                       target=self.vllm_layout, gather=self.gather)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 images: Optional[Sequence[Optional[PromptImages]]] = None,
                 turns: Optional[TurnHandler] = None) -> RolloutResult:
        refuse_images(images, "vllm")
        refuse_turns(turns, "vllm")
        vllm = import_vllm()
        from vllm.inputs import TokensPrompt

        prompts = check_request(prompts, params, self.max_prompt_length, self.vocab_size)
        sampling = vllm.SamplingParams(
            n=params.num_generations, temperature=params.temperature, top_p=params.top_p,
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


def _tp_gather(train_tp: int) -> Callable[[str, np.ndarray], Sequence[np.ndarray]]:
    """Gather a training tensor's pieces over the training tensor-parallel group (identity for one rank)."""
    if train_tp == 1:
        return lambda name, piece: [piece]
    from mindgrpo.parallel.groups import TP, all_gather, init_distributed

    info = init_distributed(train_tp)
    return lambda name, piece: list(all_gather(piece, info, over=TP))


def _served_parameters(network: Any) -> Mapping[str, Any]:
    """Name -> Parameter of the served model: vllm-mindspore's native models list theirs with ``get_params_dict``
    (``model.layers.N...``, ``lm_head.weight``); a plain Cell with ``parameters_and_names``."""
    if hasattr(network, "get_params_dict"):
        return network.get_params_dict()
    return dict(network.parameters_and_names())


def sync_into_vllm(weights: Mapping[str, Any], network: Any, *, source: Any, target: Any,
                   gather: Callable[[str, np.ndarray], Sequence[np.ndarray]]) -> int:
    """Write this rank's vLLM weights, resharded from the training pieces, into ``network``; returns how many
    Parameters were written.

    Args:
        weights: the actor's Parameters by HF name (``hf_parameters(actor)``): this training rank's pieces.
        network: the served model (vllm-mindspore's native Qwen2, or anything with ``get_params_dict()`` or
            ``parameters_and_names()`` under vLLM's names).
        source, target: the training layout of this rank and the vLLM layout of this rank (``TPLayout``).
        gather: ``gather(hf_name, piece)`` -> the training tensor-parallel group's pieces in rank order.

    Every vLLM tensor must exist in ``network`` at the expected shape (the error names the first that does not),
    and every ``.weight`` / ``.bias`` Parameter of ``network`` must have been written (tied models: ``lm_head`` is
    the embedding's Parameter). Values are cast to each Parameter's dtype.
    """
    import mindspore as ms
    from mindgrpo.models.weights import CheckpointMismatchError, host_array
    from mindgrpo.parallel.resharding import rank_to_vllm

    served = _served_parameters(network)
    local = {name: (lambda param=param: host_array(param)) for name, param in weights.items()}
    written = set()
    for name, array in rank_to_vllm(local, gather, source, target):
        param = served.get(name)
        if param is None:
            raise CheckpointMismatchError(f"vllm weight sync: the served model has no parameter {name!r} (is "
                                          "VLLM_MS_MODEL_BACKEND set to another backend than native?)")
        if tuple(param.shape) != tuple(array.shape):
            raise CheckpointMismatchError(
                f"vllm weight sync: {name} is {tuple(param.shape)} in vLLM rank {target.rank} of {target.tp}, the "
                f"resharded tensor is {tuple(array.shape)}: generate_config.parallel_config.model_parallel must "
                "equal vLLM's tensor_parallel_size")
        param.set_data(ms.Tensor(np.ascontiguousarray(array, dtype=np.float32)).astype(param.dtype))
        written.add(id(param))
    left = sorted(name for name, param in served.items()
                  if name.endswith((".weight", ".bias")) and id(param) not in written)
    if left:
        raise CheckpointMismatchError(f"vllm weight sync: nothing was written to {', '.join(left[:8])} of the "
                                      "served model: it is not the Qwen2 model the actor is")
    return len(written)
