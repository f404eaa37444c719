"""The one module that touches tilelang / TVM internals.

Everything the plugin swaps into stock tilelang (backend manifest, target normalizer and detector,
FFI globals of the GEMM tile op, the kernel-cache key, the JIT adapter dispatch) is installed and
restored here, so a tilelang upgrade touches this file only. Each hook records exactly what it
replaced and `uninstall()` puts those objects back.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import UnsupportedHostError
from .version import SUPPORTED_RANGE_TEXT, SUPPORTED_TILELANG


def _parse_version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_host_version() -> str:
    """Return tilelang's version, or raise if the plugin does not support it."""
    try:
        import tilelang
    except ImportError as err:  # pragma: no cover - exercised only without tilelang
        raise UnsupportedHostError(f"tilelang_metal needs {SUPPORTED_RANGE_TEXT}; tilelang is not importable: {err}") from err
    version = str(getattr(tilelang, "__version__", "0"))
    parsed = _parse_version(version)
    low, high = SUPPORTED_TILELANG
    if not (low <= parsed < high):
        raise UnsupportedHostError(
            f"tilelang_metal supports {SUPPORTED_RANGE_TEXT}, found tilelang {version}. "
            "Install a supported tilelang (pip install 'tilelang==0.1.15') or a tilelang_metal release for your tilelang."
        )
    return version


check_host_version()

import tvm_ffi  # noqa: E402  (after the version guard on purpose)
from tilelang import tvm  # noqa: E402

# --------------------------------------------------------------------------------------------
# Host types the rest of the plugin may use (re-exported so no other module imports internals).
# --------------------------------------------------------------------------------------------
from tilelang.backend.device_codegen import DeviceCodegen  # noqa: E402,F401
from tilelang.backend.execution_backend import ExecutionBackendSpec  # noqa: E402,F401
from tilelang.backend.host_codegen import STANDARD_HOST_CODEGENS, HostCodegenHook  # noqa: E402,F401
from tilelang.backend.module import BackendModule  # noqa: E402
from tilelang.backend.pass_pipeline import PassPipeline  # noqa: E402,F401

Target = tvm.target.Target
tir = tvm.tirx

GEMM_LOWER_GLOBAL = "tl.gemm.lower"
GEMM_INFER_LAYOUT_GLOBAL = "tl.gemm.infer_layout"
CODEGEN_GLOBAL = "tilelang_metal.codegen.build"
PLUGIN_BACKEND_NAME = "tilelang_metal"


def get_global_func(name: str) -> Callable[..., Any] | None:
    return tvm_ffi.get_global_func(name, allow_missing=True)


def register_global_func(name: str, func: Callable[..., Any]) -> None:
    tvm_ffi.register_global_func(name, f=func, override=True)


def register_error_types(*classes: type) -> None:
    """Let the plugin's exceptions cross TVM's FFI with their own type (raised inside tilelang's
    pass callbacks, they would otherwise reach the user as a plain RuntimeError)."""
    for cls in classes:
        tvm_ffi.register_error(cls.__name__, cls)


def make_source_module(source: str, fmt: str = "metal") -> Any:
    """A stock TVM source module: `kernel_source`/`inspect_source()` and the torch adapter read it."""
    return tvm_ffi.get_global_func("runtime.SourceModuleCreate")(source, fmt)


def in_tree_host_context_hook() -> Any:
    """The in-tree host-codegen hook (marks host functions with the Metal context); reused as is."""
    import tilelang.metal.codegen as metal_codegen

    return metal_codegen.mark_host_metal_context


def resolve_target(target: Any) -> Any:
    """tilelang's own target resolution (normalizers included) as a Target object."""
    from tilelang.backend.target import determine_target

    return determine_target(target, return_object=True)


def pipeline_options() -> Any:
    """tilelang's pass-config readers (vectorize, let-inline, shared-memory merge policy, ...)."""
    from tilelang.backend.pass_pipeline import pipeline_utils

    return pipeline_utils


def make_fragment_layout(shape: list, thread_fn: Callable[..., Any], index_fn: Callable[..., Any], replicate: int = 1) -> Any:
    """A tilelang Fragment layout: element (i, j) lives in thread thread_fn(i, j) at index_fn(i, j);
    with replicate > 1, in the `replicate` threads thread_fn(i, j, rep), rep in [0, replicate)."""
    from tilelang.layout import Fragment

    return Fragment(shape, forward_thread_fn=thread_fn, forward_index_fn=index_fn, replicate=replicate)


