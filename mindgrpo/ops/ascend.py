"""Everything in mindgrpo's Python that runs only on Ascend NPUs, in one place. **None of it has ever run**: mindgrpo
is developed and tested on CPU-only machines, where vllm-mindspore does not import and CANN cannot be installed.

The rest of mindgrpo calls into this module and nothing else reaches for Ascend-only packages or tools:

* :data:`ASCEND_ONLY`: the features that exist only on Ascend (``python -m mindgrpo doctor`` prints it on CPU,
  docs/ascend.md names the same).
* :func:`import_vllm`: vllm-mindspore, the engine of the ``vllm`` rollout backend
  (:mod:`mindgrpo.rollout.backends.vllm`). It is an optional extra (``pip install mindgrpo[ascend]``), imported only
  when that backend is chosen, and its absence is an error that names the package and the alternative.
* :func:`token_loss_route`: the fused GRPO loss's Ascend C operators (``kernels/ascend``) as aclnn custom ops;
  :mod:`mindgrpo.ops.token_loss` takes this route when the device target is ``Ascend``.
* :func:`build_ascend_package`: builds and installs those operators with MindSpore's ``custom_compiler`` and the
  CANN toolkit (``python -m mindgrpo.ops --ascend``).

What is verified, and where (all on CPU):

* ``tests/test_rollout.py``: the ``vllm`` backend's error when vllm-mindspore is missing (:func:`import_vllm`).
* ``tests/test_resharding.py``: the ``vllm`` backend's weight sync, resharded into a fake network laid out as
  vllm-mindspore's Qwen2.
* ``tests/test_fused_loss.py``: the CPU kernel that the Ascend C operators mirror (the same per-token math,
  ``kernels/grpo_token_loss_cpu.cc``), against the plain-ops loss and TRL's numbers.
* Not verified anywhere: the Ascend C sources, their registration below, the operator build, vLLM's
  ``LLM.generate`` and everything of the ``vllm`` backend past its import. Treat a first Ascend run as a bring-up.

The ``ascend`` extra also installs mindspore-gs and msadapter for MindRLHF-style environments; mindgrpo imports
neither. Settings that matter on Ascend but are not Ascend-only code (bfloat16 compute, tensor parallelism, the
device target) are checked by :mod:`mindgrpo.config` and run on CPU too.
"""
from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Tuple

from mindgrpo.ops.build import KERNEL_DIR, KernelBuildError

ASCEND_ONLY: Tuple[str, ...] = (
    "vllm rollout backend (vllm-mindspore, never run here)",
    "the Ascend C fused-loss kernel",
    "bfloat16 compute (tensor parallelism and ZeRO-1 run on CPU too)",
)
ASCEND_SOURCE_DIR = KERNEL_DIR / "ascend"
MISSING_VLLM = ("the 'vllm' rollout backend needs the vllm-mindspore package, which runs only on Ascend NPUs "
                "(it does not import on CPU machines); install it on an Ascend machine with "
                "`pip install mindgrpo[ascend]`, or choose the 'native' backend")


def vllm_installed() -> bool:
    """Whether vllm-mindspore is installed, without importing it (its import fails off Ascend)."""
    return importlib.util.find_spec("vllm_mindspore") is not None


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


# ----------------------------------------------------------------------------------------------------------------
# The fused GRPO loss as Ascend C operators (kernels/ascend), called through aclnn

# No batch_means output: the Ascend kernel splits rows over AI cores and has no cross-core reduction, so
# mindgrpo.ops.token_loss reduces it from row_stats with MindSpore ops.
LOSS_OUTPUTS = ("row_loss", "row_stats", "token_grad")


def _reg_info(name: str, inputs: Tuple[str, ...], outputs: Tuple[str, ...]) -> dict:
    from mindspore.ops import CustomRegOp, DataType  # noqa: PLC0415  (keeps this module free of MindSpore)

    reg = CustomRegOp(name)
    for i, arg in enumerate(inputs):
        reg = reg.input(i, arg, "required")
    for i, arg in enumerate(outputs):
        reg = reg.output(i, arg, "required")
    return reg.dtype_format(*([DataType.F32_Default] * (len(inputs) + len(outputs)))).target("Ascend").get_op_info()


def token_loss_route(inputs: Tuple[str, ...], row_stats: int
                     ) -> Tuple[str, str, dict, dict, Tuple[str, ...], Callable, Callable]:
    """The Ascend route of :func:`mindgrpo.ops.token_loss.fused_token_loss` (``inputs``: the forward's input
    names; ``row_stats``: the columns of its ``row_stats`` output): the forward and backward operator names, their
    registrations, the forward's outputs (:data:`LOSS_OUTPUTS`) and its shape and dtype functions. The operators
    must have been installed on this host with :func:`build_ascend_package`."""
    def forward_shapes(logp, old, ref, adv, mask, hyper):
        return [logp[0]], [logp[0], row_stats], logp

    def forward_dtypes(logp, old, ref, adv, mask, hyper):
        return logp, logp, logp

    forward, backward = "aclnnGrpoTokenLoss", "aclnnGrpoTokenLossGrad"
    return (forward, backward, _reg_info(forward, inputs, LOSS_OUTPUTS),
            _reg_info(backward, ("token_grad", "d_row_loss"), ("d_logp",)), LOSS_OUTPUTS, forward_shapes,
            forward_dtypes)


def build_ascend_package(cann_path: str | None, install_path: str | None) -> None:
    """Build and install the Ascend C operators with MindSpore's ``custom_compiler`` tool.

    Needs the CANN toolkit (Ascend hosts only): it cannot run on the CPU-only development machines. The tool is
    copied into a temporary folder first, because it builds its project next to its own script.
    """
    import mindspore  # noqa: PLC0415  (only this command needs MindSpore's install location)

    tool = Path(mindspore.__file__).resolve().parent / "lib" / "plugin" / "ascend" / "custom_compiler"
    if not tool.is_dir():
        raise KernelBuildError(f"MindSpore's custom_compiler tool not found at {tool}")
    cann = cann_path or os.environ.get("ASCEND_HOME_PATH")
    if not cann or not Path(cann).is_dir():
        raise KernelBuildError("Ascend build needs the CANN toolkit: pass --cann-path or set ASCEND_HOME_PATH "
                               "(this is only possible on an Ascend host).")
    with tempfile.TemporaryDirectory(prefix="mindgrpo-ascend-") as work:
        shutil.copytree(tool, Path(work) / "custom_compiler")
        cmd = [sys.executable, "setup.py", "--op_host_path", str(ASCEND_SOURCE_DIR / "op_host"),
               "--op_kernel_path", str(ASCEND_SOURCE_DIR / "op_kernel"), "--vendor_name", "mindgrpo",
               "--ascend_cann_package_path", cann]
        if install_path:
            cmd += ["--install_path", install_path]
        cmd.append("-i")
        proc = subprocess.run(cmd, cwd=Path(work) / "custom_compiler", capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            log = Path(work) / "custom_compiler" / "build.log"
            detail = log.read_text(errors="replace") if log.exists() else proc.stdout + proc.stderr
            raise KernelBuildError(f"Ascend operator build failed.\ncommand: {shlex.join(cmd)}\n{detail.strip()}")
