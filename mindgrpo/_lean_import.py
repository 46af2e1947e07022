"""Import MindFormers without the packages it loads only for features mindgrpo never uses.

Importing ``mindformers`` costs about 400 MB of resident memory per process on top of MindSpore, most of it in
packages pulled in at module level for things a GRPO run never calls. Two groups are avoided:

* **torch** (about 210 MB, on any machine that also has torch, e.g. with our test extras): MindFormers imports
  tensorboardX, whose writer does ``import torch`` only to recognise torch tensors. tensorboardX's two torch
  probes are imported while ``import torch`` fails, so they fall back to numpy; torch stays importable afterwards.
* **Deferred packages** (about 117 MB): ``nltk`` (which loads scipy.stats), ``jieba`` and ``rouge_chinese`` for
  MindFormers' BLEU/ROUGE metrics, ``datasets`` (pandas, pyarrow, aiohttp) for its Hugging Face data loader, and
  ``boto3`` for tensorboardX's S3 writer. While MindFormers imports, these names resolve to stand-ins that import
  the real package on first use, so every MindFormers feature still works. When the import is done the stand-ins
  leave ``sys.modules``: anyone importing these packages afterwards gets the real ones.

A package is deferred only when it is installed (a missing one still fails where MindFormers imports it) and not
already imported (a process that loaded it keeps it).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Iterator, Set

DEFERRED_PACKAGES = ("nltk", "jieba", "rouge_chinese", "datasets", "boto3")


def _real(module_name: str, attribute: str):
    """The real ``module_name.attribute`` (an attribute, or a submodule the package did not import itself)."""
    _FINDER.release(module_name.partition(".")[0])
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        return importlib.import_module(f"{module_name}.{attribute}")


class _DeferredAttribute:
    """What ``from package.module import name`` binds while the package is deferred: imports it on first use."""

    __slots__ = ("_module_name", "_attribute")

    def __init__(self, module_name: str, attribute: str):
        self._module_name, self._attribute = module_name, attribute

    def _resolve(self):
        return _real(self._module_name, self._attribute)

    def __call__(self, *args, **kwargs):
        return self._resolve()(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._resolve(), name)

    def __mro_entries__(self, bases):  # used as a base class at import time: nothing to save, resolve now
        return (self._resolve(),)

    def __repr__(self) -> str:
        return f"<deferred {self._module_name}.{self._attribute}>"


class _DeferredModule(types.ModuleType):
    """Stand-in for a deferred package or one of its submodules."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if _FINDER.defers(self.__name__):  # still importing MindFormers: bind a placeholder
            return _DeferredAttribute(self.__name__, name)
        return _real(self.__name__, name)  # kept by a module after the import: the real thing from now on


class _DeferringFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves :class:`_DeferredModule` stand-ins for the packages in ``packages`` while it is on ``sys.meta_path``."""

    def __init__(self) -> None:
        self.packages: Set[str] = set()

    def defers(self, module_name: str) -> bool:
        return module_name.partition(".")[0] in self.packages

    def release(self, package: str) -> None:
        """Stop deferring ``package`` and drop its stand-ins, so the next import loads the real one."""
        self.packages.discard(package)
        for name in [n for n, m in sys.modules.items() if isinstance(m, _DeferredModule)
                     and n.partition(".")[0] == package]:
            del sys.modules[name]

    def find_spec(self, fullname, path=None, target=None):
        if self.defers(fullname):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _DeferredModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []  # a package: submodule imports come back here


_FINDER = _DeferringFinder()


@contextlib.contextmanager
def _deferring(packages) -> Iterator[None]:
    _FINDER.packages = {p for p in packages if p not in sys.modules and importlib.util.find_spec(p) is not None}
    sys.meta_path.insert(0, _FINDER)
    try:
        yield
    finally:
        sys.meta_path.remove(_FINDER)
        for package in list(_FINDER.packages):
            _FINDER.release(package)


def _import_tensorboardx_without_torch() -> None:
    """tensorboardX's torch probes (``writer`` and ``x2num``), imported while ``import torch`` fails."""
    if "torch" in sys.modules or "tensorboardX" in sys.modules:
        return  # the process already chose; keep it
    sys.modules["torch"] = None  # the import system's "known missing" marker: ``import torch`` raises ImportError
    try:
        import tensorboardX.writer  # noqa: F401
        import tensorboardX.x2num  # noqa: F401
    except ImportError:
        pass  # tensorboardX not installed: MindFormers reports that itself
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


@contextlib.contextmanager
def lean_mindformers_import() -> Iterator[None]:
    """Wrap the imports that load MindFormers (see the module docstring).

    MindSpore is imported first because its generated protobuf modules must load before tensorboardX's. Once
    MindFormers is in ``sys.modules`` (imported, or importing in an enclosing call) this does nothing.
    """
    if "mindformers" in sys.modules:
        yield
        return
    import mindspore  # noqa: F401

    with _deferring(DEFERRED_PACKAGES):
        _import_tensorboardx_without_torch()
        yield