def make_replicated_fragment(shape: list, thread_fn: Callable[..., Any], replicate: int) -> Any:
    """A tilelang Fragment whose replica `rep` of element (i, j, ...) lives in thread
    `thread_fn(i, j, ..., rep)`; tilelang infers the per-thread index from the thread map (the
    splits of the indices the thread does not select) and drops replica digits that select no thread."""
    from tilelang.layout import Fragment

    if replicate > 1:
        return Fragment(shape, forward_thread_fn=thread_fn, replicate=replicate).condense_rep_var()
    return Fragment(shape, forward_thread_fn=lambda *idx: thread_fn(*idx, tir.const(0, "int32")))


def layout_is_row_major(layout: Any) -> bool:
    """True when a tilelang Layout stores element (i, j, ...) at its row-major position (the
    storage a buffer has without an annotated layout). Fragments are register layouts: False."""
    from tilelang.layout import Fragment

    if isinstance(layout, Fragment):
        return False
    shape = list(layout.get_input_shape())
    index = layout.get_linearized_forward_index()
    expected = 0
    for var, extent in zip(layout.get_forward_vars(), shape):
        expected = expected * extent + var
    return bool(tvm.arith.Analyzer().can_prove_equal(index, expected))


@dataclass(frozen=True)
class GemmNodeView:
    """The fields of tilelang's `tl.Gemm` tile-op node that GemmMetal reads."""

    a_region: Any
    b_region: Any
    c_region: Any
    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool
    clear_accum: Any
    policy: int


@dataclass(frozen=True)
class GemmCallFields:
    """What selection needs from a `tl.tileop.gemm` call before layout inference builds its node."""

    c_buffer: Any
    m: int
    n: int
    k: int
    policy: int
    a_buffer: Any = None  # None when the operand is not a plain region (selection does not need it)
    b_buffer: Any = None


GEMM_TILE_OP = "tl.tileop.gemm"
REGION_OP = "tl.region"  # T.region(BufferLoad at the region's origin, access mask, extents...)
REGION_READ, REGION_WRITE = 1, 2


def tile_op_region(call: Any) -> tuple[Any, int] | None:
    """(buffer, access mask) of a tile-op operand region call; None for any other call."""
    if str(getattr(call.op, "name", "")) != REGION_OP or len(call.args) < 2:
        return None
    load, mask = call.args[0], call.args[1]
    if not isinstance(load, tir.BufferLoad) or not isinstance(mask, tir.IntImm):
        return None
    return load.buffer, int(mask.value)


def gemm_call_fields(call: Any) -> GemmCallFields | None:
    """The fields of a T.gemm tile-op call (args: A, B, C regions, trans_A, trans_B, M, N, K,
    policy, ...), or None for any other call or a form this tilelang does not produce."""
    if str(getattr(call.op, "name", "")) != GEMM_TILE_OP or len(call.args) < 9:
        return None
    c_region = tile_op_region(call.args[2]) if isinstance(call.args[2], tir.Call) else None
    sizes = call.args[5:9]
    if c_region is None or not all(isinstance(x, tir.IntImm) for x in sizes):
        return None
    m, n, k, policy = (int(x.value) for x in sizes)
    a_region, b_region = (tile_op_region(arg) if isinstance(arg, tir.Call) else None for arg in call.args[:2])
    return GemmCallFields(c_region[0], m, n, k, policy, a_region and a_region[0], b_region and b_region[0])


def gemm_node_view(node: Any) -> GemmNodeView:
    return GemmNodeView(
        node.aRegion,
        node.bRegion,
        node.cRegion,
        int(node.m),
        int(node.n),
        int(node.k),
        bool(node.transA),
        bool(node.transB),
        node.clearAccum,
        int(node.policy.policy_type),
    )


@dataclass(frozen=True)
class HostKernelCall:
    """One device-kernel launch of a lowered host function, as the host passes it.

    `args` line up with `device_func.params` (the kernel's [[ buffer(i) ]] order: unused host
    parameters are already gone); `launch` maps each launch tag (`blockIdx.x`, `threadIdx.x`, ...)
    to its extent, both expressions of the host function's variables."""

    kernel_name: str
    device_func: Any
    args: tuple[Any, ...]
    launch: tuple[tuple[str, Any], ...]


