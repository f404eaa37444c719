"""What the attention kernels (kernels/attention.py) use to mask keys: the finite score of a masked
key, the mask argument's dtype, and the marking that lets a boolean mask be read once per (query,
key) element and key block.

A boolean mask is device memory: `online_softmax_step` reads it in its first loop only, writing
MASKED_SCORE into the score of every key it hides, and its second loop finds those keys by that
value (`was_visible`) instead of reading the mask again (issue 35: each mask byte was read twice);
the vector decoding kernel marks its one score per key the same way.
A visible key whose own score is exactly MASKED_SCORE takes the next float up
(`score_or_masked`), so MASKED_SCORE in the scores means "masked" and nothing else; at that
magnitude one ulp changes no probability a finite computation can tell apart.
"""

from typing import Any

import tilelang.language as T

# The score a masked key takes for the row maximum, the starting row maximum and the log-sum-exp
# of a decoding split with no key: the lowest finite float32, not -inf, because under Metal's fast
# math (MTLMathModeFast, the default of MTLCompileOptions) the compiler may assume no infinities.
# It is only ever a lower bound, never a marker of the position: every finite score is >= it, so it
# never outranks a key (a finite sentinel such as -1e38 did: real scores below it came out 0); masked
# keys get probability 0 from their position or (boolean masks) from the mark below, and "no key
# with a finite score yet" is a denominator of 0. A real split's log-sum-exp is >= log2(1) + score *
# scale > MASKED_SCORE (scale <= log2(e) / sqrt(8) < 1), so the combine weighs a split with no key by
# exactly 0.
MASKED_SCORE = -3.4028234663852886e38
# The float32 just above MASKED_SCORE: where a visible key's score goes when it is exactly MASKED_SCORE.
LOWEST_VISIBLE_SCORE = -3.4028232635611926e38
MASKS = (None, "additive", "bool")


def mask_element_type(mask: str | None, dtype: str) -> str:
    """The mask argument's element type: torch's attn_mask is bool, or the query's dtype (additive)."""
    return "bool" if mask == "bool" else dtype


def score_or_masked(visible: Any, score: Any) -> Any:
    """A key's entry in the scores when masked keys are marked there: its score if `visible` (moved
    off MASKED_SCORE; NaN and -inf stay as they are), MASKED_SCORE if not."""
    return T.if_then_else(visible, T.if_then_else(score == MASKED_SCORE, LOWEST_VISIBLE_SCORE, score), MASKED_SCORE)


def was_visible(marked_score: Any) -> Any:
    """Whether a key marked by `score_or_masked` was visible (reads no mask)."""
    return marked_score != MASKED_SCORE
