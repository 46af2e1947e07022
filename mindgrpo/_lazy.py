"""Package attributes imported on first use (PEP 562): a package can name its API without importing MindSpore."""
from __future__ import annotations

import importlib
import sys
from typing import Callable, Mapping


def lazy_attributes(package: str, sources: Mapping[str, str]) -> Callable[[str], object]:
    """A module-level ``__getattr__`` for ``package``: ``sources`` maps each attribute to the module defining it,
    imported on the first access; the value is then cached on the package."""
    def __getattr__(name: str) -> object:
        if name not in sources:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(sources[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
