"""Qwen2.5 models: build from a Hugging Face folder, strict weight loading, export back, weight sync.

One Qwen2 type at every tensor-parallel degree, and MindFormers' own for one rollout backend:

===============================================  ===================================================================
module                                           what it is, and when it runs
===============================================  ===================================================================
:mod:`~mindgrpo.models.qwen2`                    :class:`Qwen2Model` (``build_model``): a rank's weights, spec,
                                                 layout and tensor-parallel group, and its passes as named methods.
                                                 The actor, the reference and the native rollout engine are one.
:mod:`~mindgrpo.models.qwen2_blocks`             the decoder math over a ``Qwen2Model``'s Parameters (no copy), which
                                                 every pass runs: :mod:`~mindgrpo.models.full_sequence`,
                                                 :mod:`~mindgrpo.models.shared_prompt`,
                                                 :mod:`~mindgrpo.models.packed_prompt` and the native engine's
                                                 prefill and decode (:mod:`mindgrpo.rollout.backends.native_graphs`).
:mod:`~mindgrpo.models.causal_lm`                MindFormers' ``LlamaForCausalLM`` configured as Qwen2
                                                 (``build_mindformers_model``): only the ``mindformers`` rollout
                                                 backend's ``generate``, on a copy of the actor's weights.
===============================================  ===================================================================

Qwen2.5-VL is the same model type, not another copy: a ``Qwen2Model`` built from a Qwen2.5-VL folder says so
(``is_vl``) and holds its frozen vision tower (``vision``, :mod:`~mindgrpo.models.prompt_images`: each prompt's
images through :mod:`~mindgrpo.models.vision` once, and what the forwards read of them), with
:mod:`~mindgrpo.models.mrope` (the three-row positions, on the host), :mod:`~mindgrpo.models.image_tokens` (image
features in place of ``<|image_pad|>``) and :mod:`~mindgrpo.models.full_sequence` (checked against transformers'
logits). The native rollout engine and the shared-prompt and packed forwards take their outputs.

The passes' interface is :class:`~mindgrpo.models.passes.ModelPass`. Inside the package the imports run one way:
the model (:mod:`~mindgrpo.models.qwen2`) imports its passes, the passes the blocks, the blocks nothing of the model.

Every MindFormers import in mindgrpo is in :mod:`~mindgrpo.models.causal_lm` or reaches it through this package,
and goes through :func:`mindgrpo._lean_import.lean_mindformers_import` (without the packages MindFormers loads only
for features mindgrpo never uses). The package's names load on first use: reading a ``config.json``
(:mod:`~mindgrpo.hf_config`, which the preflight does before anything is built) costs no MindFormers import,
several seconds on 2 cores.
"""
import importlib

_EXPORTS = {
    "mindgrpo.models.qwen2": ("ROLES", "Qwen2Model", "build_model"),
    "mindgrpo.models.causal_lm": ("build_mindformers_model",),
    "mindgrpo.models.full_sequence": ("CompletionForward", "FullSequenceForward"),
    "mindgrpo.models.export": ("export_hf",),
    "mindgrpo.hf_config": ("ModelConfigError", "Qwen2Spec", "qwen2_spec", "read_generation_config",
                                  "read_hf_config"),
    "mindgrpo.models.packed_prompt": ("PackedPromptForward",),
    "mindgrpo.models.shared_prompt": ("SharedPromptForward",),
    "mindgrpo.models.weights": ("CheckpointMismatchError", "checkpoint_files", "hf_parameters", "hf_to_ms_name",
                                "load_hf_weights", "load_state_dict_hf", "ms_to_hf_name", "state_dict_hf",
                                "sync_weights"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'mindgrpo.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # the next lookup is an ordinary one
    return value