def host_kernel_calls(host_mod: Any, device_mod: Any) -> list[HostKernelCall]:
    """The device-kernel calls of the host functions, in program order.

    SplitHostDevice + MakePackedAPI leave each launch as `tvm_call_packed("<kernel>", *device args,
    *launch extents)`; the launch extents follow the tags listed in the kernel's
    `kernel_launch_params` attribute."""
    kernels = {str(gvar.name_hint): func for gvar, func in device_mod.functions.items() if isinstance(func, tir.PrimFunc)}
    calls: list[HostKernelCall] = []

    def visit(node: Any) -> None:
        if not (isinstance(node, tir.Call) and str(node.op.name).endswith("tvm_call_packed")):
            return
        head = node.args[0] if len(node.args) else None
        name = str(head.value) if isinstance(head, tir.StringImm) else None
        func = kernels.get(name)
        if func is None:
            return
        n_params = len(func.params)
        tags = [str(tag) for tag in _launch_param_tags(func)]
        rest = list(node.args[1:])
        if len(rest) != n_params + len(tags):
            raise RuntimeError(
                f"tilelang_metal: the host call of kernel {name} has {len(rest)} arguments, expected "
                f"{n_params} parameters + {len(tags)} launch extents; this tilelang build is not supported"
            )
        calls.append(HostKernelCall(name, func, tuple(rest[:n_params]), tuple(zip(tags, rest[n_params:]))))

    for func in host_mod.functions.values():
        if isinstance(func, tir.PrimFunc):
            tir.stmt_functor.post_order_visit(func.body, visit)
    return calls


READONLY_PARAMS_ATTR = "tl.readonly_param_indices"  # device function attribute: indices of params it never writes


def readonly_param_indices(func: Any) -> frozenset[int]:
    """The parameters (by index) a device function provably never writes (stock
    AnnotateReadOnlyParams); every other buffer parameter may be written."""
    attrs = func.attrs if func.attrs is not None else {}
    return frozenset(int(i) for i in attrs.get(READONLY_PARAMS_ATTR, []))


@dataclass(frozen=True)
class HostWorkspace:
    """A device buffer the host allocates for one call: a `T.alloc_global` of the prim_func, which
    tilelang's HoistGlobalBufferAllocations moves to the host function (an `AllocBuffer` there; on
    CUDA it becomes a workspace allocation). Kernels receive its `data` variable as a buffer argument."""

    name: str
    data: Any
    dtype: str
    shape: tuple[Any, ...]  # expressions of the host function's variables


def host_workspaces(host_mod: Any) -> list[HostWorkspace]:
    """Every global-scope buffer allocated in the host functions (AllocBuffer is a flat statement, so
    the post-order walk meets them in program order)."""
    found: list[HostWorkspace] = []

    def visit(node: Any) -> None:
        if isinstance(node, tir.AllocBuffer) and str(node.buffer.scope()) == "global":
            buffer = node.buffer
            found.append(HostWorkspace(str(buffer.name), buffer.data, str(buffer.dtype), tuple(buffer.shape)))

    for func in host_mod.functions.values():
        if isinstance(func, tir.PrimFunc):
            tir.stmt_functor.post_order_visit(func.body, visit)
    return found


def _launch_param_tags(func: Any) -> list[Any]:
    attrs = func.attrs if func.attrs is not None else {}
    for key in ("tirx.kernel_launch_params", "tir.kernel_launch_params"):
        if key in attrs:
            return list(attrs[key])
    raise RuntimeError("tilelang_metal: device kernel without kernel_launch_params; this tilelang build is not supported")


# --------------------------------------------------------------------------------------------
# Tile ops the plugin lowers itself (tl.reduce, tl.cumsum, ...): their call form, regions, layouts
# --------------------------------------------------------------------------------------------

TILE_OP_PREFIX = "tl.tileop."
THREAD_EXTENT_ATTR = "thread_extent"  # AttrStmt key of each launch binding (blockIdx.*, threadIdx.*)
LAYOUT_MAP_ATTR = "layout_map"  # block annotation written by LayoutInference: buffer -> Layout/Fragment
PARALLEL_LOOP_LAYOUT_ATTR = "parallel_loop_layout"  # loop annotation LowerTileOp partitions by


def tile_op_name(expr: Any) -> str | None:
    """`"reduce"` for a `tl.tileop.reduce(...)` call, None for anything that is not a tile op."""
    op = getattr(expr, "op", None)
    name = str(getattr(op, "name", "")) if isinstance(expr, tir.Call) else ""
    return name[len(TILE_OP_PREFIX) :] if name.startswith(TILE_OP_PREFIX) else None


@dataclass(frozen=True)
class TileRegion:
    """A tile-op operand `T.region(buf[mins], access, *extents)`."""

    buffer: Any
    mins: list[Any]
    extents: list[Any]

    def is_whole_buffer(self) -> bool:
        shape = list(self.buffer.shape)
        if len(self.mins) != len(shape):
            return False
        analyzer = tvm.arith.Analyzer()
        # the region may list fewer extents than dims (leading unit dims are implied)
        extents = [1] * (len(shape) - len(self.extents)) + list(self.extents)
        return all(analyzer.can_prove_equal(m, 0) for m in self.mins) and all(
            analyzer.can_prove_equal(e, s) for e, s in zip(extents, shape)
        )


