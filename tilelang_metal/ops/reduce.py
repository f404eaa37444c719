"""`T.reduce_*` (tile op `tl.reduce`) lowered to plain TIR for Metal.

TileLang's layout inference gives the source fragment a register layout: element `(.., r, ..)`
lives on thread `T(.., r, ..)`. The reduced axis `r` splits into *thread digits* (parts of `r`
that select the thread: `(r // lf) % e` contributes `s * digit` to the thread index) and *local
digits* (parts each thread walks through itself). The lowering:

1. local: every thread folds the source elements it holds for each destination element it owns
   (a parallel loop over the destination, partitioned by LowerTileOp with the destination layout;
   threads outside the source layout hold nothing and skip it);
2. within a simdgroup: a butterfly of `simd_shuffle_xor` over the thread digits whose lanes are in
   the same simdgroup (`simd_sum` / `simd_max` / `simd_min` when the group is the whole simdgroup);
3. across simdgroups (thread digits >= 32 lanes apart, or digits that are not powers of two): each
   thread publishes its partial in threadgroup memory and reads its peers' in one fixed order, so
   every replica computes bitwise the same value. ThreadSync places the barriers (including the
   write-after-read one when the reduction sits in a loop and reuses its scratch); when a kernel
   turns ThreadSync off (`tl.disable_thread_storage_sync`, kernels that place their own
   `T.sync_threads`), the lowering places them itself (`own_barriers`): one before the op, one
   between publishing and gathering, one after it (the scratch may share memory with other buffers
   once tilelang merges the allocations);
4. the destination owners (all replicas) store the result, combined with the old value when
   `clear=False`.

fp16 / bf16 inputs accumulate in float32; the result is cast at the store.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ..host import FragmentView, IterSplit, fragment_view, iter_splits, make_replicated_fragment, tir, tvm
from ..errors import MetalLoweringError
from ..target.isa import SIMD_WIDTH
from ..transform.barriers import storage_sync

KINDS = ("sum", "abssum", "max", "min", "absmax", "bitand", "bitor", "bitxor")
SIMD_COLLECTIVE = {
    "sum": "simd_sum",
    "abssum": "simd_sum",
    "max": "simd_max",
    "absmax": "simd_max",
    "min": "simd_min",
    "bitand": "simd_and",
    "bitor": "simd_or",
    "bitxor": "simd_xor",
}


# ------------------------------------------------------------------------------ pure helpers
def complement_digits(thread_digits: list[tuple[int, int]], extent: int) -> list[tuple[int, int]]:
    """The (lower_factor, extent) digits of `range(extent)` not covered by `thread_digits`
    (each also `(lower_factor, extent)`), lowest first. Raises ValueError when the thread digits
    do not form a mixed-radix split of the range."""
    local: list[tuple[int, int]] = []
    covered = 1
    for lower, size in sorted(thread_digits):
        if lower % covered:
            raise ValueError(f"thread digit (//{lower} %{size}) overlaps the digits below it")
        if lower > covered:
            local.append((covered, lower // covered))
        covered = lower * size
    if extent % covered:
        raise ValueError(f"thread digits span {covered}, which does not divide the reduced extent {extent}")
    if extent > covered:
        local.append((covered, extent // covered))
    return local


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def xor_masks(thread_digits: list[tuple[int, int]]) -> list[int] | None:
    """Butterfly masks for thread digits given as (scale, extent), or None when a scale or extent
    is not a power of two (the butterfly needs the digits to be bit fields of the thread index)."""
    masks: list[int] = []
    for scale, size in thread_digits:
        if not (is_power_of_two(scale) and is_power_of_two(size)):
            return None
        bit = 1
        while bit < size:
            masks.append(scale * bit)
            bit *= 2
    return sorted(masks)


def peer_offsets(thread_digits: list[tuple[int, int]]) -> list[int]:
    """Thread-index offsets of every member of a reduction group from its first member, for
    digits (scale, extent); in increasing order, the order partials are combined in."""
    offsets = [0]
    for scale, size in thread_digits:
        offsets = [o + scale * d for o in offsets for d in range(size)]
    return sorted(offsets)


@dataclass(frozen=True)
class ReducePlan:
    thread_digits: list[IterSplit]  # splits of the reduced variable inside the thread index
    local_digits: list[tuple[int, int]]  # (lower_factor, extent) walked by each thread
    simd_masks: list[int]  # xor masks combined with simd shuffles
    cross_masks: list[int]  # xor masks combined through threadgroup memory
    gather: bool  # digits are not bit fields: combine every peer through threadgroup memory

    @property
    def local_count(self) -> int:
        count = 1
        for _, size in self.local_digits:
            count *= size
        return count

    @property
    def needs_threadgroup_memory(self) -> bool:
        return self.gather or bool(self.cross_masks)


def plan_reduce(src: FragmentView, dim: int) -> ReducePlan:
    """Split the reduced axis of `src` into thread digits and local digits (see module doc)."""
    ranges = {v: tvm.ir.Range(0, n) for v, n in zip(src.vars, src.shape)}
    ranges[src.rep_var] = tvm.ir.Range(0, max(1, src.replicate))
    normalized = iter_splits(src.thread, ranges)
    if normalized is None:
        raise MetalLoweringError(f"T.reduce: the source layout's thread map {src.thread} is not affine; copy the tile through shared memory first")
    splits, _ = normalized
    r = src.vars[dim]
    digits = [s for s in splits if s.source.same_as(r)]
    analyzer = tvm.arith.Analyzer()
    for v, rng in ranges.items():
        analyzer.bind(v, rng)
    for d in digits:
        from_thread = tvm.tirx.floormod(tvm.tirx.floordiv(src.thread, d.scale), d.extent)
        from_index = tvm.tirx.floormod(tvm.tirx.floordiv(r, d.lower_factor), d.extent)
        if not analyzer.can_prove_equal(from_thread, from_index):
            raise MetalLoweringError(
                f"T.reduce: cannot recover the reduced index from the thread index in layout {src.thread}; "
                "copy the tile through shared memory first"
            )
    try:
        local = complement_digits([(d.lower_factor, d.extent) for d in digits], src.shape[dim])
    except ValueError as err:
        raise MetalLoweringError(f"T.reduce: unsupported source layout {src.thread}: {err}") from None
    masks = xor_masks([(d.scale, d.extent) for d in digits])
    if masks is None or src.thread_min % SIMD_WIDTH:
        return ReducePlan(digits, local, [], [], True)
    return ReducePlan(digits, local, [m for m in masks if m < SIMD_WIDTH], [m for m in masks if m >= SIMD_WIDTH], False)


# ------------------------------------------------------------------------------ TIR building
def accumulator_dtype(dtype: str) -> str:
    return "float32" if str(dtype) in ("float16", "bfloat16", "float32") else str(dtype)


def identity(kind: str, dtype: str) -> Any:
    dt = tvm.DataType(dtype)
    if kind in ("sum", "abssum", "absmax", "bitor", "bitxor"):
        return tir.const(0, dtype)
    if kind == "bitand":
        return tir.const(-1, dtype) if dt.type_code == tvm.DataTypeCode.INT else tvm.tirx.max_value(dtype)
    if dt.type_code in (tvm.DataTypeCode.FLOAT, tvm.DataTypeCode.BFLOAT):
        return tir.const(float("-inf") if kind == "max" else float("inf"), dtype)
    info = (tvm.tirx.min_value if kind == "max" else tvm.tirx.max_value)(dtype)
    return info


def _is_float(dtype: str) -> bool:
    return tvm.DataType(dtype).type_code in (tvm.DataTypeCode.FLOAT, tvm.DataTypeCode.BFLOAT)


def is_seeded(kind: str, acc_dtype: str) -> bool:
    """Whether a fold of `kind` starts from its first element instead of the identity: float max /
    min / absmax, so that a line of only NaNs gives NaN (maxNum returns the non-NaN operand, so an
    identity would win) and no infinity is written."""
    return kind in ("max", "min", "absmax") and _is_float(acc_dtype)


def combine(kind: str, acc: Any, value: Any) -> Any:
    if kind in ("sum", "abssum"):
        return acc + value
    if kind in ("max", "absmax"):
        return tvm.tirx.Max(acc, value)
    if kind == "min":
        return tvm.tirx.Min(acc, value)
    bitwise = {"bitand": tvm.tirx.bitwise_and, "bitor": tvm.tirx.bitwise_or, "bitxor": tvm.tirx.bitwise_xor}
    return bitwise[kind](acc, value)


def element(kind: str, value: Any, dtype: str) -> Any:
    """A source element as the accumulator sees it (cast, absolute value for abs kinds)."""
    if str(value.dtype) != dtype:
        value = tir.Cast(dtype, value)
    if kind in ("abssum", "absmax") and not dtype.startswith("uint"):
        value = tvm.tirx.Max(value, -value)
    return value


def extern(dtype: str, name: str, *args: Any) -> Any:
    return tir.call_extern(dtype, name, *args)


def linear_index(view: FragmentView, indices: list[Any]) -> Any:
    """Row-major per-thread index of the element at `indices` under `view`."""
    subst = dict(zip(view.vars, indices))
    flat: Any = tir.const(0, "int32")
    for expr, extent in zip(view.index, view.local_shape):
        flat = flat * extent + tvm.tirx.stmt_functor.substitute(expr, subst)
    return tvm.arith.Analyzer().simplify(flat)


def parallel_nest(view: FragmentView, body_of: Any, layout_attr: str) -> Any:
    """`for idx in T.Parallel(*view.shape)` annotated with `view`'s layout (LowerTileOp partitions it)."""
    loop_vars = [tir.Var(f"red_i{k}", "int32") for k in range(len(view.shape))]
    body = body_of(loop_vars)
    for k in reversed(range(len(loop_vars))):
        annotations = {layout_attr: view.layout} if k == 0 else {}
        body = tir.For(loop_vars[k], 0, view.shape[k], tir.ForKind.PARALLEL, body, annotations=annotations)
    return body


