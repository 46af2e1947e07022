"""Qwen2.5 models: build from a Hugging Face folder, strict weight loading, export back, weight sync.

Qwen2 lives in three modules, one role each (all over the same Parameters, so they agree to rounding and an
optimizer step reaches every one of them):

===============================================  ===================================================================
module                                           what it is, and when it runs
===============================================  ===================================================================
:mod:`~mindgrpo.models.causal_lm`                MindFormers' ``LlamaForCausalLM`` configured as Qwen2, weights from
                                                 the HF folder (``build_model``): it owns the Parameters. Its forward
                                                 runs for training and scoring with ``rl_config.share_prompt: false``
                                                 and in the ``mindformers`` rollout backend's ``generate``.
:mod:`~mindgrpo.models.qwen2_blocks`             mindgrpo's own decoder math over those Parameters (no copy). It runs
                                                 in the shared-prompt and packed forwards (the default for training and
                                                 scoring, and the only one under tensor parallelism, where
                                                 :mod:`~mindgrpo.models.qwen2_sharded` holds a rank's slices).
:mod:`~mindgrpo.rollout.backends.native_graphs`  prefill and decode graphs with a KV cache, built on those blocks: the
                                                 default ``native`` rollout engine.
===============================================  ===================================================================

Qwen2.5-VL adds to the same math, not a fourth copy: :mod:`~mindgrpo.models.vision` (the vision tower),
:mod:`~mindgrpo.models.mrope` (its three-row positions, on the host), :mod:`~mindgrpo.models.image_tokens` (image
features in place of ``<|image_pad|>``) and :mod:`~mindgrpo.models.full_sequence` (a plain full-sequence forward
over :mod:`~mindgrpo.models.qwen2_blocks` with M-RoPE, checked against transformers' logits). The native rollout
engine and the shared-prompt and packed forwards take their outputs; :mod:`mindgrpo.train.prompt_images` runs the
tower in training.

Every MindFormers import in mindgrpo is in this package or reaches it through this package, so it is imported
once, here, without the packages it loads only for features mindgrpo never uses (see
:mod:`mindgrpo._lean_import`).
"""
from mindgrpo._lean_import import lean_mindformers_import

with lean_mindformers_import():
    from mindgrpo.models.causal_lm import ROLES, Qwen2CausalLM, build_model
    from mindgrpo.models.export import export_hf
    from mindgrpo.models.hf_config import (ModelConfigError, Qwen2Spec, qwen2_spec, read_generation_config,
                                           read_hf_config)
    from mindgrpo.models.packed_prompt import PackedPromptForward
    from mindgrpo.models.shared_prompt import SharedPromptForward
    from mindgrpo.models.weights import (CheckpointMismatchError, checkpoint_files, hf_parameters, hf_to_ms_name,
                                         load_hf_weights, load_state_dict_hf, ms_to_hf_name, state_dict_hf,
                                         sync_weights)
