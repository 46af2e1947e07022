"""The additive attention bias every attention in mindgrpo's models adds to masked scores: the decoder's passes,
the native rollout engine's graphs and the vision tower's window and frame attention."""
from __future__ import annotations

from mindspore import Tensor

# Added to the scores of masked keys. Finite on purpose: a query with no visible key (a left-pad row) then gets
# finite garbage instead of NaN, and NaN in a pad row would reach real rows through 0 * NaN in the value product.
# -1e4 fits float16 and leaves exp(score - 1e4) == 0 in every dtype for realistic scores.
MASKED_SCORE = -1e4


def mask_bias(allowed: Tensor) -> Tensor:
    """The additive attention bias of a float32 may-attend mask (1 = attend): 0 where allowed, else MASKED_SCORE."""
    return (allowed - 1.0) * (-MASKED_SCORE)