def tile_region(expr: Any) -> TileRegion:
    if isinstance(expr, tir.BufferRegion):
        return TileRegion(expr.buffer, [r.min for r in expr.region], [r.extent for r in expr.region])
    if isinstance(expr, tir.Call) and str(expr.op.name) in ("tl.tileop.region", "tl.region"):
        load = expr.args[0]
        return TileRegion(load.buffer, list(load.indices), list(expr.args[2:]))
    if isinstance(expr, tir.BufferLoad):
        return TileRegion(expr.buffer, list(expr.indices), [1] * len(expr.indices))
    raise TypeError(f"not a tile region: {expr}")


def call_annotations(call: Any) -> dict[str, Any]:
    annotations = getattr(call, "annotations", None)
    return dict(annotations.items()) if annotations is not None else {}


@dataclass(frozen=True)
class FragmentView:
    """What a tilelang `Fragment` (register layout of a `local.fragment` buffer) says, as TIR.

    Element `vars` of the logical tile lives on thread `thread_min + thread` (for replica `rep_var`
    in [0, replicate)) at per-thread index `index` (row-major over `local_shape`)."""

    shape: list[int]
    vars: list[Any]
    thread: Any
    index: list[Any]
    local_shape: list[int]
    replicate: int
    rep_var: Any
    thread_min: int
    thread_extent: int  # threads the layout is bound to (the launch's range)
    threads_used: int  # threads [thread_min, thread_min + threads_used) hold elements
    layout: Any  # the Fragment itself (loop annotations need it)


def fragment_view(layout: Any) -> FragmentView:
    from tilelang.layout import Fragment

    if not isinstance(layout, Fragment):
        raise TypeError(f"expected a register fragment layout, got {type(layout).__name__}")
    shape = [int(n) for n in layout.get_input_shape()]
    forward_vars = [getattr(v, "var", v) for v in layout.get_forward_vars()]
    # the replica variable, when there is one, comes before the input variables
    input_vars = forward_vars[len(forward_vars) - len(shape) :]
    extra = forward_vars[: len(forward_vars) - len(shape)]
    rep_var = extra[0] if extra else tir.Var("_rep", "int32")
    thread = layout.forward_thread
    thread_range = layout.thread_range
    return FragmentView(
        shape=shape,
        vars=input_vars,
        thread=thread,
        index=list(layout.forward_index),
        local_shape=[int(s) for s in layout.get_output_shape()],
        replicate=int(layout.replicate_size),
        rep_var=rep_var,
        thread_min=int(thread_range.min) if thread_range is not None else 0,
        thread_extent=int(thread_range.extent) if thread_range is not None else int(layout.get_thread_size()),
        threads_used=int(layout.get_thread_size()),
        layout=layout,
    )


def fragments_agree(first: Any, second: Any) -> bool:
    """True when two register layouts put every element in the same thread at the same index.

    tilelang's `is_equal` compares expressions structurally; layouts built by different ops may
    spell the same map differently, so a failed structural check is retried as a proof over the
    input ranges."""
    if first.is_equal(second):
        return True
    a, b = fragment_view(first), fragment_view(second)
    if a.shape != b.shape or a.replicate != b.replicate or a.thread_min != b.thread_min:
        return False
    analyzer = tvm.arith.Analyzer()
    for var, extent in zip(a.vars, a.shape):
        analyzer.bind(var, tvm.ir.Range(0, extent))
    rename = dict(zip(b.vars, a.vars))
    if a.replicate > 1:  # replica q of one is replica q of the other (a sufficient condition)
        analyzer.bind(a.rep_var, tvm.ir.Range(0, a.replicate))
        rename[b.rep_var] = a.rep_var
    pairs = [(a.thread, b.thread)] + list(zip(a.index, b.index))
    if len(a.index) != len(b.index):
        return False
    return all(analyzer.can_prove_equal(x, tir.stmt_functor.substitute(y, rename)) for x, y in pairs)


@dataclass(frozen=True)
class IterSplit:
    """One term `((source // lower_factor) % extent) * scale` of a normalized index."""

    source: Any
    lower_factor: int
    extent: int
    scale: int


def iter_splits(expr: Any, ranges: dict[Any, Any]) -> tuple[list[IterSplit], Any] | None:
    """`expr` as a sum of splits of the variables in `ranges` plus a base; None when TVM cannot
    normalize it (non-affine, or a non-constant factor)."""
    iter_sum = tvm.arith.normalize_to_iter_sum(expr, ranges)
    splits = []
    for split in iter_sum.args:
        source = split.source.source
        values = (split.lower_factor, split.extent, split.scale)
        if not isinstance(source, tir.Var) or not all(isinstance(v, tir.IntImm) for v in values):
            return None
        splits.append(IterSplit(source, *(int(v.value) for v in values)))
    return splits, iter_sum.base


# --------------------------------------------------------------------------------------------
# Hook bookkeeping
# --------------------------------------------------------------------------------------------


