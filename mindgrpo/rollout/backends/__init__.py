"""Rollout engines, one module each: ``native`` (the default), ``mindformers`` and ``vllm`` (Ascend only)."""
