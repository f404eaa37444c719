"""tilelang's and TVM's vocabulary as the plugin reads and writes it: op names, attribute and
annotation keys, IR node type keys, and small typed views of tile-op calls (region, GEMM call,
fragment layout, kernel launches of the host function). Everything here names something of the
host; a tilelang upgrade that renames it changes this file only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .base import tir, tvm

def get_op(name: str) -> Any:
    """The registered TVM op of that name (for building calls to it)."""
    return tvm.ir.Op.get(name)


# FFI globals: the GEMM tile op's hooks (tilelang/tileop/gemm/__init__.py), the plugin's codegen entry
GEMM_LOWER_GLOBAL = "tl.gemm.lower"
GEMM_INFER_LAYOUT_GLOBAL = "tl.gemm.infer_layout"
CODEGEN_GLOBAL = "tilelang_metal.codegen.build"
CODEGEN_RUNTIME_GLOBAL = "tilelang_metal.codegen.build_runtime"  # device codegen of the tvm_ffi route
# TVM's Metal runtime module factory (src/runtime/metal/metal_module.mm), registered by the runtime
# library of tilelang's macOS wheel: (Map<kernel, MSL bytes>, "metal", Map<kernel, FunctionInfo>,
# Map<format, source text for inspect_source>) -> a runnable module.
METAL_MODULE_FACTORY = "ffi.Module.create.metal"
FUNCTION_INFO_FROM_JSON = "runtime.LoadMetaDataFromJSON"  # {"func_info": {name: FunctionInfo JSON}}
PLUGIN_BACKEND_NAME = "tilelang_metal"

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


@dataclass(frozen=True)
class RuntimeFunctionInfo:
    """TVM's `runtime.FunctionInfo` of one kernel (what its Metal runtime launches by)."""

    name: str
    arg_types: tuple[str, ...]  # dtype strings: "handle" for buffers, then the packed scalar types
    launch_param_tags: tuple[str, ...]  # blockIdx.x, threadIdx.x, ..., tirx.use_dyn_shared_memory

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "arg_types": list(self.arg_types), "launch_param_tags": list(self.launch_param_tags),
                "arg_extra_tags": [0] * len(self.arg_types)}


def kernel_launch_param_tags(func: Any) -> list[Any]:
    """The launch tags of a device kernel: the host passes one extent per tag after its arguments."""
    return _launch_param_tags(func)


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


def with_call_annotations(call: Any, extra: dict[str, Any]) -> Any:
    """`call` (a tile-op Call) with `extra` added to its annotations; tilelang's op built from it
    (the `node` its C++ hooks pass to Python) carries them too."""
    return tir.Call(call.dtype, call.op, call.args, {**call_annotations(call), **extra}, call.span)


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

# The annotation T.import_source (and T.Kernel's `prelude`) puts on a block, an AttrStmt after
# LowerOpaqueBlock: source text printed into the device file before the kernels.
IMPORT_SOURCE_ATTR = "pragma_import_c"

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