@dataclass
class _Installed:
    restores: list[Callable[[], None]] = field(default_factory=list)


_lock = threading.RLock()
_installed: _Installed | None = None


def is_installed() -> bool:
    return _installed is not None


def _swap_attr(owner: Any, name: str, value: Any, record: _Installed) -> Any:
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    record.restores.append(lambda: setattr(owner, name, original))
    return original


def _swap_global(name: str, func: Callable[..., Any], record: _Installed) -> Callable[..., Any]:
    original = get_global_func(name)
    if original is None:
        raise RuntimeError(f"tilelang_metal: expected the FFI global {name!r} in tilelang; this tilelang build is not supported")
    register_global_func(name, func)
    record.restores.append(lambda: register_global_func(name, original))
    return original


def _swap_backend(manifest: BackendModule, record: _Installed) -> None:
    from tilelang.backend import module as backend_module

    backends = backend_module._BACKENDS
    index = backend_module._TARGET_KIND_INDEX
    saved_backends = dict(backends)
    saved_index = {kind: list(names) for kind, names in index.items()}
    for kind in manifest.target_kinds:
        for name in index.get(kind, []):
            backends.pop(name, None)
        index[kind] = [manifest.name]
    backends[manifest.name] = manifest

    def restore() -> None:
        backends.clear()
        backends.update(saved_backends)
        index.clear()
        index.update(saved_index)

    record.restores.append(restore)


def _swap_target_hooks(normalizer: Callable[..., Any], detector: Callable[..., Any], record: _Installed) -> None:
    from tilelang.backend import target as backend_target

    normalizers = backend_target._TARGET_NORMALIZERS
    detectors = backend_target._TARGET_DETECTORS
    saved_norm = normalizers.get("metal")
    saved_det = detectors.get("metal")
    backend_target.register_target_normalizer("metal", normalizer, override=True)
    backend_target.register_target_detector("metal", detector, override=True)

    def restore() -> None:
        for table, saved in ((normalizers, saved_norm), (detectors, saved_det)):
            if saved is None:
                table.pop("metal", None)
            else:
                table["metal"] = saved

    record.restores.append(restore)


def _swap_cache_key(identity: dict[str, str], codegen_settings: Callable[[], dict[str, str]], record: _Installed) -> None:
    """Metal kernels compiled while the plugin is active get the plugin's identity and the current
    codegen settings in their cache key (tilelang's key knows nothing about which backend, under
    which settings, lowered a kernel). Settings are read per key, so an env change takes effect."""
    from tilelang.cache.kernel_cache import KernelCache

    original = KernelCache.__dict__["_generate_key"]

    def generate_key(self, func, out_idx, execution_backend="tvm_ffi", args=None, target="auto", *rest, **kwargs):
        key = original(self, func, out_idx, execution_backend, args, target, *rest, **kwargs)
        kind = getattr(getattr(target, "kind", None), "name", str(target))
        if "metal" not in str(kind):
            return key
        stamp = json.dumps({**identity, "codegen": codegen_settings()}, sort_keys=True)
        return hashlib.sha256((key + stamp).encode()).hexdigest()

    _swap_attr(KernelCache, "_generate_key", generate_key, record)


def _swap_jit_memo(codegen_settings: Callable[[], dict[str, str]], record: _Installed) -> None:
    """`@tilelang.jit` functions memoize kernels by call arguments only. Keep one memo per value of
    the codegen settings, so a kernel lowered under one value is never returned under another."""
    jit_module = importlib.import_module("tilelang.jit")
    jit_impl = jit_module.JITImpl
    original = jit_impl.__dict__["__call__"]
    new_call_form_cache = jit_module._CallFormCache

    @functools.wraps(original)
    def call(self, *args, **kwargs):
        stamp = json.dumps(codegen_settings(), sort_keys=True)
        state = self.__dict__
        seen = state.get("_tilelang_metal_settings")
        if seen != stamp:
            if seen is not None:  # first call under a new value: park the old memo, take this value's
                memos = state.setdefault("_tilelang_metal_memos", {})
                memos[seen] = (self._kernel_cache, self._call_form_cache)
                self._kernel_cache, self._call_form_cache = memos.pop(stamp, None) or ({}, new_call_form_cache())
            state["_tilelang_metal_settings"] = stamp
        return original(self, *args, **kwargs)

    _swap_attr(jit_impl, "__call__", call, record)


