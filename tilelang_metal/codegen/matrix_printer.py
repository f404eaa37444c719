"""Printing of matrix storage and matrix operations: MPP cooperative tensors and simdgroup matrices.

A mixin of the kernel printer. Which arrays are matrix objects was decided before codegen
(transform/matrix_storage.py); this module only spells the decisions in MSL:
- an elided cooperative accumulator is one destination tensor per fragment (`C_ct0`, `C_ct1`, ...),
  element `f * dest_elems + e` being element `e` of tensor `f`;
- a simdgroup array is `simdgroup_T8x8 X[n]`, element `2f + e` of a lane-layout array being
  `X[f].thread_elements()[e]`.
The spellings (the matmul2d descriptor, the simdgroup matrix type) and the element counts come from
the storage decision's instruction (`isa.MatrixInstruction.msl`, its operand roles).
"""

from __future__ import annotations

from typing import Any

from ..core import intrinsics
from ..host import tir
from ..errors import CodegenError
from ..target.isa import MatrixInstruction
from ..core.ir_attrs import COOPERATIVE_TENSOR_STORAGE, SIMDGROUP_MATRIX_STORAGE, MatrixStorage
from .artifact import CooperativeTensorDecl, ThreadArrayDecl
from .msl_types import msl_type, scalar_type


