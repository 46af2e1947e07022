"""`import mindgrpo` (and building a model) is quiet and leaves the user's working directory untouched."""
import subprocess
import sys

import pytest


def run_python(code: str, *, timeout: int = 300, cwd=None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (imports measured from nothing); it must exit 0."""
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_import_is_quiet_and_writes_nothing_to_cwd(tmp_path, tiny_model_dir):
    code = ("import mindgrpo\nfrom mindgrpo.models import build_model\n"
            f"model = build_model({str(tiny_model_dir)!r}, role='reference')\nprint('built')\n")
    done = run_python(code, cwd=tmp_path)
    assert done.stdout.strip() == "built", done.stdout
    assert "WARNING" not in done.stderr, done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_import_does_not_load_mindspore():
    code = "import sys, mindgrpo, mindgrpo.config, mindgrpo.rewards; print('mindspore' in sys.modules)"
    done = run_python(code, timeout=120)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


def test_reading_a_model_config_loads_no_mindformers(tiny_model_dir):
    """The preflight reads every model's config.json before anything is built, and mindgrpo's model and trainer
    run without MindFormers: neither may cost its import (seconds). Only the mindformers rollout backend's model
    brings it."""
    code = ("import sys\nfrom mindgrpo.hf_config import qwen2_spec, read_hf_config\n"
            f"spec = qwen2_spec(read_hf_config({str(tiny_model_dir)!r}))\n"
            "print(spec.num_hidden_layers > 0, 'mindformers' in sys.modules)\n"
            "from mindgrpo.models import build_model\nfrom mindgrpo.train.trainer import GRPOTrainer\n"
            f"build_model({str(tiny_model_dir)!r})\nprint('mindformers' in sys.modules)\n"
            "from mindgrpo.models import build_mindformers_model\nprint('mindformers' in sys.modules)\n")
    done = run_python(code)
    assert done.stdout.split() == ["True", "False", "False", "True"], done.stdout


def test_mindformers_is_imported_without_torch_and_torch_stays_usable():
    """MindFormers' tensorboardX would import torch (about 210 MB of RSS) only to recognise torch tensors."""
    pytest.importorskip("torch")
    code = ("import sys\nfrom mindgrpo.models import build_mindformers_model\n"
            "print('torch' in sys.modules, 'mindformers' in sys.modules)\n"
            "import torch, tensorboardX.writer\nfrom transformers.utils import is_torch_available\n"
            "print(float(torch.ones(2).sum()), is_torch_available(), tensorboardX.writer.numpy_compatible.__name__)")
    done = run_python(code)
    assert done.stdout.split() == ["False", "True", "2.0", "True", "ndarray"], done.stdout


def test_packages_mindformers_loads_for_unused_features_are_deferred_until_used():
    """nltk, datasets, jieba, rouge_chinese and boto3 (about 117 MB of RSS) load only when MindFormers uses them."""
    from mindgrpo._lean_import import DEFERRED_PACKAGES
    code = ("import sys\nfrom mindgrpo.models import build_mindformers_model\n"
            "import mindformers.core.metric.metric as metric\n"
            "import mindformers.dataset.dataloader.hf_dataloader as loader\n"
            f"print(sorted(p for p in {DEFERRED_PACKAGES!r} if p in sys.modules))\n"
            "print(metric.sentence_bleu([list('abcd')], list('abcd')))\n"
            "import datasets, datasets.distributed, nltk\n"
            "print(loader.datasets.Dataset is datasets.Dataset, nltk.translate.bleu_score.__name__)\n"
            "print(loader.split_dataset_by_node.__code__ is datasets.distributed.split_dataset_by_node.__code__)\n")
    done = run_python(code)
    assert done.stdout.splitlines() == ["[]", "1.0", "True nltk.translate.bleu_score", "True"], done.stdout


def test_deferred_package_imports_on_first_use_and_is_real_afterwards(tmp_path, monkeypatch):
    from mindgrpo._lean_import import _DeferredAttribute, _DeferredModule, _deferring
    package = tmp_path / "heavy_fake_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import sys\nsys.heavy_fake_pkg_loads = getattr(sys, 'heavy_fake_pkg_loads', 0) + 1\nVALUE = 7\n")
    (package / "sub" / "__init__.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "user_of_heavy.py").write_text("import heavy_fake_pkg\nfrom heavy_fake_pkg.sub import double\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delattr(sys, "heavy_fake_pkg_loads", raising=False)
    with _deferring(["heavy_fake_pkg", "not_installed_pkg"]):
        import user_of_heavy
        assert not hasattr(sys, "heavy_fake_pkg_loads")
        with pytest.raises(ImportError):  # a missing package is not hidden behind a stand-in
            import not_installed_pkg  # noqa: F401
    assert isinstance(user_of_heavy.heavy_fake_pkg, _DeferredModule)
    assert isinstance(user_of_heavy.double, _DeferredAttribute)
    assert "heavy_fake_pkg" not in sys.modules
    assert user_of_heavy.double(21) == 42
    assert user_of_heavy.heavy_fake_pkg.VALUE == 7
    import heavy_fake_pkg
    assert not isinstance(heavy_fake_pkg, _DeferredModule) and heavy_fake_pkg.VALUE == 7
    assert sys.heavy_fake_pkg_loads == 1
    for name in ("user_of_heavy", "heavy_fake_pkg", "heavy_fake_pkg.sub"):
        sys.modules.pop(name, None)


def test_config_and_the_parallel_runtime_import_nothing_of_models():
    """config (the leaf) and the parallel runtime never import mindgrpo.models, not even inside a function, and the
    parallel runtime imports no MindFormers: a layout check reads config.json and TPLayout only."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "mindgrpo"
    files = [*sorted((package / "config").glob("*.py")), *sorted((package / "parallel").glob("*.py")),
             package / "hf_config.py"]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith("mindgrpo.models"), f"{path.name} imports {name}"
                assert not name.startswith("mindformers"), f"{path.name} imports {name}"


def test_checking_a_layout_against_config_json_loads_no_model_code(tiny_model_dir):
    code = ("import sys\nfrom mindgrpo.config import GRPOConfig\nfrom mindgrpo.config.validate import validate\n"
            f"c = GRPOConfig(); c.actor_config.load = {str(tiny_model_dir)!r}\n"
            "c.generate_config.backend = 'vllm'; c.generate_config.parallel_config.model_parallel = 3\n"
            "try:\n    validate(c, check_paths=False)\n"
            "except ValueError as err:\n    print('refused' if 'cannot split' in str(err) else err)\n"
            "print('mindgrpo.models' in sys.modules, 'mindformers' in sys.modules, 'mindspore' in sys.modules)\n")
    done = run_python(code, timeout=120)
    assert done.stdout.split() == ["refused", "False", "False", "False"], done.stdout
