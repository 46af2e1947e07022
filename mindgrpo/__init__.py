"""mindgrpo: GRPO fine-tuning of Qwen2.5 on MindSpore."""
from mindgrpo import _env

_env.configure()

__version__ = "0.1.0"
