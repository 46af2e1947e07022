"""``python -m mindgrpo.ops``: compile the fused-loss CPU kernel into the cache (or, with --ascend, the Ascend ops)."""
import sys

from mindgrpo.ops.build import main

sys.exit(main())
