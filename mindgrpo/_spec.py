"""Import what a ``package.module:attr.path`` spec names: user verifiers and user tools are given this way."""
from __future__ import annotations

import difflib
import importlib
from typing import Type


def import_spec(spec: str, kind: str, error: Type[Exception]) -> object:
    """The object ``spec`` names; ``error`` (a one-line message naming the ``kind`` and the spec) when it cannot be
    imported: a malformed spec, a missing module, one that fails to import, or a missing attribute."""
    module_name, _, attr_path = spec.partition(":")
    if not module_name.strip() or not attr_path.strip():
        raise error(f"{kind} spec {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise error(f"{kind} spec {spec!r}: module {module_name!r} not found; check the spelling and that its "
                        "folder is on PYTHONPATH") from exc
        raise error(f"{kind} spec {spec!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:  # a broken user module: say which spec pulled it in
        raise error(f"{kind} spec {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    target: object = module
    for part in attr_path.split("."):
        if not hasattr(target, part):
            close = difflib.get_close_matches(part, [n for n in dir(target) if not n.startswith("_")], n=3)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise error(f"{kind} spec {spec!r}: {module_name!r} has no attribute {attr_path!r}.{hint}")
        target = getattr(target, part)
    return target
