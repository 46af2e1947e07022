"""`import mindgrpo` (and building a model) is quiet and leaves the user's working directory untouched."""
import subprocess
import sys

import pytest


def test_import_is_quiet_and_writes_nothing_to_cwd(tmp_path, tiny_model_dir):
    code = ("import mindgrpo\nfrom mindgrpo.models import build_model\n"
            f"model = build_model({str(tiny_model_dir)!r}, role='reference')\nprint('built')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "built", done.stdout
    assert "WARNING" not in done.stderr, done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_import_does_not_load_mindspore():
    code = "import sys, mindgrpo, mindgrpo.config, mindgrpo.rewards; print('mindspore' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


def test_mindformers_is_imported_without_torch_and_torch_stays_usable():
    """MindFormers' tensorboardX would import torch (about 210 MB of RSS) only to recognise torch tensors."""
    pytest.importorskip("torch")
    code = ("import sys, mindgrpo.models\nprint('torch' in sys.modules, 'mindformers' in sys.modules)\n"
            "import torch, tensorboardX.writer\nfrom transformers.utils import is_torch_available\n"
            "print(float(torch.ones(2).sum()), is_torch_available(), tensorboardX.writer.numpy_compatible.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "2.0", "True", "ndarray"], done.stdout