def _swap_adapter_dispatch(adapters: dict[str, Callable[..., Any]], record: _Installed) -> None:
    """Route the named execution backends to the plugin's adapters, in JITKernel and in the
    kernel-cache dispatch (names tilelang does not know get a memory-only cache)."""
    kernel_module = importlib.import_module("tilelang.jit.kernel")
    jit_kernel = kernel_module.JITKernel
    original = jit_kernel.__dict__["_create_adapter_from_artifact"]

    def create_adapter_from_artifact(self, tilelang_func, out_idx, artifact, pass_configs, compile_metadata):
        make_adapter = adapters.get(self.execution_backend)
        if make_adapter is not None and self.backend.name == PLUGIN_BACKEND_NAME:
            return make_adapter(
                params=artifact.params,
                result_idx=out_idx,
                func_or_mod=tilelang_func,
                device_mod=artifact.device_mod,
                host_mod=artifact.host_mod,
                kernel_source=artifact.kernel_source,
                target=self.target,
            )
        return original(self, tilelang_func, out_idx, artifact, pass_configs, compile_metadata)

    _swap_attr(jit_kernel, "_create_adapter_from_artifact", create_adapter_from_artifact, record)

    import tilelang.cache as cache_pkg

    dispatch = cache_pkg._dispatch_map
    added = [name for name in adapters if name not in dispatch]
    for name in added:
        dispatch[name] = make_memory_only_kernel_cache()

    def restore() -> None:
        for name in added:
            dispatch.pop(name, None)

    record.restores.append(restore)


def _swap_pass_configs(scope: Callable[[Any], tuple[Any, Any]], record: _Installed) -> None:
    """The plugin's own `pass_configs` keys (`tilelang_metal.*`) never reach TVM's PassContext, which
    refuses keys not registered in C++: `scope` splits them off and returns a context manager that
    holds them while tilelang lowers and prints the kernel. Kernel-cache keys are computed before,
    from the whole dict."""
    kernel_module = importlib.import_module("tilelang.jit.kernel")
    jit_kernel = kernel_module.JITKernel
    original = jit_kernel.__dict__["_compile_artifact"]

    @functools.wraps(original)
    def compile_artifact(self, tilelang_func, pass_configs, compile_metadata):
        rest, options = scope(pass_configs)
        with options:
            return original(self, tilelang_func, rest, compile_metadata)

    _swap_attr(jit_kernel, "_compile_artifact", compile_artifact, record)


def make_memory_only_kernel_cache() -> Any:
    """A kernel cache for backends whose artifacts are not serialized by tilelang (memory only)."""
    from tilelang.cache.kernel_cache import KernelCache

    class MemoryOnlyKernelCache(KernelCache):
        def _load_kernel_from_disk(self, *args: Any, **kwargs: Any) -> None:
            return None

        def _save_kernel_to_disk(self, *args: Any, **kwargs: Any) -> None:
            return None

        def _set_adapter_cache_path(self, *args: Any, **kwargs: Any) -> None:
            return None

    return MemoryOnlyKernelCache()


def profiler_base() -> type:
    """tilelang's `Profiler` (what `JITKernel.get_profiler()` returns), for the plugin's subclass."""
    from tilelang.profiler import Profiler

    return Profiler


def assert_tensors_close(got: Any, want: Any, *, atol: float, rtol: float, max_mismatched_ratio: float) -> None:
    """tilelang's element-ratio tolerant comparison (the one its Profiler uses)."""
    from tilelang.utils.tensor import torch_assert_close

    torch_assert_close(got, want, rtol=rtol, atol=atol, max_mismatched_ratio=max_mismatched_ratio, base_name="tilelang", ref_name="ref")


def _swap_profiler(record: _Installed) -> None:
    """`kernel.get_profiler()` of a kernel run by a plugin adapter asks the adapter for its
    profiler (stock tilelang's assumes CUDA); every other kernel gets tilelang's own."""
    jit_kernel = importlib.import_module("tilelang.jit.kernel").JITKernel
    original = jit_kernel.__dict__["get_profiler"]

    @functools.wraps(original)
    def get_profiler(self, *args: Any, **kwargs: Any) -> Any:
        make = getattr(self.adapter, "make_profiler", None)
        if make is None or self.backend.name != PLUGIN_BACKEND_NAME:
            return original(self, *args, **kwargs)
        profiler = original(self, *args, **kwargs)  # tilelang's, for its parameter handling
        return make(profiler.params, profiler.result_idx, profiler.supply_type)

    _swap_attr(jit_kernel, "get_profiler", get_profiler, record)


_backend_hint_installed = False
_unavailable_hint: Callable[[str], str | None] = lambda name: None