class MatrixPrinting:
    """Needs from the host printer: `emit`, `expr`, `name_of`, `pointer`, `fresh`, `prelude`,
    `simplify`, `storage` (data var -> MatrixStorage), `mpp_ops` ((instruction key, relaxed) declared so far),
    `thread_array` (declare a thread array through its record), `cooperative_tensors` (record an
    accumulator's destination tensors) and `uses_instruction` (record an instruction)."""

    storage: dict[Any, MatrixStorage]
    mpp_ops: list[tuple[str, bool]]

    # ---------------------------------------------------------------- storage
    def matrix_storage(self, var: Any) -> MatrixStorage | None:
        return self.storage.get(var)

    def is_elided_cooperative(self, var: Any) -> bool:
        s = self.storage.get(var)
        return s is not None and s.kind == COOPERATIVE_TENSOR_STORAGE and s.elided

    def is_simdgroup(self, var: Any) -> bool:
        s = self.storage.get(var)
        return s is not None and s.kind == SIMDGROUP_MATRIX_STORAGE

    def declare_matrix(self, var: Any, name: str, dtype: str) -> bool:
        """Declare `var` as matrix objects if the storage pass chose so; False otherwise."""
        s = self.storage.get(var)
        if s is None:
            return False
        inst = s.instruction
        self.uses_instruction(inst.name)
        if s.kind == SIMDGROUP_MATRIX_STORAGE:
            matrix = inst.msl.format(scalar=scalar_type(dtype), rows=inst.m, cols=inst.n)
            self.thread_array(ThreadArrayDecl(name, matrix, s.matrices))
            return True
        op = self.mpp_op(inst, s.a_dtype, s.b_dtype)
        if not s.elided:
            return False  # an ordinary float array; each run copies its chunk in and out
        a, b = scalar_type(s.a_dtype), scalar_type(s.b_dtype)
        dest = (
            f"{op}.get_destination_cooperative_tensor<decltype({op}.get_left_input_cooperative_tensor<{a}, {b}, float>()), "
            f"decltype({op}.get_right_input_cooperative_tensor<{a}, {b}, float>()), float>()"
        )
        decl = CooperativeTensorDecl(name, "float", s.matrices, inst.dest_elems, inst.name)
        self.cooperative_tensors(decl)
        for tensor in decl.tensor_names():
            self.emit(f"auto {tensor} = {dest};")
        return True

    def mpp_op(self, inst: MatrixInstruction, a_dtype: str, b_dtype: str) -> str:
        """The kernel-scope matmul2d object of this instruction and precision (declared once). Its
        descriptor is exact unless the lowering's `LoweringOptions.matmul_relaxed` allows relaxed precision for
        these input types (float32 inputs stay exact by default)."""
        self.uses_instruction(inst.name)
        key = (inst.key, self.options.matmul_relaxed(a_dtype, b_dtype))
        if key in self.mpp_ops:
            index = self.mpp_ops.index(key)
            return "__ct_op" if index == 0 else f"__ct_op{index}"
        self.mpp_ops.append(key)
        name = "__ct_op" if len(self.mpp_ops) == 1 else f"__ct_op{len(self.mpp_ops) - 1}"
        flag = {True: "true", False: "false"}
        descriptor = inst.msl.format(m=inst.m, n=inst.n, k=inst.k, relaxed=flag[key[1]],
                                     transpose_left=flag[inst.transpose_left], transpose_right=flag[inst.transpose_right])
        self.prelude.append(f"constexpr auto {name}_desc = {descriptor};")
        self.prelude.append(f"mpp::tensor_ops::{inst.operation}<{name}_desc, metal::execution_simdgroup> {name};")
        return name

    # ---------------------------------------------------------------- element access
    def _const_elements(self, index: Any, lanes: int) -> list[int]:
        base = index.base if isinstance(index, tir.Ramp) else index
        stride = int(index.stride.value) if isinstance(index, tir.Ramp) else 0
        if not isinstance(base, tir.IntImm):
            raise CodegenError("cooperative tensor accumulator indices must be constant (the storage pass guarantees it)")
        return [int(base.value) + stride * t for t in range(lanes)]

    def _dest_elems(self, var: Any) -> int:
        return self.storage[var].instruction.dest_elems

    def ct_element(self, var: Any, flat: int) -> str:
        per = self._dest_elems(var)
        return f"{self.name_of(var)}_ct{flat // per}[{flat % per}]"

    def sg_element(self, var: Any, index: Any) -> str:
        name = self.name_of(var)
        per = self.storage[var].instruction.dest_elems
        if isinstance(index, tir.IntImm):
            i = int(index.value)
            return f"{name}[{i // per}].thread_elements()[{i % per}]"
        text = self.expr(index)
        return f"{name}[({text}) / {per}].thread_elements()[({text}) % {per}]"

    def _lane_index(self, index: Any, t: int) -> Any:
        return self.simplify(index.base + index.stride * t)

    def load_matrix_element(self, var: Any, index: Any, dtype: str, lanes: int) -> str:
        if self.is_elided_cooperative(var):
            flats = self._const_elements(index, lanes)
            per = self._dest_elems(var)
            whole = lanes > 1 and flats == list(range(flats[0], flats[0] + lanes)) and flats[0] % lanes == 0
            if whole and flats[0] // per == flats[-1] // per and str(dtype).startswith("float32"):
                # a run of the destination's own (fp32) elements read as one vector (spec 1.4)
                return f"*(thread {msl_type(dtype)}*)(&{self.ct_element(var, flats[0])})"
            parts = [self.ct_element(var, flat) for flat in flats]
        elif lanes == 1:
            return self.sg_element(var, index)
        else:
            parts = [self.sg_element(var, self._lane_index(index, t)) for t in range(lanes)]
        return parts[0] if lanes == 1 else f"{msl_type(dtype)}({', '.join(parts)})"

    def store_matrix_elements(self, var: Any, index: Any, value: str, lanes: int, dtype: str) -> None:
        if self.is_elided_cooperative(var):
            targets = [self.ct_element(var, flat) for flat in self._const_elements(index, lanes)]
        elif lanes == 1:
            targets = [self.sg_element(var, index)]
        else:
            targets = [self.sg_element(var, self._lane_index(index, t)) for t in range(lanes)]
        if lanes == 1:
            self.emit(f"{targets[0]} = {value};")
            return
        tmp = self.fresh("v")
        self.emit(f"{{ const {msl_type(dtype)} {tmp} = {value};")
        for t, target in enumerate(targets):
            self.emit(f"  {target} = {tmp}[{t}];")
        self.emit("}")

    # ---------------------------------------------------------------- operations
    def matrix_statement(self, call: Any) -> bool:
        """Print a matrix operation call; False when `call` is not one."""
        mma = intrinsics.match_ct_mma(call)
        if mma is not None:
            self.emit_ct_mma(mma)
            return True
        op = intrinsics.op_name(call)
        if op in (intrinsics.SG_LOAD, intrinsics.SG_STORE):
            x, index, addr, stride = call.args[:4]
            transpose = call.args[6] if len(call.args) > 6 else tir.const(False, "bool")
            verb = op.split(".")[1]
            self.emit(f"{verb}({self.name_of(x)}[{self.expr(index)}], {self.pointer(addr)}, {self.expr(stride)}, ulong2(0, 0), {self.expr(transpose)});")
            return True
        if op == intrinsics.SG_FILL:
            x, index, value = call.args[:3]
            ty = scalar_type(self.elem_dtype(x))
            rows, cols = intrinsics.sg_shape(call)
            self.emit(f"{self.name_of(x)}[{self.expr(index)}] = make_filled_simdgroup_matrix<{ty}, {rows}, {cols}>({self.expr(value)});")
            return True
        if op == intrinsics.SG_MMA:
            d, di, a, ai, b, bi, c, ci = call.args
            inst = self.storage[d].instruction
            operation = inst.operation  # the matrices' multiply-accumulate
            self.uses_instruction(inst.name)
            self.emit(
                f"{operation}({self.name_of(d)}[{self.expr(di)}], {self.name_of(a)}[{self.expr(ai)}], "
                f"{self.name_of(b)}[{self.expr(bi)}], {self.name_of(c)}[{self.expr(ci)}]);"
            )
            return True
        return False

    def emit_ct_mma(self, mma: intrinsics.CooperativeMma) -> None:
        inst: MatrixInstruction = mma.instruction
        storage = self.storage[mma.c]
        op = self.mpp_op(inst, storage.a_dtype, storage.b_dtype)
        ta, tb = scalar_type(storage.a_dtype), scalar_type(storage.b_dtype)
        an, bn, cn = self.name_of(mma.a), self.name_of(mma.b), self.name_of(mma.c)
        ao, bo = self.expr(mma.a_offset), self.expr(mma.b_offset)
        self.emit("{")
        self.indent += 1
        self.emit(f"auto __ct_a = {op}.get_left_input_cooperative_tensor<{ta}, {tb}, float>();")
        self.emit(f"auto __ct_b = {op}.get_right_input_cooperative_tensor<{ta}, {tb}, float>();")
        self.emit("#pragma clang loop unroll(full)")
        self.emit(f"for (ushort __i = 0; __i < {inst.left_elems}; ++__i) __ct_a[__i] = {an}[{ao} + __i];")
        self.emit("#pragma clang loop unroll(full)")
        self.emit(f"for (ushort __i = 0; __i < {inst.right_elems}; ++__i) __ct_b[__i] = {bn}[{bo} + __i];")
        if storage.elided:
            if not isinstance(mma.c_chunk, tir.IntImm):
                raise CodegenError("cooperative tensor accumulator chunk index must be constant")
            self.emit(f"{op}.run(__ct_a, __ct_b, {cn}_ct{int(mma.c_chunk.value)});")
        else:
            base = f"({self.expr(mma.c_chunk)}) * {inst.dest_elems}"
            self.emit(f"auto __ct_c = {op}.get_destination_cooperative_tensor<decltype(__ct_a), decltype(__ct_b), float>();")
            self.emit(f"for (ushort __i = 0; __i < {inst.dest_elems}; ++__i) __ct_c[__i] = {cn}[{base} + __i];")
            self.emit(f"{op}.run(__ct_a, __ct_b, __ct_c);")
            self.emit(f"for (ushort __i = 0; __i < {inst.dest_elems}; ++__i) {self.ref(mma.c, store=True)}[{base} + __i] = __ct_c[__i];")
        self.indent -= 1
        self.emit("}")
