"""MSL printer: one lowered device PrimFunc to one Metal kernel (the subset in docs/msl_contract.md).

Device buffers are accessed only as `A[i]` or `*(device T4*)(A + i)`, never through `&A[i]` or a
saved pointer: the Linux emulator relies on that to check every device access.
"""

from __future__ import annotations

import re
from typing import Any

from .._host import tir, tvm
from ..errors import CodegenError
from ..gemm.lane_layout import CT_DEST_ELEMS, CT_LEFT_ELEMS, CT_RIGHT_ELEMS
from ..gemm.tir_build import CT_MMA, SG_LOAD, SG_MMA, SG_STORE
from ..transform.block_swizzle import ORDER_NAMES, SWIZZLE_ATTR
from ..transform.simdgroup_indices import LANE_ID_NAME, SIMDGROUP_ID_NAME
from . import simd_collectives as simd
from .matrix_storage import MatrixStorage, analyze, sg_count
from .msl_types import float_literal, int_literal, msl_type, scalar_type, split_dtype

CT_OP = "__ct_op"
THREADGROUP_MEMORY_BYTES = 32 * 1024  # Apple GPUs: 32 KiB of threadgroup memory per threadgroup
BINARY_OPS = {
    tir.Add: "+",
    tir.Sub: "-",
    tir.Mul: "*",
    tir.Div: "/",
    tir.Mod: "%",
    tir.EQ: "==",
    tir.NE: "!=",
    tir.LT: "<",
    tir.LE: "<=",
    tir.GT: ">",
    tir.GE: ">=",
    tir.And: "&&",
    tir.Or: "||",
}
BIT_OPS = {
    "tirx.shift_right": ">>",
    "tirx.shift_left": "<<",
    "tirx.bitwise_and": "&",
    "tirx.bitwise_or": "|",
    "tirx.bitwise_xor": "^",
}
MATH_FUNCS = {
    "exp": "exp",
    "exp2": "exp2",
    "exp10": "exp10",
    "log": "log",
    "log2": "log2",
    "log10": "log10",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "tanh": "tanh",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "fabs": "fabs",
    "floor": "floor",
    "ceil": "ceil",
    "round": "round",
    "nearbyint": "rint",
    "trunc": "trunc",
    "pow": "pow",
    "fmod": "fmod",
    "atan2": "atan2",
    "isnan": "isnan",
    "isinf": "isinf",
    "isfinite": "isfinite",
    "fma": "fma",
    "copysign": "copysign",
}
POSITION_PARAMS = (
    ("blockIdx", "uint3", "threadgroup_position_in_grid"),
    ("__gridDim", "uint3", "threadgroups_per_grid"),
    ("threadIdx", "uint3", "thread_position_in_threadgroup"),
    (SIMDGROUP_ID_NAME, "uint", "simdgroup_index_in_threadgroup"),
    (LANE_ID_NAME, "ushort", "thread_index_in_simdgroup"),
)


def _pointee_dtype(var: Any) -> str:
    annotation = getattr(var, "type_annotation", None)
    element = getattr(annotation, "element_type", None)
    if element is None or not hasattr(element, "dtype"):
        raise CodegenError(f"kernel parameter {var.name} has no element type")
    return str(element.dtype)