def _install_inactive_backend_hint(plugin_backends: tuple[str, ...], unavailable_hint: Callable[[str], str | None]) -> None:
    """After `deactivate()`, `execution_backend="emulator"` on a Metal target fails in tilelang with
    only "Allowed: torch, tvm_ffi". Add how to get it back. Installed once, at the first
    activation, and kept on purpose: it changes that error's text and nothing else (every
    successful resolution and every other error pass through untouched)."""
    global _backend_hint_installed, _unavailable_hint
    _unavailable_hint = unavailable_hint  # why a plugin backend is unavailable (e.g. MLX not installed)
    if _backend_hint_installed:
        return
    _backend_hint_installed = True
    original = BackendModule.__dict__["resolve_execution_backend"]

    @functools.wraps(original)
    def resolve_execution_backend(self, requested, target, *args, **kwargs):
        try:
            return original(self, requested, target, *args, **kwargs)
        except ValueError as err:
            name = str(requested).lower() if requested is not None else ""
            kind = getattr(getattr(target, "kind", None), "name", "")
            if name in plugin_backends and kind == "metal" and not is_installed():
                raise ValueError(
                    f"{err} execution_backend={name!r} comes from the tilelang_metal plugin, which is not "
                    "active: `import tilelang_metal` (activates it) or call `tilelang_metal.activate()`."
                ) from err
            why = _unavailable_hint(name) if name in plugin_backends and kind == "metal" else None
            if why:
                raise ValueError(f"{err} {why}") from err
            raise

    BackendModule.resolve_execution_backend = resolve_execution_backend


def base_kernel_adapter() -> type:
    from tilelang.jit.adapter.base import BaseKernelAdapter

    return BaseKernelAdapter


@dataclass(frozen=True)
class HostHooks:
    """What the plugin installs; built by `tilelang_metal.plugin`."""

    manifest: BackendModule
    normalize_target: Callable[..., Any]
    detect_target: Callable[..., Any]
    gemm_lower: Callable[[Callable[..., Any]], Callable[..., Any]]
    gemm_infer_layout: Callable[[Callable[..., Any]], Callable[..., Any]]
    codegen_build: Callable[..., Any]
    cache_identity: dict[str, str]
    codegen_settings: Callable[[], dict[str, str]]  # current values of the settings that change MSL
    error_types: tuple[type, ...]  # plugin exceptions that must cross TVM's FFI with their own type
    adapters: dict[str, Callable[..., Any]]  # execution backend name -> adapter factory
    unavailable_hint: Callable[[str], str | None] = lambda name: None  # why a backend is unavailable here
    # pass_configs -> (the entries for tilelang's PassContext, a context manager holding the plugin's)
    pass_config_scope: Callable[[Any], tuple[Any, Any]] = lambda configs: (configs, contextlib.nullcontext())


def install(hooks: HostHooks) -> bool:
    """Install every hook; returns False when already installed. Thread-safe."""
    global _installed
    with _lock:
        if _installed is not None:
            return False
        record = _Installed()
        try:
            register_error_types(*hooks.error_types)
            register_global_func(CODEGEN_GLOBAL, hooks.codegen_build)
            _swap_backend(hooks.manifest, record)
            _swap_target_hooks(hooks.normalize_target, hooks.detect_target, record)
            original_lower = get_global_func(GEMM_LOWER_GLOBAL)
            original_infer = get_global_func(GEMM_INFER_LAYOUT_GLOBAL)
            _swap_global(GEMM_LOWER_GLOBAL, hooks.gemm_lower(original_lower), record)
            _swap_global(GEMM_INFER_LAYOUT_GLOBAL, hooks.gemm_infer_layout(original_infer), record)
            _swap_cache_key(hooks.cache_identity, hooks.codegen_settings, record)
            _swap_jit_memo(hooks.codegen_settings, record)
            _swap_adapter_dispatch(hooks.adapters, record)
            _swap_profiler(record)
            _swap_pass_configs(hooks.pass_config_scope, record)
            _install_inactive_backend_hint(tuple(hooks.adapters), hooks.unavailable_hint)
        except BaseException:
            for restore in reversed(record.restores):
                restore()
            raise
        _installed = record
        return True


def uninstall() -> bool:
    """Restore everything `install` replaced, in reverse order. Returns False when not installed."""
    global _installed
    with _lock:
        if _installed is None:
            return False
        for restore in reversed(_installed.restores):
            restore()
        _installed = None
        return True


# tilelang's annotations that the shared-staging pass reads or rewrites (transform/shared_staging.py)
LAYOUT_MAP_ANNOTATION = "layout_map"  # T.annotate_layout: block annotation, buffer data var -> layout
PIPELINE_LOOP_ANNOTATIONS = ("num_stages", "tl_pipeline_order", "tl_pipeline_stage", "tl_pipeline_sync", "tl_pipeline_group")


def annotated_layout_vars(block: Any) -> list[Any]:
    """Data variables of the buffers `T.annotate_layout` gives a layout in this block."""
    layouts = block.annotations.get(LAYOUT_MAP_ANNOTATION) if block.annotations is not None else None
    return list(layouts.keys()) if layouts is not None else []