# ---- IR names the plugin's passes and printer match or build (op names, node type keys) ----
TIRX_ADD = "tirx.Add"
TIRX_ADDRESS_OF = "tirx.address_of"
TIRX_ALLOCBUFFER = "tirx.AllocBuffer"
TIRX_ATTRSTMT = "tirx.AttrStmt"
TIRX_BIND = "tirx.Bind"
TIRX_BITWISE_AND = "tirx.bitwise_and"
TIRX_BITWISE_NOT = "tirx.bitwise_not"
TIRX_BITWISE_OR = "tirx.bitwise_or"
TIRX_BITWISE_XOR = "tirx.bitwise_xor"
TIRX_BUFFERLOAD = "tirx.BufferLoad"
TIRX_BUFFERSTORE = "tirx.BufferStore"
TIRX_CALL = "tirx.Call"
TIRX_CALL_EXTERN = "tirx.call_extern"
TIRX_CALL_PURE_EXTERN = "tirx.call_pure_extern"
TIRX_DECLBUFFER = "tirx.DeclBuffer"
TIRX_DIV = "tirx.Div"
TIRX_ERF = "tirx.erf"
TIRX_EVALUATE = "tirx.Evaluate"
TIRX_FLOORDIV = "tirx.FloorDiv"
TIRX_FLOORMOD = "tirx.FloorMod"
TIRX_FOR = "tirx.For"
TIRX_HANDLE_ADD_BYTE_OFFSET = "tirx.handle_add_byte_offset"
TIRX_IFTHENELSE = "tirx.IfThenElse"
TIRX_IF_THEN_ELSE = "tirx.if_then_else"
TIRX_LET = "tirx.Let"
TIRX_LIKELY = "tirx.likely"
TIRX_MAKE_FILLED_SIMDGROUP_MATRIX = "tirx.make_filled_simdgroup_matrix"
TIRX_MOD = "tirx.Mod"
TIRX_METAL_SIMD_SHUFFLE = "tirx.metal.simd_shuffle"
TIRX_METAL_SIMD_SHUFFLE_DOWN = "tirx.metal.simd_shuffle_down"
TIRX_METAL_SIMD_SHUFFLE_UP = "tirx.metal.simd_shuffle_up"
TIRX_MUL = "tirx.Mul"
TIRX_RAMP = "tirx.Ramp"
TIRX_REINTERPRET = "tirx.reinterpret"
TIRX_RET = "tirx.ret"
TIRX_SBLOCK = "tirx.SBlock"
TIRX_SEQSTMT = "tirx.SeqStmt"
TIRX_SHIFT_LEFT = "tirx.shift_left"
TIRX_SHIFT_RIGHT = "tirx.shift_right"
TIRX_SIMDGROUP_LOAD = "tirx.simdgroup_load"
TIRX_SIMDGROUP_MULTIPLY_ACCUMULATE = "tirx.simdgroup_multiply_accumulate"
TIRX_SIMDGROUP_STORE = "tirx.simdgroup_store"
TIRX_TANH = "tirx.tanh"
TIRX_TVM_ACCESS_PTR = "tirx.tvm_access_ptr"
TIRX_TVM_STORAGE_SYNC = "tirx.tvm_storage_sync"
TIRX_TVM_THREAD_ALLREDUCE = "tirx.tvm_thread_allreduce"
TIRX_TVM_WARP_ACTIVEMASK = "tirx.tvm_warp_activemask"
TIRX_TVM_WARP_SHUFFLE = "tirx.tvm_warp_shuffle"
TIRX_TVM_WARP_SHUFFLE_DOWN = "tirx.tvm_warp_shuffle_down"
TIRX_TVM_WARP_SHUFFLE_UP = "tirx.tvm_warp_shuffle_up"
TIRX_VAR = "tirx.Var"
TIRX_WHILE = "tirx.While"
TL_ACCESS_PTR = "tl.access_ptr"
TL_ACTIVEMASK = "tl.activemask"
TL_ALL_SYNC = "tl.all_sync"
TL_ANY_SYNC = "tl.any_sync"
TL_ATOMIC_ADDX2_ELEM_OP = "tl.atomic_addx2_elem_op"
TL_ATOMIC_ADDX2_RET_ELEM_OP = "tl.atomic_addx2_ret_elem_op"
TL_ATOMIC_ADDX4_ELEM_OP = "tl.atomic_addx4_elem_op"
TL_ATOMIC_ADDX4_RET_ELEM_OP = "tl.atomic_addx4_ret_elem_op"
TL_ATOMIC_ADD_ELEM_OP = "tl.atomic_add_elem_op"
TL_ATOMIC_ADD_RET_ELEM_OP = "tl.atomic_add_ret_elem_op"
TL_ATOMIC_LOAD_ELEM_OP = "tl.atomic_load_elem_op"
TL_ATOMIC_MAX_ELEM_OP = "tl.atomic_max_elem_op"
TL_ATOMIC_MAX_RET_ELEM_OP = "tl.atomic_max_ret_elem_op"
TL_ATOMIC_MIN_ELEM_OP = "tl.atomic_min_elem_op"
TL_ATOMIC_MIN_RET_ELEM_OP = "tl.atomic_min_ret_elem_op"
TL_ATOMIC_STORE_ELEM_OP = "tl.atomic_store_elem_op"
TL_BALLOT = "tl.ballot"
TL_BALLOT_SYNC = "tl.ballot_sync"
TL_LOOP_BREAK = "tl.loop_break"
TL_NON_RESTRICT_PARAMS = "tl.non_restrict_params"
TL_SHFL_DOWN_SYNC = "tl.shfl_down_sync"
TL_SHFL_SYNC = "tl.shfl_sync"
TL_SHFL_UP_SYNC = "tl.shfl_up_sync"
TL_SHFL_XOR_SYNC = "tl.shfl_xor_sync"
TL_SYNC_WARP = "tl.sync_warp"
TL_TILEOP_REGION = "tl.tileop.region"
TL_WARP_REDUCE_PREFIX = "tl.warp_reduce_"
