"""Process-wide settings applied before MindSpore or MindFormers is imported.

MindFormers creates ``./output/log`` in the caller's working directory and prints a screen of
warnings on import (optional models it cannot load on CPU). A library must not litter the user's
folder or bury their output, so we point its log folder at a per-user cache and keep only errors
on the console. Users who want the full logs set ``MINDGRPO_VERBOSE=1`` (or their own ``GLOG_v`` /
``LOG_MF_PATH``, which we never override).
"""
import logging
import os
import tempfile
import warnings

_CONFIGURED = False


def cache_dir() -> str:
    """Folder for mindgrpo's own caches (compiled kernels, MindFormers logs)."""
    root = os.environ.get("MINDGRPO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "mindgrpo")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:  # read-only home: fall back to the temp folder rather than failing an import
        root = os.path.join(tempfile.gettempdir(), f"mindgrpo-{os.getuid() if hasattr(os, 'getuid') else 'user'}")
        os.makedirs(root, exist_ok=True)
    return root


class _OnlyErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def _one_line_for_mindgrpo(plain):
    """mindgrpo's own warnings (a config key with no effect, a renamed key, a checkpoint skipped) speak to the user
    about their run: print each as one ``warning: ...`` line instead of a location in mindgrpo's source followed by
    that source line. Every other warning keeps Python's format."""
    def format_warning(message, category, filename, lineno, line=None):
        if category.__module__.split(".")[0] == "mindgrpo":
            return f"warning: {message}\n"
        return plain(message, category, filename, lineno, line)
    return format_warning


def configure() -> None:
    """Set log locations and verbosity once per process; idempotent."""
    global _CONFIGURED
    if _CONFIGURED:
        return
    _CONFIGURED = True
    warnings.formatwarning = _one_line_for_mindgrpo(warnings.formatwarning)
    verbose = os.environ.get("MINDGRPO_VERBOSE", "") not in ("", "0")
    if not verbose:
        os.environ.setdefault("GLOG_v", "3")  # MindSpore C++ and Python logger: errors only
    log_root = os.path.join(cache_dir(), "mindformers")
    os.environ.setdefault("LOCAL_DEFAULT_PATH", log_root)
    os.environ.setdefault("LOG_MF_PATH", os.path.join(log_root, "log"))
    # GRAPH compile failures dump analyze_fail.ir under ./rank_0/om unless MS_OM_PATH points elsewhere.
    os.environ.setdefault("MS_OM_PATH", os.path.join(cache_dir(), "mindspore"))
    if not verbose:
        # MindFormers names its logger "mindformers" + log path and resets its level on first use; a
        # filter on the logger object itself survives that and applies to handlers added later.
        name = "mindformers" + os.path.expanduser(os.environ["LOG_MF_PATH"])
        logging.getLogger(name).addFilter(_OnlyErrors())