def pipeline_stages(loop: Any) -> int:
    """`T.Pipelined(num_stages=...)` of a loop; 0 when it has none."""
    value = loop.annotations.get("num_stages") if loop.annotations is not None else None
    return int(value) if value is not None else 0


def with_pipeline_stages(loop: Any, stages: int) -> Any:
    """The loop with `num_stages` set (2 or more) or, below 2, without any pipelining annotation."""
    annotations = {k: v for k, v in loop.annotations.items() if k not in PIPELINE_LOOP_ANNOTATIONS}
    if stages >= 2:
        annotations["num_stages"] = tir.const(stages, "int32")
    return tir.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body, loop.thread_binding, annotations)


def fresh_definitions(stmt: Any) -> Any:
    """`stmt` with every scalar variable it defines (loop variables, `Bind`s, `Let`s) replaced by a
    fresh one, uses included. Two copies of one body (an if/else with the same body on both sides)
    must not define a variable twice: TVM's analyzers bind a variable's range once per function."""
    mapping: dict[Any, Any] = {}

    def collect(node: Any) -> None:
        var = node.loop_var if isinstance(node, tir.For) else node.var if isinstance(node, (tir.Bind, tir.Let)) else None
        if var is not None and var not in mapping:
            mapping[var] = tir.Var(var.name, var.dtype)

    tvm.tirx.stmt_functor.post_order_visit(stmt, collect)
    if not mapping:
        return stmt
    stmt = tvm.tirx.stmt_functor.substitute(stmt, mapping)  # uses; the definitions keep the old vars

    def redefine(node: Any) -> Any:
        if isinstance(node, tir.For) and node.loop_var in mapping:
            return tir.For(mapping[node.loop_var], node.min, node.extent, node.kind, node.body,
                           node.thread_binding, node.annotations, node.step)
        if isinstance(node, tir.Bind) and node.var in mapping:
            return tir.Bind(mapping[node.var], node.value)
        if isinstance(node, tir.Let) and node.var in mapping:
            return tir.Let(mapping[node.var], node.value, node.body)
        return None

    return tvm.tirx.stmt_functor.ir_transform(stmt, None, redefine, ["tirx.For", "tirx.Bind", "tirx.Let"])


# CUDA-only hints of tilelang's language that mean nothing on Metal and cannot change results: the
# printer drops them (docs/kernel_vocabulary.md, "CUDA-only hints"). Op name -> the call users write.
NO_OP_HINT_CALLS = {
    # register reallocation between warpgroups (PTX setmaxnreg): Metal's compiler owns registers
    "tl.set_max_nreg": "T.set_max_nreg / T.inc_max_nreg / T.dec_max_nreg",
    "tl.no_set_max_nreg": "T.no_set_max_nreg / T.disable_warp_group_reg_alloc",
    "tl.annotate_producer_reg_dealloc": "T.annotate_producer_reg_dealloc",
    "tl.annotate_consumer_reg_alloc": "T.annotate_consumer_reg_alloc",
    # programmatic dependent launch: the plugin's launches of one call run one after the other, so
    # a dependent kernel never starts before the previous one finished (pdl_sync holds already)
    "tl.pdl_trigger": "T.pdl_trigger",
    "tl.pdl_sync": "T.pdl_sync",
}

# T.print's device functions (tilelang/cuda/language/print.py emits them with call_extern): the
# emulator's shim implements them (shim/tlm/debug.h); the Mac backends refuse kernels that call them.
DEBUG_PRINT_EXTERNS = ("debug_print_var", "debug_print_buffer_value", "debug_print_msg")

# NVIDIA-only synchronisation the printer refuses, with what to do instead (op name -> message).
_WGMMA_FIX = "T.gemm on Metal is synchronous; drop it together with the hand-written WGMMA code"
REFUSED_CUDA_CALLS = {
    "tl.named_barrier_arrive": "T.named_barrier_arrive: Metal has no split arrive / wait barrier; use T.sync_threads() reached by every thread",
    "tl.sync_grid": "T.sync_grid: Metal has no grid-wide barrier; split the kernel in two at this point",
    "tl.fence_proxy_async": "T.fence_proxy_async orders TMA (async proxy) accesses, which Metal lacks; drop it (T.copy needs no fence)",
    "tl.warpgroup_arrive": f"T.warpgroup_arrive controls asynchronous WGMMA: {_WGMMA_FIX}",
    "tl.warpgroup_commit_batch": f"T.warpgroup_commit_batch controls asynchronous WGMMA: {_WGMMA_FIX}",
    "tl.warpgroup_wait": f"T.warpgroup_wait controls asynchronous WGMMA: {_WGMMA_FIX}",
    "tl.wait_wgmma": f"T.wait_wgmma controls asynchronous WGMMA: {_WGMMA_FIX}",
}
