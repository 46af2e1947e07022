"""``python -m mindgrpo COMMAND`` (installed as ``mindgrpo COMMAND``).

Commands:
  doctor        check Python, MindSpore/MindFormers, the device, the fused op, msrun, the master port, folders,
                and with --config every path and the parallel layout
  config-help   every config key with its type, default and documentation
  plan          per-rank memory of each data x model parallel layout for a config, and the one that fits
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence


def _doctor(argv: Sequence[str]) -> int:
    from mindgrpo.apps.doctor import main

    return main(argv)


def _plan(argv: Sequence[str]) -> int:
    from mindgrpo.apps.plan import main

    return main(argv)


def _config_help(argv: Sequence[str]) -> int:
    if argv:
        print(f"error: config-help takes no arguments, got {' '.join(argv)}", file=sys.stderr)
        return 2
    from mindgrpo.config import describe

    print("\n".join(describe()))
    return 0


COMMANDS = {"doctor": _doctor, "config-help": _config_help, "plan": _plan}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}; choose one of {', '.join(COMMANDS)} "
              "(python -m mindgrpo --help)", file=sys.stderr)
        return 2
    return COMMANDS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