def serial(extent: int, body_of: Any, name: str, unrolled: bool = False) -> Any:
    var = tir.Var(name, "int32")
    kind = tir.ForKind.UNROLLED if unrolled else tir.ForKind.SERIAL
    return tir.For(var, 0, extent, kind, body_of(var))


@dataclass(frozen=True)
class Exchange:
    """How the partials of one reduction group meet: `kind` of combine, the group's thread digits
    as (scale, extent) lists, and the plan's split into simd masks / cross masks / gather."""

    kind: str
    scales: list[int]
    extents: list[int]
    plan: Any  # ReducePlan (simd_masks, cross_masks, gather)


def publishing_slots(plan: Any, block_threads: int) -> tuple[int, Any, int]:
    """Threadgroup slots per element for the exchange across simdgroups, the slot of a thread, and the
    thread-index bits whose lanes share one slot. After the simd step the lanes that differ only in the
    simd masks' bits hold the same value, so only one of them needs a slot: with those bits one
    contiguous run `lo .. lo + w - 1`, thread t's slot drops them (block_threads >> w slots). Otherwise
    (no simd step, or bits that are not one run) every thread has its own slot."""
    bits = 0
    for m in plan.simd_masks:
        bits |= m
    if plan.gather or not bits:
        return block_threads, lambda t: t, 0
    lo = (bits & -bits).bit_length() - 1
    width = bin(bits).count("1")
    if bits != ((1 << width) - 1) << lo or block_threads % (1 << (lo + width)):
        return block_threads, lambda t: t, 0

    def slot_of(t: Any) -> Any:
        high = tvm.tirx.floordiv(t, 1 << (lo + width)) * (1 << lo)
        return high + tvm.tirx.floormod(t, 1 << lo) if lo else high

    return block_threads >> width, slot_of, bits


