"""`T.finalize_reducer` (tile op `tl.finalize_reducer`) lowered to plain TIR for Metal.

After `ReducerPlanAndMaterialize`, a reducer is a fragment whose replicas hold partial values;
finalizing all-reduces each element across the replicas, so every replica ends with the total.
The collective plan is either explicit (pairs `(reducing_threads, scale)` after the op code:
butterfly masks `reducing_threads / 2, ..., scale`) or the default: every thread of the layout
(replicate extent == thread extent), masks `extent / 2, ..., 1`. The exchange itself is the one
`T.reduce` uses (simd shuffles within a simdgroup, threadgroup memory across simdgroups, with its
own barriers when ThreadSync is off); an
optional `seed` (the reducer's logical start value) is combined once per element at the end.
"""

from __future__ import annotations

from typing import Any

from ..host import FragmentView, tir
from ..errors import MetalLoweringError
from .reduce import SIMD_WIDTH, Exchange, ReducePlan, combine, exchange_partials, fenced, is_power_of_two, linear_index, parallel_nest

REDUCER_KINDS = ("sum", "max", "min", "bitand", "bitor", "bitxor")  # tilelang's ReducerV2OpType order


def butterfly_masks(reducing_threads: int, scale: int) -> list[int]:
    """Masks of one AllReduce step over `reducing_threads` threads at stride `scale`."""
    if not (is_power_of_two(reducing_threads) and is_power_of_two(scale)) or reducing_threads < scale:
        raise MetalLoweringError(
            f"T.finalize_reducer: a step over {reducing_threads} threads at stride {scale} is not a power-of-two butterfly; "
            "pad the reducer's non-reduced extent to a power of two"
        )
    masks, m = [], reducing_threads // 2
    while m >= scale:
        masks.append(m)
        m //= 2
    return sorted(masks)


def lower_finalize_reducer(
    reducer: Any,
    view: FragmentView,
    kind_code: int,
    steps: list[tuple[int, int]] | None,
    seed: Any,
    tx: Any,
    block_threads: int,
    layout_attr: str,
    own_barriers: bool = False,
) -> tuple[Any, list[Any]]:
    """The TIR of one `T.finalize_reducer` and the buffers it allocates; with `own_barriers`, the
    barriers of its threadgroup exchange (ThreadSync is off)."""
    kind = REDUCER_KINDS[kind_code]
    if steps is None:
        if view.replicate == 1:
            steps = []
        elif view.replicate == view.thread_extent:
            steps = [(view.replicate, 1)]
        else:
            raise MetalLoweringError(
                f"T.finalize_reducer({reducer.name}): replicated {view.replicate}x over {view.thread_extent} threads; "
                "a default reducer must be replicated over every thread"
            )
    masks = sorted({m for threads, scale in steps for m in butterfly_masks(threads, scale)})
    if view.thread_min % SIMD_WIDTH:
        raise MetalLoweringError(f"T.finalize_reducer({reducer.name}): its threads must start at a simdgroup boundary")
    plan = ReducePlan([], [], [m for m in masks if m < SIMD_WIDTH], [m for m in masks if m >= SIMD_WIDTH], False)
    count = 1
    for n in view.local_shape:
        count *= n
    part = tir.decl_buffer((count,), str(reducer.dtype), reducer.name + "_part", scope="local")
    tx_rel = tx - view.thread_min if view.thread_min else tx

    def load(ivars: list[Any]) -> Any:
        return tir.BufferStore(part, tir.BufferLoad(reducer, ivars), [linear_index(view, ivars)])

    def store(ivars: list[Any]) -> Any:
        value: Any = tir.BufferLoad(part, [linear_index(view, ivars)])
        if seed is not None:
            value = combine(kind, value, seed)
        return tir.BufferStore(reducer, value, ivars)

    stmts = [parallel_nest(view, load, layout_attr)]
    exchange = Exchange(kind, [], [], plan)
    more, scratch = exchange_partials(part, count, exchange, tx, tx_rel, block_threads, view.threads_used, reducer.name, own_barriers)
    stmts += more
    stmts.append(parallel_nest(view, store, layout_attr))
    return tir.SeqStmt(fenced(stmts, scratch, own_barriers)), [part, *scratch]
