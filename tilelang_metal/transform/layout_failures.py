"""One-line messages for tilelang's layout-inference failures, with a fix computed for the kernel.

tilelang's LayoutInference ("no available layout found") and ReducerPlanAndMaterialize ("Layout ...
has errors: ... not bijective") name neither the buffer nor a launch that works. Whether a thread
count works depends on vector widths, row splits and replication that tilelang chooses, so no
closed formula predicts it (a 4x1000 row softmax fails on 128 threads and on 48 or 96, lowers on
100 or 250). The message therefore names the kernel's largest fragment (or its reducer) with its
shape, and suggests thread counts that were tried: layout inference and the tile ops' lowering run
again on the module with that kernel relaunched at nearby counts, and only counts they accept are
suggested (tilelang's layout may accept a count that the plugin's reducer finalize refuses).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..host import THREAD_EXTENT_ATTR, tir, tvm
from ..host import vocab
from ..target.isa import SIMD_WIDTH
from ..target.limits import MAX_THREADS_PER_THREADGROUP
from ..core.ir_attrs import find_nodes
from .kernel_launches import ThreadLaunch, kernels, rewrite_kernels

REDUCER_SCOPE = "local.reducer"
FRAGMENT_SCOPE = "local.fragment"
MAX_TRIALS = 48  # layout inference runs (a few ms each on a small kernel) an error may spend
SUGGESTIONS = 2


def _allocated(kernel: Any, scope: str) -> list[Any]:
    return [buf for block in find_nodes(kernel, [vocab.TIRX_SBLOCK]) for buf in block.alloc_buffers if str(buf.scope()) == scope]


def _elements(buf: Any) -> int:
    count = 1
    for dim in buf.shape:
        if not isinstance(dim, tir.IntImm):
            return 0
        count *= int(dim.value)
    return count


def _shape_text(buf: Any) -> str:
    return "x".join(str(dim) for dim in buf.shape) + f" {buf.dtype}"


def _candidates(current: int, sizes: list[int]) -> list[int]:
    """Thread counts to try, nearest to `current` first: whole simdgroups, and the divisors of the
    buffers' extents and element counts (a count that splits the tile exactly); at least one
    simdgroup (fewer leaves most lanes of the only simdgroup idle) unless the kernel runs fewer."""
    smallest = min(SIMD_WIDTH, current)
    pool = set(range(SIMD_WIDTH, MAX_THREADS_PER_THREADGROUP + 1, SIMD_WIDTH))
    for size in sizes:
        pool.update(d for d in range(smallest, min(size, MAX_THREADS_PER_THREADGROUP) + 1) if size % d == 0)
    pool.discard(current)
    return sorted(pool, key=lambda n: (abs(n - current), n))


def _relaunched(mod: Any, target: tuple[Any, int], threads: int) -> Any:
    """`mod` with kernel number `target[1]` of function `target[0]` launched on `threads` x threads."""
    gvar, index = target
    func = mod[gvar]
    seen = [0]

    def relaunch(kernel: Any, launch: ThreadLaunch) -> Any:
        here, seen[0] = seen[0], seen[0] + 1
        if here != index:
            return kernel

        def resize(node: Any) -> Any:
            if isinstance(node, tir.AttrStmt) and str(node.attr_key) == THREAD_EXTENT_ATTR and str(node.node.thread_tag) == "threadIdx.x":
                var = node.node.var
                iv = tir.IterVar(tvm.ir.Range(0, threads), var, tir.IterVar.ThreadIndex, "threadIdx.x")
                return tir.AttrStmt(iv, THREAD_EXTENT_ATTR, tir.const(threads, var.dtype), node.body)
            return None

        return tvm.tirx.stmt_functor.ir_transform(kernel, None, resize, [vocab.TIRX_ATTRSTMT])

    updated = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    updated[gvar] = func.with_body(rewrite_kernels(func.body, relaunch))
    return updated


def _lowers(run: Callable[[Any], Any], mod: Any) -> bool:
    try:
        run(mod)
    except Exception:  # any failure: this count is not one to suggest
        return False
    return True


def no_layout_message(mod: Any, run: Callable[[Any], Any], reducer: bool) -> str:
    """The message for a module whose layout inference (`run`) failed: the kernel whose relaunch at
    another thread count lets `run` succeed, its fragment (or reducer when `reducer`), and those counts."""
    trials = 0
    fallback: tuple[Any, ThreadLaunch, Any] | None = None
    for gvar, func in mod.functions.items():
        if not isinstance(func, tir.PrimFunc):
            continue
        for index, (kernel, launch) in enumerate(kernels(func.body)):
            buffers = _allocated(kernel, REDUCER_SCOPE if reducer else FRAGMENT_SCOPE) or _allocated(kernel, FRAGMENT_SCOPE)
            if not buffers or launch.threads is None:
                continue
            named = max(buffers, key=_elements)
            fallback = fallback or (kernel, launch, named)
            sizes = [_elements(b) for b in buffers] + [int(d.value) for b in buffers for d in b.shape if isinstance(d, tir.IntImm)]
            working: list[int] = []
            for threads in _candidates(launch.threads, sizes):
                if trials >= MAX_TRIALS or len(working) == SUGGESTIONS:
                    break
                trials += 1
                if _lowers(run, _relaunched(mod, (gvar, index), threads)):
                    working.append(threads)
            if working:
                return _message(named, launch.threads, reducer, working)
    if fallback is None:
        return _message(None, None, reducer, [])
    return _message(fallback[2], fallback[1].threads, reducer, [])


def _message(buf: Any, threads: int | None, reducer: bool, working: list[int]) -> str:
    what = "reducer" if reducer and buf is not None and str(buf.scope()) == REDUCER_SCOPE else "fragment"
    subject = f"{what} {buf.name} ({_shape_text(buf)})" if buf is not None else "a fragment"
    on = f" on {threads} threads" if threads is not None else ""
    head = f"layout inference found no thread layout for {subject}{on}: its elements or its reduced rows do not split evenly over the threads; "
    if working:
        counts = " or ".join(f"threads={n}" for n in sorted(working))
        return head + f"launch with {counts} (checked: layout inference and the reductions lower with them), or pad the tile to a shape that splits over {threads}"
    return head + "no nearby thread count lowers it: pad the tile so its rows split over the threads (a power-of-two row length)"