def fenced(stmts: list[Any], scratch: list[Any], own_barriers: bool) -> list[Any]:
    """`stmts` between two threadgroup barriers when they exchange data through `scratch` and the
    lowering places its own barriers: the one before orders earlier reads of that memory (the
    previous loop iteration's gather, or a buffer merged into the same bytes) before the publish,
    the one after orders the gather before later writes."""
    if not (scratch and own_barriers):
        return stmts
    return [storage_sync("shared"), *stmts, storage_sync("shared")]


def exchange_partials(
    part: Any, count: int, ex: Exchange, tx: Any, tx_rel: Any, block_threads: int, threads_used: int, name: str, own_barriers: bool = False
) -> tuple[list[Any], list[Any]]:
    """Statements combining `part[j]` (j < count) across the threads of each group, leaving the
    group's total in every member; and the threadgroup scratch they allocate. With `own_barriers`
    a barrier separates publishing from gathering (the caller fences the whole op, `fenced`)."""
    plan, kind, dtype = ex.plan, ex.kind, str(part.dtype)
    stmts: list[Any] = []
    buffers: list[Any] = []
    if plan.simd_masks:
        full = plan.simd_masks == [1, 2, 4, 8, 16] and block_threads >= SIMD_WIDTH

        def simd_step(j: Any) -> Any:
            if full:
                return tir.BufferStore(part, extern(dtype, SIMD_COLLECTIVE[kind], tir.BufferLoad(part, [j])), [j])
            steps = []
            for mask in plan.simd_masks:
                cur = tir.BufferLoad(part, [j])
                shuffled = extern(dtype, "simd_shuffle_xor", cur, tir.const(mask, "uint16"))
                steps.append(tir.BufferStore(part, combine(kind, cur, shuffled), [j]))
            return tir.SeqStmt(steps) if len(steps) > 1 else steps[0]

        stmts.append(serial(count, simd_step, "red_j"))
    if plan.needs_threadgroup_memory:
        slots, slot_of, simd_bits = publishing_slots(plan, block_threads)
        scratch = tir.decl_buffer((count * slots,), dtype, name + "_red_scratch", scope="shared.dyn")
        buffers.append(scratch)
        publish: Any = serial(count, lambda j: tir.BufferStore(scratch, tir.BufferLoad(part, [j]), [j * slots + slot_of(tx)]), "red_j")
        if simd_bits:  # the lanes the simd step combined hold one value: their first lane publishes it
            lanes = tvm.tirx.floormod(tvm.tirx.floordiv(tx, simd_bits & -simd_bits), simd_bits // (simd_bits & -simd_bits) + 1)
            publish = tir.IfThenElse(lanes == 0, publish, None)
        stmts.append(publish)
        if own_barriers:
            stmts.append(storage_sync("shared"))
        if plan.gather:
            first: Any = tx
            for scale, size in zip(ex.scales, ex.extents):
                first = first - tvm.tirx.floormod(tvm.tirx.floordiv(tx_rel, scale), size) * scale
            offsets = peer_offsets(list(zip(ex.scales, ex.extents)))
        else:
            high = 0
            for m in plan.cross_masks:
                high |= m
            first = tx - tvm.tirx.bitwise_and(tx_rel, tir.const(high, "int32"))
            offsets = peer_offsets([(m, 2) for m in plan.cross_masks])

        def gather_step(j: Any) -> Any:
            acc: Any = tir.BufferLoad(scratch, [j * slots + slot_of(first + offsets[0])])
            for off in offsets[1:]:
                acc = combine(kind, acc, tir.BufferLoad(scratch, [j * slots + slot_of(first + off)]))
            return tir.BufferStore(part, acc, [j])

        gathered = serial(count, gather_step, "red_j")
        if threads_used < block_threads:
            # threads outside the layout hold nothing; their peer indices could leave the scratch
            gathered = tir.IfThenElse(tx_rel < threads_used, gathered, None)
        stmts.append(gathered)
    return stmts, buffers


def owner_threads(view: FragmentView, indices: list[int], replicas: int) -> set[int]:
    """The threads `view` puts element `indices` on (over `replicas` replica ids), numerically."""
    expr = view.thread
    subst = {v: tir.const(i, "int32") for v, i in zip(view.vars, indices)}
    analyzer = tvm.arith.Analyzer()
    owners = set()
    for q in range(replicas):
        subst[view.rep_var] = tir.const(q, "int32")
        value = analyzer.simplify(tvm.tirx.stmt_functor.substitute(expr, subst))
        owners.add(int(value.value))
    return owners


def same_owners(src: FragmentView, dst: FragmentView, dim: int) -> bool:
    """Whether `dst` puts every result exactly on the threads holding its source line (the layout
    tilelang's own reducer layout has). Proved symbolically for the first replica; when that fails,
    checked element by element (small tiles only)."""
    analyzer = tvm.arith.Analyzer()
    src_vars = [v for k, v in enumerate(src.vars) if k != dim] if len(src.vars) > 1 else []
    subst_src = {src.vars[dim]: tir.const(0, "int32"), src.rep_var: tir.const(0, "int32")}
    subst_src.update(dict(zip(src_vars, dst.vars)))
    first_src = tvm.tirx.stmt_functor.substitute(src.thread, subst_src)
    first_dst = tvm.tirx.stmt_functor.substitute(dst.thread, {dst.rep_var: tir.const(0, "int32")})
    for v, n in zip(dst.vars, dst.shape):
        analyzer.bind(v, tvm.ir.Range(0, n))
    if analyzer.can_prove_equal(first_src, first_dst):
        return True
    total = 1
    for n in dst.shape:
        total *= n
    if total * dst.replicate > 4096:
        return False
    for idx in itertools.product(*[range(n) for n in dst.shape]):
        want: set[int] = set()
        for r in range(src.shape[dim]):
            full = list(idx[:dim]) + [r] + list(idx[dim:]) if len(src.vars) > 1 else [r]
            want |= owner_threads(src, full, max(1, src.replicate))
        if owner_threads(dst, list(idx), max(1, dst.replicate)) != want:
            return False
    return True


def reducer_view(src: FragmentView, dim: int, plan: ReducePlan) -> FragmentView:
    """The destination layout that puts each result on every thread holding its source line (what
    tilelang's layout inference gives a fresh destination): replica `q` of an element sits on the
    thread holding the reduced index whose thread digits are `q % group`, source replica `q // group`."""
    group = 1
    for d in plan.thread_digits:
        group *= d.extent
    shape = [n for k, n in enumerate(src.shape) if k != dim] or [1]

    def thread(*args: Any) -> Any:
        *dvars, q = args
        r: Any = tir.const(0, "int32")
        stride = 1
        for d in plan.thread_digits:
            r = r + tvm.tirx.floormod(tvm.tirx.floordiv(q, stride), d.extent) * d.lower_factor
            stride *= d.extent
        subst = {src.vars[dim]: r, src.rep_var: tvm.tirx.floordiv(q, group)}
        if len(src.vars) > 1:
            subst.update(zip([v for k, v in enumerate(src.vars) if k != dim], dvars))
        return tvm.tirx.stmt_functor.substitute(src.thread, subst)

    return fragment_view(make_replicated_fragment(shape, thread, group * max(1, src.replicate)))


def owners_hold_their_lines(src: FragmentView, dst: FragmentView, dim: int, plan: ReducePlan) -> bool:
    """Whether every thread `dst` puts a result on holds part of that result's source line, so it
    ends the exchange with the total. Proved symbolically when the source is not replicated (the
    owner's own thread digits name the reduced index it would hold); otherwise, or when the proof
    fails, checked element by element against `reducer_view` (small tiles only)."""
    if src.replicate == 1:
        owner = dst.thread
        r: Any = tir.const(0, "int32")
        for d in plan.thread_digits:
            r = r + tvm.tirx.floormod(tvm.tirx.floordiv(owner, d.scale), d.extent) * d.lower_factor
        subst = {src.vars[dim]: r}
        if len(src.vars) > 1:
            subst.update(zip([v for k, v in enumerate(src.vars) if k != dim], dst.vars))
        analyzer = tvm.arith.Analyzer()
        for v, n in zip(dst.vars, dst.shape):
            analyzer.bind(v, tvm.ir.Range(0, n))
        analyzer.bind(dst.rep_var, tvm.ir.Range(0, max(1, dst.replicate)))
        if analyzer.can_prove_equal(tvm.tirx.stmt_functor.substitute(src.thread, subst), owner):
            return True
    return owners_within(dst, reducer_view(src, dim, plan))


def owners_within(dst: FragmentView, holders: FragmentView) -> bool:
    """Whether every thread `dst` puts an element on also holds that element under `holders`.
    Element by element; small tiles only."""
    total = 1
    for n in dst.shape:
        total *= n
    if total * max(dst.replicate, holders.replicate) > 4096:
        return False
    for idx in itertools.product(*[range(n) for n in dst.shape]):
        if not owner_threads(dst, list(idx), max(1, dst.replicate)) <= owner_threads(holders, list(idx), max(1, holders.replicate)):
            return False
    return True


@dataclass(frozen=True)
class ReduceCall:
    src: Any  # buffer
    dst: Any
    kind: str
    dim: int
    clear: bool


def lower_fragment_reduce(
    op: ReduceCall, src: FragmentView, dst: FragmentView, tx: Any, block_threads: int, layout_attr: str, own_barriers: bool = False
) -> tuple[Any, list[Any]]:
    """The TIR replacing one fragment -> fragment `tl.reduce`, and the buffers it allocates; with
    `own_barriers`, the barriers of its threadgroup exchange (ThreadSync is off)."""
    if len(op.dst.shape) != max(1, len(op.src.shape) - 1):
        raise MetalLoweringError(
            f"T.reduce into {op.dst.name} of shape {list(op.dst.shape)}: on Metal the destination drops the reduced axis "
            "(no keepdim); reduce into the smaller fragment and index it"
        )
    plan = plan_reduce(src, op.dim)
    group = 1
    for d in plan.thread_digits:
        group *= d.extent
    # `acc` is the layout the partials live in: every thread holding a source line keeps that line's
    # result. The destination's own layout when it is that one; otherwise (its layout came from a later
    # op, e.g. a T.copy to global memory) the results are stored by each destination owner, which must
    # then hold the line itself.
    acc = dst
    if dst.replicate != group * src.replicate or not same_owners(src, dst, op.dim):
        acc = reducer_view(src, op.dim, plan) if src.thread_min == 0 == dst.thread_min else None
        if acc is None or not owners_hold_their_lines(src, dst, op.dim, plan):
            raise MetalLoweringError(
                f"T.reduce into {op.dst.name}: its layout ({dst.thread}, replicated {dst.replicate}x) puts results on threads "
                f"that hold none of their row of {op.src.name} ({src.thread}); reduce into a fresh fragment and copy it "
                "through shared memory"
            )
    acc_dtype = accumulator_dtype(op.src.dtype)
    count = 1
    for n in acc.local_shape:
        count *= n
    part = tir.decl_buffer((count,), acc_dtype, op.dst.name + "_part", scope="local")
    buffers = [part]
    tx_rel = tx - src.thread_min if src.thread_min else tx
    # A float max / min / absmax starts from the thread's first element, not from the identity: under
    # Metal's fast math the compiler may assume no infinities (kernels/attention.py, MASKED_SCORE), and
    # with maxNum an identity would win over a line of only NaNs (-inf, +inf or 0 instead of NaN).
    # Threads outside the source layout fold nothing and keep the identity; no group of the exchange
    # holds one of them next to a thread of the layout.
    seeded = is_seeded(op.kind, acc_dtype)
    init = identity(op.kind, acc_dtype)
    outside = src.threads_used < block_threads
    stmts = [] if seeded and not outside else [serial(count, lambda j: tir.BufferStore(part, init, [j]), "red_j")]

    # 1. local fold over the source elements this thread holds
    def local_body(dvars: list[Any]) -> Any:
        j = linear_index(acc, dvars)
        thread_part: Any = tir.const(0, "int32")
        for d in plan.thread_digits:
            thread_part = thread_part + tvm.tirx.floormod(tvm.tirx.floordiv(tx_rel, d.scale), d.extent) * d.lower_factor

        def step(c: Any, first: bool = False) -> Any:
            r, stride = thread_part, 1
            for lower, size in plan.local_digits:
                r = r + tvm.tirx.floormod(tvm.tirx.floordiv(c, stride), size) * lower
                stride *= size
            if len(op.src.shape) == 1:
                indices = [r]
            else:
                indices = list(dvars[: op.dim]) + [r] + list(dvars[op.dim :])
            value = element(op.kind, tir.BufferLoad(op.src, indices), acc_dtype)
            if first:
                return tir.BufferStore(part, value, [j])
            return tir.BufferStore(part, combine(op.kind, tir.BufferLoad(part, [j]), value), [j])

        if seeded:
            fold: Any = step(tir.const(0, "int32"), first=True)
            if plan.local_count > 1:
                rest = serial(plan.local_count - 1, lambda c: step(c + 1), "red_c", unrolled=True)
                fold = tir.SeqStmt([fold, rest])
        else:
            fold = serial(plan.local_count, step, "red_c", unrolled=True)
        if outside:
            # threads outside the source layout hold no element: they would fold uninitialized registers
            fold = tir.IfThenElse(tx_rel < src.threads_used, fold, None)
        return fold

    stmts.append(parallel_nest(acc, local_body, layout_attr))

    # 2. within the simdgroup, 3. across simdgroups
    exchange = Exchange(op.kind, [d.scale for d in plan.thread_digits], [d.extent for d in plan.thread_digits], plan)
    more, scratch = exchange_partials(part, count, exchange, tx, tx_rel, block_threads, src.threads_used, op.dst.name, own_barriers)
    stmts.extend(more)
    buffers.extend(scratch)

    # 4. every owner (all replicas) stores the result
    def store_body(dvars: list[Any]) -> Any:
        j = linear_index(acc, dvars)
        result: Any = tir.BufferLoad(part, [j])
        if not op.clear:
            old = tir.BufferLoad(op.dst, list(dvars))
            old = tir.Cast(acc_dtype, old) if str(old.dtype) != acc_dtype else old
            result = combine(op.kind, old, result)
        if str(op.dst.dtype) != acc_dtype:
            result = tir.Cast(str(op.dst.dtype), result)
        return tir.BufferStore(op.dst, result, list(dvars))

    stmts.append(parallel_nest(dst, store_body, layout_attr))
    return tir.SeqStmt(fenced(stmts, scratch, own_barriers)), buffers


def lower_local_reduce(op: ReduceCall) -> Any:
    """Thread-local `local` -> `local` / `local.var` reduction: plain loops, nothing shared."""
    acc_dtype = accumulator_dtype(op.src.dtype)
    dst_shape = [int(n) for n in op.dst.shape]
    keepdim = len(dst_shape) == len(op.src.shape)
    loop_vars = [tir.Var(f"red_i{k}", "int32") for k in range(len(dst_shape))]
    acc = tir.decl_buffer((1,), acc_dtype, op.dst.name + "_acc", scope="local")
    old = tir.BufferLoad(op.dst, loop_vars)
    extent = int(op.src.shape[op.dim])
    seeded = op.clear and is_seeded(op.kind, acc_dtype)  # from the first element, as lower_fragment_reduce
    start = identity(op.kind, acc_dtype) if op.clear else element("sum", old, acc_dtype)

    def source(r: Any) -> Any:
        if len(op.src.shape) == 1:
            indices = [r]
        elif keepdim:
            indices = list(loop_vars[: op.dim]) + [r] + list(loop_vars[op.dim + 1 :])
        else:
            indices = list(loop_vars[: op.dim]) + [r] + list(loop_vars[op.dim :])
        return element(op.kind, tir.BufferLoad(op.src, indices), acc_dtype)

    def step(r: Any) -> Any:
        return tir.BufferStore(acc, combine(op.kind, tir.BufferLoad(acc, [0]), source(r + 1 if seeded else r)), [0])

    result: Any = tir.BufferLoad(acc, [0])
    if str(op.dst.dtype) != acc_dtype:
        result = tir.Cast(str(op.dst.dtype), result)
    stmts = [tir.BufferStore(acc, source(tir.const(0, "int32")) if seeded else start, [0])]
    if extent > int(seeded):
        stmts.append(serial(extent - int(seeded), step, "red_r", unrolled=True))
    stmts.append(tir.BufferStore(op.dst, result, loop_vars))
    body: Any = tir.SeqStmt(stmts)
    for k in reversed(range(len(loop_vars))):
        body = tir.For(loop_vars[k], 0, dst_shape[k], tir.ForKind.UNROLLED, body)
    return body, [acc]
