"""``python -m mindgrpo.ops``: compile the CPU kernels (the fused loss, the decode step and the head log-probs) into the cache, or, with
``--ascend``, build and install the Ascend C operators (Ascend hosts with CANN only; see mindgrpo.ops.ascend)."""
import argparse
import sys

from mindgrpo.ops import ascend, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mindgrpo.ops", description=f"{__doc__}\n\n{build.__doc__}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="recompile even when the cached libraries are current")
    parser.add_argument("--ascend", action="store_true",
                        help="build and install the Ascend C operators instead (needs CANN; Ascend hosts only)")
    parser.add_argument("--cann-path", help="CANN toolkit folder (default: $ASCEND_HOME_PATH)")
    parser.add_argument("--install-path", help="OPP folder to install the Ascend operators into "
                                               "(default: $ASCEND_OPP_PATH)")
    args = parser.parse_args(argv)
    try:
        if args.ascend:
            ascend.build_ascend_package(args.cann_path, args.install_path)
            print("installed the mindgrpo Ascend C operators (vendor 'mindgrpo')")
        else:
            for source in build.SOURCES:
                print(build.build_cpu_kernel(source, force=args.force))
    except build.KernelBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