class KernelPrinter:
    def __init__(self, func: Any, name: str):
        self.func = func
        self.name = name
        self.lines: list[str] = []
        self.prelude: list[str] = []  # kernel-scope declarations (threadgroup arrays, MPP op)
        self.indent = 1
        self.names: dict[Any, str] = {}
        self.used_names: set[str] = set()
        self.used_positions: set[str] = set()
        self.device: dict[Any, tuple[str, bool]] = {}  # data var -> (dtype, read-only)
        self.threadgroup: dict[Any, str] = {}
        self.thread_arrays: dict[Any, str] = {}
        self.storage: MatrixStorage = analyze(func.body)
        self.swizzle: tuple[int, int, int, int] | None = None
        self.declared: set = set()
        self.pos_users: dict[Any, str] = {}  # launch var -> "blockIdx" | "threadIdx" (the attribute it needs)
        self.analyzer = tvm.arith.Analyzer()
        self.uses_ct_op = False
        self.hoisted: dict[str, str] = {}  # position-only offset text -> __off<N>
        self._position_memo: dict[int, tuple[Any, bool]] = {}
        self._expr_memo: dict[int, tuple[Any, str]] = {}
        self.tmp = 0

    # ---------------------------------------------------------------- naming
    def name_of(self, var: Any) -> str:
        if var in self.names:
            return self.names[var]
        hint = str(var.name)
        if hint in (SIMDGROUP_ID_NAME, LANE_ID_NAME):
            self.used_positions.add(hint)
            self.names[var] = f"((int){hint})"
            return self.names[var]
        base = re.sub(r"\W", "_", hint) or "v"
        if base[0].isdigit():
            base = "v_" + base
        candidate, k = base, 1
        while candidate in self.used_names or candidate in ("blockIdx", "threadIdx", "half", "float", "int", "kernel", "device"):
            candidate, k = f"{base}_{k}", k + 1
        self.used_names.add(candidate)
        self.names[var] = candidate
        return candidate

    def fresh(self, base: str) -> str:
        self.tmp += 1
        return f"__{base}{self.tmp}"

    def emit(self, text: str) -> None:
        self.lines.append("  " * self.indent + text)

    # ---------------------------------------------------------------- top level
    def print_kernel(self, banner: str) -> str:
        func = self.func
        attrs = func.attrs
        readonly = {int(i) for i in attrs.get("tl.readonly_param_indices", [])} if attrs is not None else set()
        non_restrict = {str(getattr(v, "name", v)) for v in (attrs.get("tl.non_restrict_params", []) if attrs else [])}
        params = []
        for index, var in enumerate(func.params):
            name = self.name_of(var)
            if var.dtype == "handle":
                dtype = _pointee_dtype(var)
                ro = index in readonly
                self.device[var] = (dtype, ro)
                restrict = "" if name in non_restrict else " __restrict"
                qual = "const device" if ro else "device"
                params.append(f"{qual} {msl_type(dtype)}*{restrict} {name} [[ buffer({index}) ]]")
            else:
                params.append(f"constant {msl_type(str(var.dtype))}& {name} [[ buffer({index}) ]]")
        threads = 1
        extents = attrs.get("thread_extent", {}) if attrs is not None else {}
        for tag, extent in extents.items():
            if str(tag).startswith("threadIdx"):
                threads *= int(extent)

        self.visit(func.body)
        self.check_threadgroup_budget()
        if self.swizzle is not None:
            self.used_positions.add("blockIdx")
        for name, ty, attr in POSITION_PARAMS:
            if name in self.used_positions:
                pname = "__physical_blockIdx" if (name == "blockIdx" and self.swizzle is not None) else name
                params.append(f"{ty} {pname} [[{attr}]]")
        head = [
            banner,
            "#include <metal_stdlib>",
            "#include <metal_simdgroup>",
        ]
        if self.storage.uses_cooperative_tensors:
            head.append("#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>")
        head += ["using namespace metal;", ""]
        sig = f"[[kernel, max_total_threads_per_threadgroup({threads})]] void {self.name}(\n  " + ",\n  ".join(params) + ") {"
        hoisted = [f"  const int {name} = {text};" for text, name in self.hoisted.items()]
        body = self.swizzle_prelude() + ["  " + line for line in self.prelude] + hoisted + self.lines
        return "\n".join(head + [sig] + body + ["}", ""])

    def check_threadgroup_budget(self) -> None:
        used = sum(
            info.count * (int(tvm.DataType(info.dtype).bits) // 8)
            for info in self.storage.allocs.values()
            if info.scope.startswith("shared")
        )
        if used > THREADGROUP_MEMORY_BYTES:
            raise CodegenError(
                f"kernel {self.name} needs {used} bytes of threadgroup memory; Metal allows {THREADGROUP_MEMORY_BYTES} "
                "(32 KiB). Use smaller shared tiles, fewer pipeline stages, or the direct-global GEMM (no staging)."
            )

    def swizzle_prelude(self) -> list[str]:
        if self.swizzle is None:
            return []
        order, panel, tiles_x, tiles_y = self.swizzle
        p = "__physical_blockIdx"
        lines = [f"  // block swizzle ({ORDER_NAMES[order]}, panel {panel}): physical -> logical tile, once"]
        if order == 0:
            log = panel.bit_length() - 1
            lines.append(f"  const uint3 blockIdx = uint3({p}.x >> {log}, ({p}.y << {log}) + ({p}.x & {panel - 1}u), {p}.z);")
            lines.append(f"  if (blockIdx.y >= {tiles_y}u) return;  // padding threadgroup of the swizzled grid")
            return lines
        # serpentine panels of `panel` tile rows (row order) or tile columns (column order)
        major, minor = (tiles_x, tiles_y) if order == 1 else (tiles_y, tiles_x)
        lines += [
            f"  const uint __t = {p}.y * {tiles_x}u + {p}.x;",
            f"  const uint __panel = __t / {panel * major}u, __o = __t % {panel * major}u;",
            f"  const uint __h = min({panel}u, {minor}u - __panel * {panel}u);",
            f"  const uint __along = (__panel & 1u) ? {major - 1}u - __o / __h : __o / __h;",
            f"  const uint __across = __panel * {panel}u + __o % __h;",
        ]
        if order == 1:
            lines.append(f"  const uint3 blockIdx = uint3(__along, __across, {p}.z);")
        else:
            lines.append(f"  const uint3 blockIdx = uint3(__across, __along, {p}.z);")
        return lines

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
        key = str(stmt.attr_key)
        if key == "thread_extent":
            iv = stmt.node
            tag = str(iv.thread_tag)
            if tag.startswith("blockIdx"):
                self.names[iv.var] = f"((int)blockIdx.{tag[-1]})"
                self.pos_users.setdefault(iv.var, "blockIdx")
            elif tag.startswith("threadIdx"):
                self.names[iv.var] = f"((int)threadIdx.{tag[-1]})"
                self.pos_users.setdefault(iv.var, "threadIdx")
        elif key == SWIZZLE_ATTR:
            order, panel, tiles_x, tiles_y = (int(v) for v in stmt.value.args)
            self.swizzle = (order, panel, tiles_x, tiles_y)
        self.visit(stmt.body)

    def visit_AllocBuffer(self, stmt: Any) -> None:
        buf = stmt.buffer
        var = buf.data
        if var in self.declared:
            return  # unrolled copies of a loop body re-allocate the same scratch array
        self.declared.add(var)
        info = self.storage.allocs[var]
        scope = info.scope
        name = self.name_of(var)
        ty = msl_type(info.dtype)
        if scope.startswith("shared"):
            self.threadgroup[var] = info.dtype
            self.prelude.append(f"threadgroup {ty} {name}[{info.count}];")
        elif var in self.storage.cooperative:
            self.declare_cooperative_accumulator(var, name)
        elif var in self.storage.simdgroup:
            self.thread_arrays[var] = info.dtype
            base = scalar_type(info.dtype)
            self.emit(f"simdgroup_{base}8x8 {name}[{sg_count(info)}];")
        elif scope in ("local", "local.var", "local.fragment", "metal.simdgroup"):
            self.thread_arrays[var] = info.dtype
            self.emit(f"{ty} {name}[{info.count}];")
        else:
            raise CodegenError(f"buffer {buf.name} has storage scope {scope}, which Metal kernels cannot allocate")

    def visit_DeclBuffer(self, stmt: Any) -> None:
        return None

    def visit_Bind(self, stmt: Any) -> None:
        var, value = stmt.var, stmt.value
        if str(var.dtype) == "handle":
            self.bind_pointer(var, value)
            return
        self.emit(f"const {msl_type(str(var.dtype))} {self.name_of(var)} = {self.expr(value)};")

    def bind_pointer(self, var: Any, value: Any) -> None:
        """A typed view into merged threadgroup memory: `T* X = (T*)(pool + byte_offset)`."""
        if not (isinstance(value, tir.Call) and str(value.op.name) == "tirx.handle_add_byte_offset"):
            raise CodegenError(f"unsupported pointer binding {var.name} = {value}")
        pool, offset = value.args
        if pool not in self.threadgroup:
            raise CodegenError(f"pointer {var.name} must point into threadgroup memory")
        dtype = _pointee_dtype(var)
        self.threadgroup[var] = dtype
        ty = msl_type(dtype)
        self.prelude.append(f"threadgroup {ty}* {self.name_of(var)} = (threadgroup {ty}*)({self.name_of(pool)} + {self.expr(offset)});")

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
        self.emit(f"if ({self.expr(stmt.condition)}) {{")
        self.indent += 1
        self.visit(stmt.then_case)
        self.indent -= 1
        if stmt.else_case is not None:
            self.emit("} else {")
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
        if isinstance(value, tir.Call):
            if self.statement_call(value):
                return
        self.emit(self.expr(value) + ";")

    def visit_BufferStore(self, stmt: Any) -> None:
        lanes = split_dtype(str(stmt.value.dtype))[1]
        if lanes > 4:
            # Metal vectors stop at 4 lanes: store 8- or 16-lane vectors (128-bit copies) in 4-lane parts.
            if lanes % 4:
                raise CodegenError(f"cannot split a {lanes}-lane store to {stmt.buffer.name} into Metal vectors")
            for start in range(0, lanes, 4):
                part = tir.BufferStore(stmt.buffer, slice_lanes(stmt.value, start, 4), [slice_lanes(stmt.indices[-1], start, 4)])
                self.visit_BufferStore(part)
            return
        var = stmt.buffer.data
        index = stmt.indices[-1] if stmt.indices else tir.const(0, "int32")
        if len(stmt.indices) != 1:
            raise CodegenError(f"store to {stmt.buffer.name} is not flattened ({len(stmt.indices)} indices)")
        lanes = split_dtype(str(stmt.value.dtype))[1]
        if isinstance(stmt.value, tir.Broadcast) and (var in self.storage.simdgroup or var in self.storage.cooperative):
            # a splat into matrix elements: one scalar store per element, no temporary vector
            for t in range(lanes):
                self.visit_BufferStore(tir.BufferStore(stmt.buffer, stmt.value.value, [self._lane_index(index, t)]))
            return
        value = self.expr(stmt.value)
        if var in self.storage.cooperative and self.storage.cooperative[var].elided:
            self.store_ct_elements(var, index, value, lanes, str(stmt.value.dtype))
            return
        if var in self.storage.simdgroup:
            self.store_sg_elements(var, index, value, lanes, str(stmt.value.dtype))
            return
        self.emit(f"{self.access(var, index, lanes)} = {value};")

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
        if var in self.storage.allocs:
            return self.storage.allocs[var].dtype
        raise CodegenError(f"buffer variable {var.name} is used before it is allocated")

    def access(self, var: Any, index: Any, lanes: int) -> str:
        name = self.name_of(var)
        if lanes == 1:
            return f"{name}[{self.offset(var, index)}]"
        if not isinstance(index, tir.Ramp) or not (isinstance(index.stride, tir.IntImm) and int(index.stride.value) == 1):
            raise CodegenError(f"vector access to {name} with a non-contiguous index {index}")
        vec = msl_type(f"{self.elem_dtype(var)}x{lanes}")
        return f"*({self.space_of(var)} {vec}*)({name} + ({self.offset(var, index.base)}))"

    def offset(self, var: Any, index: Any) -> str:
        """An element offset into device or threadgroup memory, with its position-only part hoisted.

        The terms of the offset that depend only on the threadgroup and simdgroup position
        (blockIdx, simdgroup id, lane) are the same in every iteration: they are computed once at
        the top of the kernel (`__off<N>`), so the hot loops read `A + (__off0 + k_outer * 16 + 1024)`.
        """
        if var not in self.device and var not in self.threadgroup:
            return self.expr(index)
        terms = _add_terms(index)
        fixed = [t for t in terms if not isinstance(t, tir.IntImm) and self._position_only(t)]
        if not fixed:
            return self.expr(index)
        rest = [t for t in terms if not any(t.same_as(f) for f in fixed)]
        key = " + ".join(self.expr(t) for t in fixed)
        name = self.hoisted.get(key)
        if name is None:
            name = f"__off{len(self.hoisted)}"
            self.hoisted[key] = name
        return " + ".join([name] + [self.expr(t) for t in rest])

    def _position_only(self, e: Any) -> bool:
        """True when `e` depends on threadgroup / simdgroup / lane position and nothing else (a
        buffer load would bring its buffer's data var, which is not a position)."""
        key = e.__hash__()  # object identity, kept alive in the memo (see expr)
        hit = self._position_memo.get(key)
        if hit is None:
            free = tvm.tirx.analysis.undefined_vars(e, [])
            known = bool(free) and all(v in self.pos_users or str(v.name) in (SIMDGROUP_ID_NAME, LANE_ID_NAME) for v in free)
            hit = (e, known)
            self._position_memo[key] = hit
        return hit[1]

    def ct_element(self, var: Any, flat: int) -> str:
        return f"{self.name_of(var)}_ct{flat // CT_DEST_ELEMS}[{flat % CT_DEST_ELEMS}]"

    def _const_elements(self, index: Any, lanes: int) -> list[int]:
        base = index.base if isinstance(index, tir.Ramp) else index
        stride = int(index.stride.value) if isinstance(index, tir.Ramp) else 0
        return [int(base.value) + stride * t for t in range(lanes)]

    def store_ct_elements(self, var: Any, index: Any, value: str, lanes: int, dtype: str) -> None:
        elems = self._const_elements(index, lanes)
        if lanes == 1:
            self.emit(f"{self.ct_element(var, elems[0])} = {value};")
            return
        tmp = self.fresh("v")
        self.emit(f"{{ const {msl_type(dtype)} {tmp} = {value};")
        for t, flat in enumerate(elems):
            self.emit(f"  {self.ct_element(var, flat)} = {tmp}[{t}];")
        self.emit("}")

    def sg_element(self, var: Any, index: Any) -> str:
        name = self.name_of(var)
        if isinstance(index, tir.IntImm):
            i = int(index.value)
            return f"{name}[{i // 2}].thread_elements()[{i % 2}]"
        text = self.expr(index)
        return f"{name}[({text}) >> 1].thread_elements()[({text}) & 1]"

    def store_sg_elements(self, var: Any, index: Any, value: str, lanes: int, dtype: str) -> None:
        if lanes == 1:
            self.emit(f"{self.sg_element(var, index)} = {value};")
            return
        tmp = self.fresh("v")
        self.emit(f"{{ const {msl_type(dtype)} {tmp} = {value};")
        for t in range(lanes):
            self.emit(f"  {self.sg_element(var, self._lane_index(index, t))} = {tmp}[{t}];")
        self.emit("}")

    def _lane_index(self, index: Any, t: int) -> Any:
        return self.analyzer.simplify(index.base + index.stride * t)

    # ---------------------------------------------------------------- matrix intrinsics
    def declare_cooperative_accumulator(self, var: Any, name: str) -> None:
        acc = self.storage.cooperative[var]
        self.ensure_ct_op()
        a, b = scalar_type(acc.a_dtype), scalar_type(acc.b_dtype)
        dest = (
            f"{CT_OP}.get_destination_cooperative_tensor<decltype({CT_OP}.get_left_input_cooperative_tensor<{a}, {b}, float>()), "
            f"decltype({CT_OP}.get_right_input_cooperative_tensor<{a}, {b}, float>()), float>()"
        )
        if acc.elided:
            for chunk in range(acc.chunks):
                self.emit(f"auto {name}_ct{chunk} = {dest};")
        else:
            self.thread_arrays[var] = "float32"
            self.emit(f"float {name}[{acc.count}];")

    def ensure_ct_op(self) -> None:
        if self.uses_ct_op:
            return
        self.uses_ct_op = True
        self.prelude.append(
            "constexpr auto __ct_desc = mpp::tensor_ops::matmul2d_descriptor(16, 32, 16, false, false, true, "
            "mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);"
        )
        self.prelude.append(f"mpp::tensor_ops::matmul2d<__ct_desc, metal::execution_simdgroup> {CT_OP};")

    def statement_call(self, call: Any) -> bool:
        op = str(call.op.name)
        if op == "tirx.tvm_storage_sync":
            scope = str(call.args[0].value)
            if scope in ("shared", "shared.dyn"):
                self.emit("threadgroup_barrier(mem_flags::mem_threadgroup);")
            elif scope == "warp":
                self.emit("simdgroup_barrier(mem_flags::mem_none);")
            else:
                self.emit("threadgroup_barrier(mem_flags::mem_device);")
            return True
        if op == "tirx.simdgroup_store" or op == "tirx.simdgroup_load":
            x, index, addr, stride, _rows, _cols, transpose = call.args
            verb = op.split(".")[1]
            self.emit(f"{verb}({self.name_of(x)}[{self.expr(index)}], {self.pointer(addr)}, {self.expr(stride)}, ulong2(0, 0), {self.expr(transpose)});")
            return True
        if op == "tirx.make_filled_simdgroup_matrix":
            x, index, value = call.args[:3]
            ty = scalar_type(self.elem_dtype(x))
            self.emit(f"{self.name_of(x)}[{self.expr(index)}] = make_filled_simdgroup_matrix<{ty}, 8, 8>({self.expr(value)});")
            return True
        if op == "tirx.simdgroup_multiply_accumulate":
            d, di, a, ai, b, bi, c, ci = call.args
            self.emit(
                f"simdgroup_multiply_accumulate({self.name_of(d)}[{self.expr(di)}], {self.name_of(a)}[{self.expr(ai)}], "
                f"{self.name_of(b)}[{self.expr(bi)}], {self.name_of(c)}[{self.expr(ci)}]);"
            )
            return True
        if op in ("tirx.call_extern", "tirx.call_pure_extern"):
            name = str(call.args[0].value)
            args = list(call.args[1:])
            if name == CT_MMA:
                self.emit_ct_mma(*args)
                return True
            if name == SG_MMA:
                c, ci, a, ai, b, bi = args
                cn, an, bn = self.name_of(c), self.name_of(a), self.name_of(b)
                cx, ax, bx = self.expr(ci), self.expr(ai), self.expr(bi)
                self.emit(f"simdgroup_multiply_accumulate({cn}[{cx}], {an}[{ax}], {bn}[{bx}], {cn}[{cx}]);")
                return True
            if name == SG_LOAD:
                x, f, addr, stride, transpose = args
                self.emit(
                    f"simdgroup_load({self.name_of(x)}[{self.expr(f)}], {self.pointer(addr)}, {self.expr(stride)}, ulong2(0, 0), {self.expr(transpose)});"
                )
                return True
            if name == SG_STORE:
                x, f, addr, stride = args
                self.emit(f"simdgroup_store({self.name_of(x)}[{self.expr(f)}], {self.pointer(addr)}, {self.expr(stride)}, ulong2(0, 0), false);")
                return True
        return False

    def emit_ct_mma(self, c: Any, chunk: Any, a: Any, a_off: Any, b: Any, b_off: Any) -> None:
        acc = self.storage.cooperative[c]
        ta, tb = scalar_type(acc.a_dtype), scalar_type(acc.b_dtype)
        an, bn, cn = self.name_of(a), self.name_of(b), self.name_of(c)
        ao, bo = self.expr(a_off), self.expr(b_off)
        self.emit("{")
        self.indent += 1
        self.emit(f"auto __ct_a = {CT_OP}.get_left_input_cooperative_tensor<{ta}, {tb}, float>();")
        self.emit(f"auto __ct_b = {CT_OP}.get_right_input_cooperative_tensor<{ta}, {tb}, float>();")
        self.emit("#pragma clang loop unroll(full)")
        self.emit(f"for (ushort __i = 0; __i < {CT_LEFT_ELEMS}; ++__i) __ct_a[__i] = {an}[{ao} + __i];")
        self.emit("#pragma clang loop unroll(full)")
        self.emit(f"for (ushort __i = 0; __i < {CT_RIGHT_ELEMS}; ++__i) __ct_b[__i] = {bn}[{bo} + __i];")
        if acc.elided:
            if not isinstance(chunk, tir.IntImm):
                raise CodegenError("cooperative tensor accumulator chunk index must be constant")
            self.emit(f"{CT_OP}.run(__ct_a, __ct_b, {cn}_ct{int(chunk.value)});")
        else:
            base = f"({self.expr(chunk)}) * {CT_DEST_ELEMS}"
            self.emit(
                f"auto __ct_c = {CT_OP}.get_destination_cooperative_tensor<decltype(__ct_a), decltype(__ct_b), float>();"
            )
            self.emit(f"for (ushort __i = 0; __i < {CT_DEST_ELEMS}; ++__i) __ct_c[__i] = {cn}[{base} + __i];")
            self.emit(f"{CT_OP}.run(__ct_a, __ct_b, __ct_c);")
            self.emit(f"for (ushort __i = 0; __i < {CT_DEST_ELEMS}; ++__i) {cn}[{base} + __i] = __ct_c[__i];")
        self.indent -= 1
        self.emit("}")

    def pointer(self, addr: Any) -> str:
        """A matrix load/store address as `(buf + i)`: the only way device pointers are formed."""
        if isinstance(addr, tir.Call) and str(addr.op.name) == "tirx.address_of":
            load = addr.args[0]
            return f"({self.name_of(load.buffer.data)} + ({self.offset(load.buffer.data, load.indices[-1])}))"
        if isinstance(addr, tir.Call) and str(addr.op.name) == "tirx.tvm_access_ptr":
            return f"({self.name_of(addr.args[1])} + ({self.offset(addr.args[1], addr.args[2])}))"
        raise CodegenError(f"unsupported pointer expression {addr}")

    # ---------------------------------------------------------------- expressions
    def expr(self, e: Any) -> str:
        if isinstance(e, (int, bool)):
            return str(int(e))
        # IR is immutable and shares subtrees: print each object once. The key is the object's
        # identity; the memo keeps the object alive so its address cannot be reused meanwhile.
        key = e.__hash__()
        hit = self._expr_memo.get(key)
        if hit is None:
            hit = (e, self._print_expr(e))
            self._expr_memo[key] = hit
        return hit[1]

    def _print_expr(self, e: Any) -> str:
        method = getattr(self, "expr_" + type(e).__name__, None)
        if method is not None:
            return method(e)
        op = BINARY_OPS.get(type(e))
        if op is not None:
            return f"({self.expr(e.a)} {op} {self.expr(e.b)})"
        raise CodegenError(f"the Metal printer does not support {type(e).__name__} expressions: {e}")

    def expr_IntImm(self, e: Any) -> str:
        return int_literal(int(e.value), str(e.dtype))

    def expr_FloatImm(self, e: Any) -> str:
        return float_literal(float(e.value), str(e.dtype))

    def expr_StringImm(self, e: Any) -> str:
        return '"' + str(e.value).replace('"', '\\"') + '"'

    def expr_Var(self, e: Any) -> str:
        name = self.name_of(e)
        if e in self.pos_users:
            self.used_positions.add(self.pos_users[e])
        return name

    expr_SizeVar = expr_Var

    def expr_Cast(self, e: Any) -> str:
        ty = msl_type(str(e.dtype))
        if split_dtype(str(e.dtype))[1] > 1:
            return f"{ty}({self.expr(e.value)})"  # MSL converts vectors through constructors
        return f"(({ty})({self.expr(e.value)}))"

    def expr_Not(self, e: Any) -> str:
        return f"(!{self.expr(e.a)})"

    def expr_Min(self, e: Any) -> str:
        return f"min({self.expr(e.a)}, {self.expr(e.b)})"

    def expr_Max(self, e: Any) -> str:
        return f"max({self.expr(e.a)}, {self.expr(e.b)})"

    def expr_FloorDiv(self, e: Any) -> str:
        if "float" in str(e.dtype):
            return f"floor({self.expr(e.a)} / {self.expr(e.b)})"
        raise CodegenError(f"integer floordiv reached the printer unlowered: {e}")

    def expr_FloorMod(self, e: Any) -> str:
        raise CodegenError(f"floormod reached the printer unlowered: {e}")

    def choose(self, cond: Any, true_value: Any, false_value: Any) -> str:
        c, t, f = self.expr(cond), self.expr(true_value), self.expr(false_value)
        if split_dtype(str(cond.dtype))[1] > 1:
            return f"select({f}, {t}, {c})"  # lane-wise: MSL's ternary takes a scalar condition only
        return f"({c} ? {t} : {f})"

    def expr_Select(self, e: Any) -> str:
        return self.choose(e.condition, e.true_value, e.false_value)

    def expr_Broadcast(self, e: Any) -> str:
        return f"{msl_type(str(e.dtype))}({self.expr(e.value)})"

    def expr_Ramp(self, e: Any) -> str:
        lanes = split_dtype(str(e.dtype))[1]
        parts = [f"{self.expr(e.base)} + {self.expr(e.stride)} * {t}" for t in range(lanes)]
        return f"{msl_type(str(e.dtype))}({', '.join(parts)})"

    def expr_Shuffle(self, e: Any) -> str:
        raise CodegenError("vector shuffles are not supported by the Metal printer")

    def expr_Let(self, e: Any) -> str:
        raise CodegenError("expression-level let bindings are not supported by the Metal printer (run LetInline)")

    def expr_BufferLoad(self, e: Any) -> str:
        var = e.buffer.data
        index = e.indices[-1]
        lanes = split_dtype(str(e.dtype))[1]
        if var in self.storage.cooperative and self.storage.cooperative[var].elided:
            elems = self._const_elements(index, lanes)
            parts = [self.ct_element(var, flat) for flat in elems]
            return parts[0] if lanes == 1 else f"{msl_type(str(e.dtype))}({', '.join(parts)})"
        if var in self.storage.simdgroup:
            if lanes == 1:
                return self.sg_element(var, index)
            parts = [self.sg_element(var, self._lane_index(index, t)) for t in range(lanes)]
            return f"{msl_type(str(e.dtype))}({', '.join(parts)})"
        return self.access(var, index, lanes)

    # ---------------------------------------------------------------- warp-level calls
    WARP_SHUFFLES = {
        # op -> (collective, value arg, lane / delta / mask arg, width arg or None for a whole simdgroup)
        "tl.shfl_xor_sync": ("xor", 1, 2, 3),
        "tl.shfl_down_sync": ("down", 1, 2, 3),
        "tl.shfl_up_sync": ("up", 1, 2, 3),
        "tl.shfl_sync": ("index", 1, 2, 3),
        "tirx.tvm_warp_shuffle": ("index", 1, 2, 3),
        "tirx.tvm_warp_shuffle_down": ("down", 1, 2, 3),
        "tirx.tvm_warp_shuffle_up": ("up", 1, 2, 3),
        "tirx.metal.simd_shuffle": ("index", 0, 1, None),
        "tirx.metal.simd_shuffle_down": ("down", 0, 1, None),
        "tirx.metal.simd_shuffle_up": ("up", 0, 1, None),
    }

    def warp_call(self, op: str, e: Any) -> str | None:
        """CUDA-style warp shuffles / reductions / votes as simdgroup collectives (simd_collectives.py);
        None when `op` is not one of them."""
        args = e.args
        if op in self.WARP_SHUFFLES:
            kind, value_at, arg_at, width_at = self.WARP_SHUFFLES[op]
            dtype = str(args[value_at].dtype)
            if dtype.endswith("64"):
                raise CodegenError(f"{op} on {dtype}: Metal simd shuffles take 8- to 32-bit values; shuffle the halves as 32-bit values")
            width: int | str = simd.SIMD_WIDTH
            if width_at is not None:
                w = args[width_at]
                if isinstance(w, tir.IntImm):
                    try:
                        simd.check_width(int(w.value))
                    except ValueError as err:
                        raise CodegenError(f"{op}: {err}") from None
                    width = int(w.value)
                else:
                    width = f"({self.expr(w)})"
            self.used_positions.add(LANE_ID_NAME)
            lane = f"((int){LANE_ID_NAME})"
            build = {"xor": simd.shuffle_xor, "down": simd.shuffle_down, "up": simd.shuffle_up, "index": simd.shuffle_index}[kind]
            return build(self.expr(args[value_at]), self.expr(args[arg_at]), width, lane)
        if op.startswith("tl.warp_reduce_"):
            kind = op[len("tl.warp_reduce_") :]
            if kind not in simd.WARP_REDUCTIONS:
                raise CodegenError(f"{op} has no Metal simdgroup equivalent")
            return simd.warp_reduce(kind, self.expr(args[0]))
        if op in ("tl.any_sync", "tl.all_sync"):
            vote = "simd_any" if op == "tl.any_sync" else "simd_all"
            return f"((int){vote}(({self.expr(args[1])}) != 0))"
        if op in ("tl.ballot_sync", "tl.ballot"):
            predicate = self.expr(args[-1])
            return f"((ulong)((simd_vote::vote_t)simd_ballot(({predicate}) != 0)))"
        if op == "tl.sync_warp":
            return "simdgroup_barrier(mem_flags::mem_none)"
        if op in ("tirx.tvm_warp_activemask", "tl.activemask"):
            return "0xffffffffu"
        if op == "tirx.tvm_thread_allreduce":
            raise CodegenError("tvm_thread_allreduce reached the Metal printer unlowered (LowerThreadAllreduce must run first)")
        return None

    def expr_Call(self, e: Any) -> str:
        op = str(e.op.name)
        args = e.args
        if op in BIT_OPS:
            return f"({self.expr(args[0])} {BIT_OPS[op]} {self.expr(args[1])})"
        if op == "tirx.bitwise_not":
            return f"(~{self.expr(args[0])})"
        if op == "tirx.if_then_else":
            return self.choose(args[0], args[1], args[2])
        if op == "tirx.likely":
            return self.expr(args[0])
        if op == "tirx.reinterpret":
            return f"as_type<{msl_type(str(e.dtype))}>({self.expr(args[0])})"
        if op in ("tirx.call_extern", "tirx.call_pure_extern"):
            name = str(args[0].value)
            return f"{name}({', '.join(self.expr(a) for a in args[1:])})"
        if op in ("tirx.address_of", "tirx.tvm_access_ptr"):
            return self.pointer(e)
        warp = self.warp_call(op, e)
        if warp is not None:
            return warp
        if op.startswith("tirx."):
            short = op[len("tirx.") :]
            if short in MATH_FUNCS:
                return f"metal::{MATH_FUNCS[short]}({', '.join(self.expr(a) for a in args)})"
            if short == "sigmoid":
                x = self.expr(args[0])
                return f"(1.0f / (1.0f + metal::exp(-({x}))))"
        raise CodegenError(f"the Metal printer does not support the call {op}: {e}")


def _add_terms(e: Any) -> list[Any]:
    if isinstance(e, tir.Add):
        return _add_terms(e.a) + _add_terms(e.b)
    return [e]


def _with_lanes(dtype: str, lanes: int) -> str:
    base, _ = split_dtype(dtype)
    return base if lanes == 1 else f"{base}x{lanes}"


def slice_lanes(e: Any, start: int, n: int) -> Any:
    """Lanes [start, start+n) of a vector expression, rebuilt from its parts."""
    if isinstance(e, tir.Ramp):
        return tir.Ramp(e.base + e.stride * start, e.stride, n)
    if isinstance(e, tir.Broadcast):
        return tir.Broadcast(e.value, n)
    if isinstance(e, tir.BufferLoad):
        return tir.BufferLoad(e.buffer, [*e.indices[:-1], slice_lanes(e.indices[-1], start, n)])
    if isinstance(e, tir.Cast):
        return tir.Cast(_with_lanes(str(e.dtype), n), slice_lanes(e.value, start, n))
    if type(e) in BINARY_OPS or isinstance(e, (tir.Min, tir.Max)):
        return type(e)(slice_lanes(e.a, start, n), slice_lanes(e.b, start, n))
    if isinstance(e, tir.Select):
        return tir.Select(slice_lanes(e.condition, start, n), slice_lanes(e.true_value, start, n), slice_lanes(e.false_value, start, n))
    if isinstance(e, tir.Call) and str(e.op.name) == "tirx.if_then_else":
        args = [slice_lanes(a, start, n) if split_dtype(str(a.dtype))[1] > 1 else a for a in e.args]
        return tir.if_then_else(*args)
    if split_dtype(str(e.dtype))[1] == 1:
        return e
    raise CodegenError(f"cannot split the {e.dtype} expression {type(e).__name__} into Metal vectors")


def print_kernel(func: Any, name: str, banner: str) -> str:
    return KernelPrinter(func, name).print_kernel(banner)
