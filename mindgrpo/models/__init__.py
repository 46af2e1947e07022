"""Qwen2.5 models: build from a Hugging Face folder, strict weight loading, export back, weight sync.

Every MindFormers import in mindgrpo is in this package or reaches it through this package, so it is imported
once, here, without the packages it loads only for features mindgrpo never uses (see
:mod:`mindgrpo._lean_import`).
"""
from mindgrpo._lean_import import lean_mindformers_import

with lean_mindformers_import():
    from mindgrpo.models.export import export_hf
    from mindgrpo.models.hf_config import (ModelConfigError, Qwen2Spec, qwen2_spec, read_generation_config,
                                           read_hf_config)
    from mindgrpo.models.qwen2 import ROLES, Qwen2CausalLM, build_model
    from mindgrpo.models.packed_prompt import PackedPromptForward
    from mindgrpo.models.shared_prompt import SharedPromptForward
    from mindgrpo.models.weights import (CheckpointMismatchError, checkpoint_files, hf_parameters, hf_to_ms_name,
                                         load_hf_weights, load_state_dict_hf, ms_to_hf_name, state_dict_hf,
                                         sync_weights)
