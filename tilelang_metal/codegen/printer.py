"""MSL printer: one lowered device PrimFunc to one Metal kernel (the subset in docs/msl_contract.md).

Device buffers are accessed only as `A[i]` or `*(device T4*)(A + i)`, never through `&A[i]` or a
saved pointer: the Linux emulator relies on that to check every device access.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..host import NO_OP_HINT_CALLS, REFUSED_CUDA_CALLS, tir, tvm
from ..core import intrinsics
from ..errors import CodegenError
from ..target.limits import BUFFER_ARGUMENT_SLOTS
from ..config import current_options
from ..core.ir_attrs import (
    LANE_ID_ATTR,
    POSITION_NAMES_ATTR,
    SIMDGROUP_ID_ATTR,
    THREAD_ARRAY_ALIGN_ATTR,
    UNIFORM_BRANCH,
    declared_element_counts,
    prelude_vars,
    storage_of,
)
from ..core.scopes import SHARED_SCOPES, THREAD_SCOPES
from .atomic_printer import AtomicPrinting
from .expression_printer import ExpressionPrinting
from .matrix_printer import MatrixPrinting
from .msl_types import msl_type, split_dtype
from .names import NameTable
from .storage_views import ReinterpretedStorage, element_bytes, reinterpreted_storage
from .warp_printer import WarpPrinting
from ..host import vocab
from . import access_marks, artifact, tvm_runtime_args
from .liveness import live_ranges

# Kernel signatures the printer emits. STANDARD: every parameter at its own `[[ buffer(i) ]]`,
# scalars as `constant T& NAME` (the plugin's launchers and the emulator). TVM_RUNTIME: TVM's Metal
# runtime convention (execution_backend="tvm_ffi"): buffers at 0..n-1, then all scalars in one
# argument struct at n (codegen/tvm_runtime_args.py).
STANDARD, TVM_RUNTIME = artifact.STANDARD, artifact.TVM_RUNTIME
SIGNATURES = (STANDARD, TVM_RUNTIME)

# Comment on both lines of a threadgroup-uniform `if` / `else` (the emulator's counters read it:
# such a branch masks no access).
UNIFORM_NOTE = "  // threadgroup-uniform"
# support_code keys of T.import_source texts (the key holds the text: each printed once per file).
IMPORTED_SOURCE_KEY = "import_source "
FLOAT_ATOMIC_DTYPES = frozenset({"float32", "float16", "bfloat16"})
# 16 bytes of elements with the element's alignment: what a packed 16-byte copy moves (MSL has no
# packed 8-lane half vector); declared once in a kernel file that uses it.
RUN16 = "tlm_run16"
RUN16_DECLARATION = f"template <typename T> struct {RUN16} {{ T elements[16 / sizeof(T)]; }};\n"

# Hardware position parameters: (attribute, MSL type, default parameter name). A pass may rename a
# parameter through the function attribute POSITION_NAMES_ATTR (the block swizzle does).
POSITION_PARAMS = (
    ("threadgroup_position_in_grid", "uint3", "blockIdx"),
    ("threadgroups_per_grid", "uint3", "__gridDim"),
    ("thread_position_in_threadgroup", "uint3", "threadIdx"),
    ("simdgroup_index_in_threadgroup", "uint", "__simd_group_id"),
    ("thread_index_in_simdgroup", "ushort", "__lane"),
)
# Positions read through a Metal function at the top of the body instead of a parameter (spec 1.4).
POSITION_FUNCTIONS = {"thread_index_in_simdgroup": "__metal_get_thread_index_in_simdgroup"}
LAUNCH_ATTRIBUTES = {"blockIdx": "threadgroup_position_in_grid", "threadIdx": "thread_position_in_threadgroup"}


def _pointee_dtype(var: Any) -> str:
    annotation = getattr(var, "type_annotation", None)
    element = getattr(annotation, "element_type", None)
    if element is None or not hasattr(element, "dtype"):
        raise CodegenError(f"kernel parameter {var.name} has no element type")
    return str(element.dtype)


class KernelPrinter(ExpressionPrinting, MatrixPrinting, WarpPrinting, AtomicPrinting):
    """Prints one device PrimFunc. Every decision (layouts, swizzle, hoisting, matrix storage,
    resource limits) was taken by passes before; this class only spells the IR in MSL."""

    def __init__(self, func: Any, name: str, signature: str = STANDARD):
        if signature not in SIGNATURES:
            raise ValueError(f"signature must be one of {SIGNATURES}, got {signature!r}")
        self.func = func
        self.name = name
        self.signature = signature
        self.lines: list[str] = []
        self.prelude: list[str] = []  # kernel-scope declarations (threadgroup arrays, MPP ops)
        self.indent = 1
        self.name_of = NameTable()
        self.used_positions: set[str] = set()  # position attributes the kernel reads
        self.device: dict[Any, tuple[str, bool]] = {}  # data var -> (dtype, read-only)
        self.threadgroup: dict[Any, str] = {}
        self.thread_arrays: dict[Any, str] = {}
        self.storage = storage_of(func)
        self.view_elements = declared_element_counts(func.body)
        # threadgroup / thread storage that T.view reads as another dtype (codegen/storage_views.py)
        self.reinterpreted = reinterpreted_storage(func.body, set(func.params))
        self.uniform_ifs: list[Any] = []  # IfThenElse nodes recorded as threadgroup-uniform
        self.options = current_options()  # the lowering's options (config.py), fixed for the whole kernel
        self.precise_math = self.options.precise_math  # float32 math as metal::precise:: calls (docs/math.md)
        self.mpp_ops: list[tuple[str, bool]] = []  # (instruction key, relaxed) of each matmul2d object
        self.helpers: set[str] = set()  # math helpers (math_functions.HELPERS) the kernel calls
        self.support_code: dict[str, str] = {}  # other helper functions (atomic CAS loops), once per file
        self.declared: set = set()
        self.bound: set = set()  # variables a Bind has declared (a repeat gets a fresh name)
        self.position_of: dict[Any, str] = {}  # hardware variable -> its position attribute
        self.unsigned_positions: dict[Any, str] = {}  # blockIdx / threadIdx var -> `NAME.axis` (uint)
        self.threads: int | None = None  # threads per threadgroup when static (set by print_kernel)
        # the kernel's records (codegen/artifact.py), in printed order; each declaration is printed
        # through its record's msl(), so the artifact and the text agree by construction
        self.threadgroup_decls: list[artifact.ThreadgroupArrayDecl | artifact.ThreadgroupViewDecl] = []
        self.thread_array_decls: list[artifact.ThreadArrayDecl] = []
        self.cooperative_tensor_decls: list[artifact.CooperativeTensorDecl] = []  # metal4 accumulators (matrix_printer)
        self.tile_pointer_decls: dict[str, artifact.TilePointerDecl] = {}
        self.instructions: list[str] = []  # isa names of the matrix instructions the kernel runs
        self.atomic_targets: set[str] = set()  # what the kernel's atomics update
        self.float_atomics = False
        self.atomic_results_used = False
        self.discarded_atomic: Any = None  # the atomic call an Evaluate statement is printing
        self.prints = False  # the kernel calls T.print
        self.analyzer = tvm.arith.Analyzer()
        self._expr_memo: dict[int, tuple[Any, str]] = {}
        self.tmp = 0
        attrs = func.attrs or {}
        renamed = {str(k): str(v) for k, v in attrs.get(POSITION_NAMES_ATTR, {}).items()}
        self.position_names = {attr: renamed.get(attr, default) for attr, _, default in POSITION_PARAMS}
        for name_ in self.position_names.values():
            self.name_of.reserve(name_)
        for var in prelude_vars(func):  # made by the plugin's passes, named to be unique
            self.name_of.bind(var, str(var.name))
            self.name_of.reserve(str(var.name))
        for attr, position in ((SIMDGROUP_ID_ATTR, "simdgroup_index_in_threadgroup"), (LANE_ID_ATTR, "thread_index_in_simdgroup")):
            if attr in attrs:
                self.bind_position(attrs[attr], position, f"((int){self.position_names[position]})")

    def check_buffer_slots(self, params: list[artifact.Param]) -> None:
        """Metal binds at most BUFFER_ARGUMENT_SLOTS [[ buffer(i) ]] per kernel; more does not compile on a Mac."""
        used = len(params)  # only buffer-bound parameters so far (positions come later)
        if used <= BUFFER_ARGUMENT_SLOTS:
            return
        tensors = sum(isinstance(p, artifact.BufferParam) for p in params)
        scalars = used - tensors  # scalar values (or the one argument struct that holds them)
        if tensors < BUFFER_ARGUMENT_SLOTS:
            fix = (f"make {used - BUFFER_ARGUMENT_SLOTS} of the {scalars} scalar / dynamic-size parameters static "
                   "(a T.dynamic size shared by several tensors takes one slot) or pass them in one small tensor")
        else:
            fix = f"pass fewer than {BUFFER_ARGUMENT_SLOTS} tensors (stack same-shape tensors into one) or split the kernel"
        raise CodegenError(
            f"kernel {self.name} needs {used} [[ buffer(i) ]] slots ({tensors} tensors, {scalars} scalar slots), Metal allows "
            f"{BUFFER_ARGUMENT_SLOTS} per kernel: {fix}"
        )

    def bind_position(self, var: Any, position: str, text: str) -> None:
        self.name_of.bind(var, text)
        self.position_of[var] = position

    def simplify(self, e: Any) -> Any:
        return self.analyzer.simplify(e)

    def fresh(self, base: str) -> str:
        self.tmp += 1
        return f"__{base}{self.tmp}"

    def emit(self, text: str) -> None:
        self.lines.append("  " * self.indent + text)

    # ---------------------------------------------------------------- top level
    def print_kernel(self) -> tuple[str, set[str], set[str], artifact.KernelRecord]:
        """(the kernel function's text, the headers it needs, the math helpers it calls, its record)."""
        func = self.func
        attrs = func.attrs or {}
        readonly = {int(i) for i in attrs.get(vocab.READONLY_PARAMS_ATTR, [])}
        non_restrict = {str(getattr(v, "name", v)) for v in attrs.get(vocab.TL_NON_RESTRICT_PARAMS, [])}
        params: list[artifact.Param] = []
        scalars: list[tuple[str, str]] = []  # (MSL name, dtype) of the scalar parameters, in order
        for index, var in enumerate(func.params):
            name = self.name_of(var)
            if var.dtype == "handle":
                if scalars and self.signature == TVM_RUNTIME:
                    raise CodegenError(f"kernel {self.name}: buffer parameter {var.name} follows a scalar; TVM's Metal runtime needs buffers first")
                dtype = _pointee_dtype(var)
                ro = index in readonly
                self.device[var] = (dtype, ro)
                params.append(artifact.BufferParam(index, name, msl_type(dtype), ro, str(var.name) not in non_restrict))
            elif self.signature == TVM_RUNTIME:
                scalars.append((name, str(var.dtype)))
            else:
                params.append(artifact.ScalarParam(index, name, msl_type(str(var.dtype))))
        scalar_locals, members = self.argument_struct(scalars) if scalars else ([], ())
        if scalars:
            struct = tvm_runtime_args.struct_name(self.name)
            params.append(artifact.ArgStructParam(len(params), tvm_runtime_args.ARGS_PARAM, struct, tvm_runtime_args.SLOT_BYTES * len(members), members))
        self.check_buffer_slots(params)
        threads: int | None = 1  # None: a symbolic threadgroup size, no static bound to declare
        block = [1, 1, 1]
        for tag, extent in attrs.get("thread_extent", {}).items():
            if str(tag).startswith("threadIdx"):
                static = isinstance(extent, tir.IntImm)
                threads = threads * int(extent.value) if threads is not None and static else None
                if static:
                    block["xyz".index(str(tag)[-1])] = int(extent.value)
        self.threads = threads

        self.visit(func.body)
        for attr, ty, _ in POSITION_PARAMS:
            if attr in self.used_positions and attr not in POSITION_FUNCTIONS:
                params.append(artifact.PositionParam(self.position_names[attr], ty, attr))
        locals_ = scalar_locals + [
            f"const {ty} {self.position_names[attr]} = {POSITION_FUNCTIONS[attr]}({ty}());"
            for attr, ty, _ in POSITION_PARAMS
            if attr in self.used_positions and attr in POSITION_FUNCTIONS
        ]
        headers = {"metal_stdlib", "metal_simdgroup"}
        if self.mpp_ops:
            headers.add("MetalPerformancePrimitives/MetalPerformancePrimitives.h")
        record = artifact.KernelRecord(
            name=self.name,
            params=tuple(params),
            block=None if threads is None else (block[0], block[1], block[2]),
            max_total_threads=threads,
            threadgroup_arrays=tuple(d for d in self.threadgroup_decls if isinstance(d, artifact.ThreadgroupArrayDecl)),
            threadgroup_views=tuple(d for d in self.threadgroup_decls if isinstance(d, artifact.ThreadgroupViewDecl)),
            thread_arrays=tuple(self.thread_array_decls),
            cooperative_tensors=tuple(self.cooperative_tensor_decls),
            tile_pointers=tuple(self.tile_pointer_decls.values()),
            instructions=tuple(self.instructions),
            prints=self.prints,
            atomic_targets=tuple(sorted(self.atomic_targets)),
            float_atomics=self.float_atomics,
            atomic_results_used=self.atomic_results_used,
        )
        sig = record.opening() + "\n  " + ",\n  ".join(p.msl() for p in params) + ") {"
        body = ["  " + line for line in locals_ + self.prelude] + self.lines
        # the internal form's access marks become the record's (codegen/access_marks.py)
        text, marks, blocks = access_marks.strip("\n".join([sig] + body + ["}", ""]))
        record = dataclasses.replace(record, access_marks=marks, predicated_blocks=blocks)
        record = _with_live_ranges(record, text)
        return text, headers, self.helpers, record

    def note_atomic(self, atomic: Any, *, discarded: bool) -> None:
        """Record what an atomic updates for the artifact (racecheck's schedule comparison reads it)."""
        views = self.views_of(atomic.var)
        if views is not None:
            raise CodegenError(
                f"{views.name}: an atomic on storage that T.view reads as {' and '.join(sorted(views.dtypes))}; an atomic "
                "updates one element type, so make the atomic's buffer one that no T.view reinterprets"
            )
        self.atomic_targets.add(self.name_of(atomic.var))
        self.float_atomics |= self.elem_dtype(atomic.var) in FLOAT_ATOMIC_DTYPES
        self.atomic_results_used |= not discarded

    def uses_instruction(self, name: str) -> None:
        """Record that the kernel runs the matrix instruction `name` (isa.REGISTRY)."""
        if name not in self.instructions:
            self.instructions.append(name)

    def argument_struct(self, scalars: list[tuple[str, str]]) -> tuple[list[str], tuple[tuple[str, str], ...]]:
        """TVM_RUNTIME: declare the kernel's argument struct (in the file header, before the
        kernels); return the body's first lines, which give each scalar its usual name, and the
        struct's members as (name, the dtype the runtime packs)."""
        slots = [(name, tvm_runtime_args.arg_slot(dtype, name, self.name)) for name, dtype in scalars]
        self.support_code[f"tvm_args {self.name}"] = tvm_runtime_args.struct_definition(self.name, slots)
        lines = [
            f"const {msl_type(dtype)} {name} = {tvm_runtime_args.read_expression(name, dtype, slot)};"
            for (name, dtype), (_, slot) in zip(scalars, slots)
        ]
        return lines, tuple((name, slot.runtime_dtype) for name, slot in slots)

    # ---------------------------------------------------------------- statements
    def visit(self, stmt: Any) -> None:
        method = getattr(self, "visit_" + type(stmt).__name__, None)
        if method is None:
            raise CodegenError(f"the Metal printer does not support {type(stmt).__name__} statements")
        method(stmt)

    def visit_SeqStmt(self, stmt: Any) -> None:
        for s in stmt.seq:
            self.visit(s)

    def visit_AttrStmt(self, stmt: Any) -> None:
        if str(stmt.attr_key) == "thread_extent":
            iv = stmt.node
            tag = str(iv.thread_tag)
            base, _, axis = tag.partition(".")
            position = LAUNCH_ATTRIBUTES.get(base)
            if position is not None:
                self.bind_position(iv.var, position, f"((int){self.position_names[position]}.{axis})")
                self.unsigned_positions[iv.var] = f"{self.position_names[position]}.{axis}"
        elif str(stmt.attr_key) == vocab.IMPORT_SOURCE_ATTR:  # T.import_source (checked to be MSL when lowering began)
            source = str(stmt.value.value)
            self.support_code[IMPORTED_SOURCE_KEY + source] = source
        elif str(stmt.attr_key) == UNIFORM_BRANCH:
            branch = _only_statement(stmt.body)
            if isinstance(branch, tir.IfThenElse):
                self.uniform_ifs.append(branch)
        self.visit(stmt.body)

    def visit_AllocBuffer(self, stmt: Any) -> None:
        buf = stmt.buffer
        var = buf.data
        if var in self.declared:
            return  # unrolled copies of a loop body re-allocate the same scratch array
        self.declared.add(var)
        scope, dtype = str(buf.scope()), str(buf.dtype)
        name = self.name_of(var)
        count = 1
        for dim in buf.shape:
            count *= int(dim)
        views = self.reinterpreted.get(var)
        if views is not None:  # declared once with the narrowest element type of its views
            dtype, count = views.dtype, count * element_bytes(dtype) // element_bytes(views.dtype)
        if scope in SHARED_SCOPES:
            self.threadgroup[var] = dtype
            self.threadgroup_decls.append(artifact.ThreadgroupArrayDecl(name, msl_type(dtype), count))
            self.prelude.append(self.threadgroup_decls[-1].msl())
            return
        if scope not in THREAD_SCOPES:
            raise CodegenError(f"buffer {buf.name} has storage scope {scope}, which Metal kernels cannot allocate")
        self.thread_arrays[var] = dtype
        if views is not None and self.matrix_storage(var) is not None:
            raise CodegenError(
                f"{buf.name}: T.view reads it as {' and '.join(sorted(views.dtypes))}, but the GEMM keeps it in matrix "
                "registers, which have no bytes to reinterpret; T.copy it into a T.alloc_fragment and view that"
            )
        if self.declare_matrix(var, name, dtype):
            return
        storage = self.matrix_storage(var)
        if storage is not None:  # a cooperative accumulator kept as an array: fp32 like the MPP destination
            self.thread_arrays[var] = "float32"
            self.thread_array(artifact.ThreadArrayDecl(name, "float", count))
            return
        # align: recorded by the pass that moves whole 16-byte vectors through the array
        align = int(stmt.annotations.get(THREAD_ARRAY_ALIGN_ATTR, 0)) if stmt.annotations else 0
        if views is not None and views.align > element_bytes(dtype):
            align = max(align, views.align)  # its widest view's elements are read in place
        self.thread_array(artifact.ThreadArrayDecl(name, msl_type(dtype), count, align))

    def thread_array(self, decl: artifact.ThreadArrayDecl) -> None:
        self.thread_array_decls.append(decl)
        self.emit(decl.msl())

    def cooperative_tensors(self, decl: artifact.CooperativeTensorDecl) -> None:
        self.cooperative_tensor_decls.append(decl)

    def visit_DeclBuffer(self, stmt: Any) -> None:
        return None

    def visit_Bind(self, stmt: Any) -> None:
        var, value = stmt.var, stmt.value
        if str(var.dtype) == "handle":
            self.bind_pointer(var, value)
            return
        value_text = self.expr(value)  # printed before a rename: the value may read the previous copy
        name = self.name_of.rename(var) if var in self.bound else self.name_of(var)
        if var in self.bound:
            self._expr_memo.clear()  # memoized texts spell the previous name
        self.bound.add(var)
        self.emit(f"const {msl_type(str(var.dtype))} {name} = {value_text};")

    def bind_pointer(self, var: Any, value: Any) -> None:
        """A typed view into merged threadgroup memory: `T* X = (T*)(pool + byte_offset)`."""
        if isinstance(value, tir.Call) and str(value.op.name) == vocab.TIRX_ADDRESS_OF and value.args[0].buffer.data in self.device:
            # a tile pointer into a device buffer (transform/tile_pointers.py): `const device T* __src = (A + off);`
            source = value.args[0].buffer.data
            dtype, readonly = self.device[source]
            self.device[var] = (dtype, readonly)
            if not self.name_of.has(var):  # plugin-made name: keep its `__` spelling, unique per kernel
                name, k = str(var.name), 1
                while self.name_of.taken(name):
                    name, k = f"{var.name}{k}", k + 1
                self.name_of.reserve(name)
                self.name_of.bind(var, name)
            decl = artifact.TilePointerDecl(self.name_of(var), msl_type(dtype), readonly, self.name_of(source))
            self.tile_pointer_decls.setdefault(decl.name, decl)
            self.emit(f"{decl.prefix()}{self.pointer(value)};")
            return
        if not (isinstance(value, tir.Call) and str(value.op.name) == vocab.TIRX_HANDLE_ADD_BYTE_OFFSET):
            # e.g. T.make_tensor over a pointer read from a T.ptr / uint64 table: Metal binds every buffer as a parameter
            raise CodegenError(
                f"unsupported pointer binding {var.name} = {value}: a pointer made inside the kernel (T.ptr, T.make_tensor over a "
                "pointer table) is not supported on Metal; pass each tensor as its own T.Tensor parameter"
            )
        pool, offset = value.args
        if pool not in self.threadgroup:
            raise CodegenError(f"pointer {var.name} must point into threadgroup memory")
        dtype = _pointee_dtype(var)
        count = self.view_elements.get(var)  # the view's own extent: the emulator checks accesses against it
        views = self.reinterpreted.get(var)
        if views is not None:
            dtype, count = views.dtype, views.count
        self.threadgroup[var] = dtype
        view = artifact.ThreadgroupViewDecl(self.name_of(var), msl_type(dtype), self.name_of(pool), self.expr(offset), count)
        self.threadgroup_decls.append(view)
        self.prelude.append(view.msl())

    def visit_For(self, stmt: Any) -> None:
        var = self.name_of(stmt.loop_var)
        lo = self.expr(stmt.min)
        hi = self.expr(stmt.min + stmt.extent) if not isinstance(stmt.min, tir.IntImm) or int(stmt.min.value) != 0 else self.expr(stmt.extent)
        ty = msl_type(str(stmt.loop_var.dtype))
        if stmt.kind == tir.ForKind.UNROLLED:
            self.emit("#pragma clang loop unroll(full)")
        self.emit(f"for ({ty} {var} = {lo}; {var} < {hi}; ++{var}) {{")
        self.indent += 1
        self.visit(stmt.body)
        self.indent -= 1
        self.emit("}")

    def visit_While(self, stmt: Any) -> None:
        self.emit(f"while ({self.expr(stmt.condition)}) {{")
        self.indent += 1
        self.visit(stmt.body)
        self.indent -= 1
        self.emit("}")

    def visit_IfThenElse(self, stmt: Any) -> None:
        note = UNIFORM_NOTE if any(stmt.same_as(b) for b in self.uniform_ifs) else ""
        # a branch some threads skip: the emulator's counters count its accesses as predicated
        scope = "" if note else access_marks.BLOCK
        self.emit(f"if ({self.expr(stmt.condition)}) {scope}{{{note}")
        self.indent += 1
        self.visit(stmt.then_case)
        self.indent -= 1
        if stmt.else_case is not None:
            self.emit(f"}} else {scope}{{{note}")
            self.indent += 1
            self.visit(stmt.else_case)
            self.indent -= 1
        self.emit("}")

    def visit_AssertStmt(self, stmt: Any) -> None:
        return None

    def visit_Evaluate(self, stmt: Any) -> None:
        value = stmt.value
        if isinstance(value, tir.IntImm):
            return
        if isinstance(value, tir.Call) and self.statement_call(value):
            return
        self.discarded_atomic = value if isinstance(value, tir.Call) and intrinsics.match_atomic(value) is not None else None
        self.emit(self.expr(value) + ";")
        self.discarded_atomic = None

    def statement_call(self, call: Any) -> bool:
        op = str(call.op.name)
        if op in NO_OP_HINT_CALLS:  # CUDA register / launch-overlap hints: nothing to do on Metal
            return True
        if op in REFUSED_CUDA_CALLS:
            raise CodegenError(REFUSED_CUDA_CALLS[op])
        if op == vocab.TL_LOOP_BREAK:  # T.loop_break(): leaves the innermost enclosing loop
            self.emit("break;")
            return True
        if op == vocab.TIRX_TVM_STORAGE_SYNC:
            scope = str(call.args[0].value)
            if scope in SHARED_SCOPES:
                self.check_whole_threadgroup_barrier(call)
                self.emit("threadgroup_barrier(mem_flags::mem_threadgroup);")
            elif scope == "warp":
                self.emit("simdgroup_barrier(mem_flags::mem_none);")
            else:
                # tilelang's ThreadSync counts a sync of any scope as ordering threadgroup memory too
                # (it places no threadgroup barrier next to this one), so this one must order both
                self.emit("threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);")
            return True
        if op == vocab.TIRX_RET:
            self.emit("return;")
            return True
        copy = intrinsics.match_copy16(call)
        if copy is not None:
            self.copy16(copy)
            return True
        packed = intrinsics.match_packed(call)
        if packed is not None and packed.value is not None:
            self.emit(f"{self.packed_access(packed)} = {self.expr(packed.value)};")
            return True
        return self.matrix_statement(call)

    def check_whole_threadgroup_barrier(self, call: Any) -> None:
        """`T.sync_threads(barrier_id, arrive_count)` is a CUDA named barrier over `arrive_count`
        threads; Metal's threadgroup_barrier waits for every thread, so a smaller count would hang."""
        if len(call.args) < 3:
            return
        count = call.args[2]
        if isinstance(count, tir.IntImm) and self.threads is not None and int(count.value) == self.threads:
            return
        shown = int(count.value) if isinstance(count, tir.IntImm) else str(count)
        whole = f"all {self.threads}" if self.threads is not None else "all"
        raise CodegenError(
            f"T.sync_threads(barrier_id={call.args[1]}, arrive_count={shown}): Metal has no named barriers over part of a "
            f"threadgroup, its threadgroup_barrier waits for {whole} threads; call T.sync_threads() where every thread reaches it"
        )

    def visit_BufferStore(self, stmt: Any) -> None:
        lanes = split_dtype(str(stmt.value.dtype))[1]
        if lanes > 4:
            raise CodegenError(f"a {lanes}-lane store to {stmt.buffer.name} reached the printer unsplit (legalize.SplitWideVectors must run first)")
        var = stmt.buffer.data
        index = stmt.indices[-1] if stmt.indices else tir.const(0, "int32")
        if len(stmt.indices) != 1:
            raise CodegenError(f"store to {stmt.buffer.name} is not flattened ({len(stmt.indices)} indices)")
        in_matrix = self.is_elided_cooperative(var) or self.is_simdgroup(var)
        if in_matrix and isinstance(stmt.value, tir.Broadcast):
            # a splat into matrix elements: one scalar store per element, no temporary vector
            for t in range(lanes):
                self.visit_BufferStore(tir.BufferStore(stmt.buffer, stmt.value.value, [self._lane_index(index, t)]))
            return
        value = self.expr(stmt.value)
        if in_matrix:
            self.store_matrix_elements(var, index, value, lanes, str(stmt.value.dtype))
            return
        self.emit(f"{self.access(var, index, lanes, str(stmt.buffer.dtype), store=True)} = {value};")

    def copy16(self, copy: intrinsics.Copy16) -> None:
        """A 16-byte move legalize.UseWideCopies proved aligned at both ends, as one `uint4`; in the
        packed flavour (element alignment), a copy of the 16-byte struct `tlm_run16<T>`."""
        if copy.aligned:
            unit = "uint4"
        else:
            self.support_code[RUN16] = RUN16_DECLARATION
            unit = f"{RUN16}<{msl_type(copy.dtype)}>"
        src_offset, dst_offset = self.storage_offset(copy.src, copy.src_offset, copy.dtype), self.storage_offset(copy.dst, copy.dst_offset, copy.dtype)
        load = f"*({self.space_of(copy.src)} {unit}*)({self.ref(copy.src)} + ({src_offset}))"
        self.emit(f"*({self.space_of(copy.dst)} {unit}*)({self.ref(copy.dst, store=True)} + ({dst_offset})) = {load};")

    def packed_access(self, packed: intrinsics.PackedAccess) -> str:
        """`*(device packed_half4*)(A + off)`: a vector at element alignment (intrinsics.PACKED_LOAD);
        `*(device half4*)(A + off)` in the aligned flavour."""
        var = packed.data
        if var not in self.device and var not in self.threadgroup:
            raise CodegenError(f"a packed vector access to {self.name_of(var)}, which is not a device buffer or threadgroup array")
        ref = self.ref(var, store=packed.value is not None)
        vector = msl_type(packed.dtype) if packed.aligned else f"packed_{msl_type(packed.dtype)}"
        return f"*({self.space_of(var)} {vector}*)({ref} + ({self.storage_offset(var, packed.offset, packed.dtype)}))"

    # ---------------------------------------------------------------- memory access
    def space_of(self, var: Any) -> str:
        if var in self.device:
            return "const device" if self.device[var][1] else "device"
        if var in self.threadgroup:
            return "threadgroup"
        return "thread"

    def elem_dtype(self, var: Any) -> str:
        if var in self.device:
            return self.device[var][0]
        if var in self.threadgroup:
            return self.threadgroup[var]
        if var in self.thread_arrays:
            return self.thread_arrays[var]
        raise CodegenError(f"buffer variable {var.name} is used before it is allocated")

    def ref(self, var: Any, *, store: bool = False) -> str:
        """The name of a buffer where the kernel accesses it, marked as a load or a store for the
        emulator's instrumented flavours (codegen/access_marks.py)."""
        name = self.name_of(var)
        return access_marks.store(name) if store else access_marks.load(name)

    def access(self, var: Any, index: Any, lanes: int, view_dtype: str | None = None, *, store: bool = False) -> str:
        name = self.name_of(var)
        ref = self.ref(var, store=store)
        elem = self.elem_dtype(var)
        if view_dtype is not None and view_dtype != elem and var in self.device:
            # `T.view(X, dtype=...)` of a parameter: the kernel's pointer keeps X's type.
            if tvm.DataType(view_dtype).bits != tvm.DataType(elem).bits:
                raise CodegenError(
                    f"{name}: a {view_dtype} view of a {elem} parameter changes the element size; the Metal "
                    "printer reinterprets parameters only as same-size types"
                )
            elem = view_dtype
            if lanes == 1:
                return f"*({self.space_of(var)} {msl_type(elem)}*)({ref} + ({self.offset(index)}))"
        elif view_dtype is not None and self.views_of(var) is not None and split_dtype(view_dtype)[0] != elem:
            # `T.view(X, dtype=...)` of threadgroup or thread storage: a pointer cast at the access,
            # the index scaled to storage elements (codegen/storage_views.py)
            elem = split_dtype(view_dtype)[0]
            if lanes == 1:
                return f"*({self.space_of(var)} {msl_type(elem)}*)({ref} + ({self.storage_offset(var, index, elem)}))"
            if not isinstance(index, tir.Ramp) or not (isinstance(index.stride, tir.IntImm) and int(index.stride.value) == 1):
                raise CodegenError(f"vector access to {name} with a non-contiguous index {index}")
            vec = msl_type(f"{elem}x{lanes}")
            return f"*({self.space_of(var)} {vec}*)({ref} + ({self.storage_offset(var, index.base, elem)}))"
        if lanes == 1:
            return f"{ref}[{self.offset(index)}]"
        if not isinstance(index, tir.Ramp) or not (isinstance(index.stride, tir.IntImm) and int(index.stride.value) == 1):
            raise CodegenError(f"vector access to {name} with a non-contiguous index {index}")
        vec = msl_type(f"{elem}x{lanes}")
        return f"*({self.space_of(var)} {vec}*)({ref} + ({self.offset(index.base)}))"

    def views_of(self, var: Any) -> ReinterpretedStorage | None:
        """How T.view reinterprets the threadgroup or thread storage `var` (None: one element type,
        or device memory, whose views keep the parameter's type)."""
        return None if var in self.device else self.reinterpreted.get(var)

    def storage_offset(self, var: Any, index: Any, dtype: str) -> str:
        """Element `index` of `dtype` as an offset in the elements `var` is declared with."""
        views = self.views_of(var)
        ratio = 1 if views is None else views.ratio(dtype)
        if ratio == 1:
            return self.offset(index)
        return str(int(index.value) * ratio) if isinstance(index, tir.IntImm) else f"{self.expr(index)} * {ratio}"

    def offset(self, index: Any) -> str:
        """An element offset: a sum prints without its outer parentheses (`A + (i + 4)`)."""
        text = self.expr(index)
        return text[1:-1] if isinstance(index, tir.Add) else text

    def pointer(self, addr: Any) -> str:
        """A matrix load/store address as `(buf + i)`: the only way device pointers are formed."""
        if isinstance(addr, tir.Call) and str(addr.op.name) == vocab.TIRX_ADDRESS_OF:
            load = addr.args[0]
            self.check_typed_pointer(load.buffer.data, str(load.buffer.dtype))
            return f"({self.ref(load.buffer.data)} + ({self.offset(load.indices[-1])}))"
        if isinstance(addr, tir.Call) and str(addr.op.name) == vocab.TIRX_TVM_ACCESS_PTR:
            self.check_typed_pointer(addr.args[1], str(addr.args[0].dtype))
            return f"({self.ref(addr.args[1])} + ({self.offset(addr.args[2])}))"
        raise CodegenError(f"unsupported pointer expression {addr}")

    def check_typed_pointer(self, var: Any, dtype: str) -> None:
        """A matrix load or store takes a pointer of its element type: none into storage declared
        as another (a T.view with another dtype)."""
        views = self.views_of(var)
        if views is not None and split_dtype(dtype)[0] != views.dtype:
            raise CodegenError(
                f"{views.name}: a matrix operation reads its {dtype} view, but the storage is declared {views.dtype} "
                f"(T.view reads it as {' and '.join(sorted(views.dtypes))}); T.copy the view into a {dtype} buffer of its own first"
            )


def print_kernel(func: Any, name: str, signature: str = STANDARD) -> tuple[str, set[str], set[str], dict[str, str], artifact.KernelRecord]:
    """(MSL text of one kernel function, the headers it includes, the math helpers it calls, other
    helper functions and declarations it needs by name, the kernel's record for the artifact)."""
    printer = KernelPrinter(func, name, signature)
    text, headers, helpers, record = printer.print_kernel()
    return text, headers, helpers, printer.support_code, record


def _with_live_ranges(record: artifact.KernelRecord, text: str) -> artifact.KernelRecord:
    """The record with the live lines of its thread arrays and cooperative tensors (codegen/liveness.py)."""
    tokens = {t.name: t.name for t in record.thread_arrays}
    tokens.update({n: c.name for c in record.cooperative_tensors for n in c.tensor_names()})
    ranges = live_ranges(text.split("\n"), tokens)
    return dataclasses.replace(
        record, thread_arrays=tuple(dataclasses.replace(t, live=ranges.get(t.name)) for t in record.thread_arrays),
        cooperative_tensors=tuple(dataclasses.replace(c, live=ranges.get(c.name)) for c in record.cooperative_tensors))


def _only_statement(stmt: Any) -> Any:
    """The one statement of `stmt` besides declarations and bindings hoisted in front of it
    (buffer declarations, `Bind`s of broadcast values), or None."""
    parts = list(stmt.seq) if isinstance(stmt, tir.SeqStmt) else [stmt]
    rest = [s for s in parts if not isinstance(s, (tir.DeclBuffer, tir.Bind))]
    return rest[0] if len(rest) == 1 else None
