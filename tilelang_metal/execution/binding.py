"""The host side of tilelang's calling convention, checked on every call.

The caller passes the host function's parameters in order, minus the `out_idx` outputs (allocated
here and returned). Each tensor's rank, shape, dtype, device and layout is checked; each
symbolic dimension (`T.dynamic("M")`) takes its value from the first argument that has it and
must agree everywhere else, and so does each symbolic stride (`T.StridedTensor`), from the
tensors' strides; scalar parameters are range-checked for their dtype. The result, a
`BoundCall`, holds every host parameter's value and the values of the symbolic variables, from
which the launches (launch.py) take their arguments and grids.

Layouts (docs/calling_convention.md): a parameter declared dense (`T.Tensor`) gets a dense tensor;
an input the kernels only read that is not dense, or whose data is not aligned, is copied (an
input copy loses nothing), a written one is refused. A parameter declared with strides takes the
tensor as it is and its strides as kernel arguments. Kernel buffer parameters are `__restrict`, so
a tensor a kernel writes must not share memory with any other tensor argument.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..host import tir
from .host_expr import Evaluator, compile_expr, free_vars

# Kernel dtypes with a torch dtype of the same name (uint16/32/64 exist in torch >= 2.3).
KERNEL_DTYPES = (
    "float16", "bfloat16", "float32", "float64",
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
)  # fmt: skip


def torch_dtype(dtype: Any) -> Any:
    """torch's dtype of the same name as a kernel dtype."""
    import torch

    name = str(dtype)
    found = getattr(torch, name, None) if name in KERNEL_DTYPES else None
    if found is None:
        raise TypeError(f"no torch dtype for kernel parameter dtype {name}")
    return found


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def shape_text(dims: Sequence[Any]) -> str:
    items = [str(d) for d in dims]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _integer_range(dtype: str) -> tuple[int, int]:
    bits = int("".join(ch for ch in dtype if ch.isdigit()))
    if dtype.startswith("uint"):
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


@dataclass(frozen=True)
class Device:
    """Where an adapter's tensors live: a torch device type and the backend name for messages.
    `check_array(param, arg)` replaces the torch checks for adapters taking other arrays (MLX)."""

    type: str
    backend: str
    check_array: Callable[[Any, Any], None] | None = None


@dataclass(frozen=True)
class TensorParam:
    position: int  # in the host parameter list
    name: str
    dtype: str
    shape: tuple[Any, ...]  # the declared dims (ints or TIR expressions), for messages
    dims: tuple[Evaluator, ...]
    dim_slots: tuple[int | None, ...]  # the slot of a dim that is a plain symbolic variable
    symbolic: bool
    strides: tuple[Any, ...] | None = None  # declared strides that are not the dense layout (None: dense)
    stride_evals: tuple[Evaluator, ...] = ()
    stride_slots: tuple[int | None, ...] = ()  # the slot of a stride that is a plain symbolic variable


@dataclass(frozen=True)
class ScalarParam:
    position: int
    name: str
    dtype: str
    slot: int


@dataclass
class BoundCall:
    """One call's values: every host parameter (tensors, scalars), every symbolic variable and the
    call's workspaces (`T.alloc_global` buffers, allocated by KernelCall.bind)."""

    values: list[Any]
    env: list[Any]
    outputs: list[int]
    workspaces: list[Any] = field(default_factory=list)

    def results(self) -> Any:
        outs = [self.values[i] for i in self.outputs]
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else outs


class CallSignature:
    """The host parameters of a `T.prim_func` (names, dtypes, shapes with their symbolic variables)."""

    def __init__(self, func: Any, result_idx: Sequence[int]):
        self.name = str(func.attrs["global_symbol"]) if func.attrs is not None and "global_symbol" in func.attrs else "main"
        self.outputs = [int(i) for i in result_idx]  # returned in this order, as tilelang does
        self.slot_vars: list[Any] = []  # symbolic shape variables and scalar parameters
        self._data_vars: list[tuple[Any, int]] = []  # (buffer data var, host position)
        self.params: list[TensorParam | ScalarParam] = []
        for position, var in enumerate(func.params):
            if var in func.buffer_map:
                buffer = func.buffer_map[var]
                self._data_vars.append((buffer.data, position))
                self.params.append(self._tensor_param(position, buffer))
            else:
                self.params.append(ScalarParam(position, str(var.name), str(var.dtype), self._slot(var, create=True)))
        for i in self.outputs:
            if not isinstance(self.params[i], TensorParam):
                raise ValueError(f"out_idx names {self.params[i].name}, a scalar parameter; outputs must be tensors")
        self.inputs = [p for p in self.params if p.position not in self.outputs]
        # Which tensor parameters reach a kernel and which a kernel may write (set_accesses, from
        # the launches); until then every tensor counts as used and written, the safe assumption.
        tensors = {p.position for p in self.params if isinstance(p, TensorParam)}
        self.used: set[int] = set(tensors)
        self.written: set[int] = set(tensors)
        self._check_outputs_are_determined()

    def set_accesses(self, used: set[int], written: set[int]) -> None:
        """Record which host parameters the module's kernels take and which they may write."""
        self.used, self.written = set(used), set(written)

    # ------------------------------------------------------------ construction
    def _slot(self, var: Any, create: bool = False) -> int | None:
        for i, known in enumerate(self.slot_vars):
            if known.same_as(var):
                return i
        if not create:
            return None
        self.slot_vars.append(var)
        return len(self.slot_vars) - 1

    def slot_of(self, var: Any) -> int | None:
        """The environment slot of a symbolic variable or scalar parameter (None if unknown)."""
        return self._slot(var)

    def position_of_data(self, data_var: Any) -> int | None:
        """The host parameter whose buffer owns `data_var` (views of it share the same var)."""
        for var, position in self._data_vars:
            if var.same_as(data_var):
                return position
        return None

    def _tensor_param(self, position: int, buffer: Any) -> TensorParam:
        name = str(buffer.name)
        dtype = str(buffer.dtype)
        torch_dtype(dtype)  # refuse dtypes torch cannot hold, at compile time
        for d in buffer.shape:
            for v in free_vars(d):
                self._slot(v, create=True)
        dims = tuple(compile_expr(d, self.slot_of) for d in buffer.shape)
        dim_slots = tuple(self.slot_of(d) if isinstance(d, tir.Var) else None for d in buffer.shape)
        shape = tuple(int(d) if isinstance(d, tir.IntImm) else d for d in buffer.shape)
        symbolic = any(not isinstance(d, int) for d in shape)
        if self._is_dense(buffer):
            return TensorParam(position, name, dtype, shape, dims, dim_slots, symbolic)
        # Declared strides (T.StridedTensor): the kernel indexes with them; symbolic ones are
        # kernel arguments, bound per call from the tensor's strides.
        for stride in buffer.strides:
            for v in free_vars(stride):
                self._slot(v, create=True)
        strides = tuple(int(st) if isinstance(st, tir.IntImm) else st for st in buffer.strides)
        stride_evals = tuple(compile_expr(st, self.slot_of) for st in buffer.strides)
        stride_slots = tuple(self.slot_of(st) if isinstance(st, tir.Var) else None for st in buffer.strides)
        return TensorParam(position, name, dtype, shape, dims, dim_slots, symbolic, strides, stride_evals, stride_slots)

    @staticmethod
    def _is_dense(buffer: Any) -> bool:
        """Whether the declared strides are provably the dense row-major layout (T.Tensor declares
        them so; a buffer without strides is dense)."""
        strides = list(buffer.strides)
        if not strides:
            return True
        from ..host import tvm

        analyzer = tvm.arith.Analyzer()
        expected: Any = 1
        for dim, stride in zip(reversed(list(buffer.shape)), reversed(strides)):
            if not analyzer.can_prove_equal(stride, expected):
                return False
            expected = expected * dim
        return True

    def _check_outputs_are_determined(self) -> None:
        known: set[int] = set()
        for p in self.inputs:
            if isinstance(p, ScalarParam):
                known.add(p.slot)
            else:
                known.update(s for s in p.dim_slots + p.stride_slots if s is not None)
        for i in self.outputs:
            p = self.params[i]
            assert isinstance(p, TensorParam)
            if p.strides is not None:
                if any(slot is None for slot in p.stride_slots):
                    raise ValueError(
                        f"output {p.name} declares strides {shape_text(p.strides)}, but out_idx outputs are allocated "
                        f"dense: declare {p.name} with T.Tensor or plain symbolic strides, or pass it as an argument"
                    )
                known.update(p.stride_slots)  # type: ignore[arg-type]  # bound from the allocated tensor
        for p in self.params:
            if not isinstance(p, TensorParam):
                continue
            for stride in p.strides or ():
                missing = [v for v in free_vars(stride) if self.slot_of(v) not in known]
                if missing:
                    raise ValueError(
                        f"{p.name} of strides {shape_text(p.strides)}: no argument gives {missing[0].name} "
                        "(a symbolic stride must be a whole stride of a tensor, a whole dimension or a scalar parameter)"
                    )
            for dim in p.shape:
                missing = [v for v in free_vars(dim) if self.slot_of(v) not in known]
                if missing:
                    role = "output" if p.position in self.outputs else "input"
                    raise ValueError(
                        f"{role} {p.name} of shape {shape_text(p.shape)}: no input gives {missing[0].name} "
                        "(a symbolic size must be a whole dimension of an input tensor or a scalar parameter)"
                    )

    # ------------------------------------------------------------ per call
    def bind(self, args: Sequence[Any], device: Device, allocate: Callable[[list[int], Any], Any]) -> BoundCall:
        """Check `args` against the signature and allocate the outputs (`allocate(shape, torch dtype)`)."""
        if len(args) != len(self.inputs):
            names = ", ".join(p.name for p in self.inputs)
            extra = ""
            if self.outputs:
                extra = f"; outputs {', '.join(self.params[i].name for i in self.outputs)} are allocated and returned (out_idx)"
            raise TypeError(f"kernel {self.name} takes {len(self.inputs)} arguments ({names}), got {len(args)}{extra}")
        values: list[Any] = [None] * len(self.params)
        env: list[Any] = [None] * len(self.slot_vars)
        origin: list[str] = [""] * len(self.slot_vars)

        def bind_var(slot: int, value: int, where: str) -> None:
            if env[slot] is None:
                env[slot], origin[slot] = value, where
            elif env[slot] != value:
                name = self.slot_vars[slot].name
                raise ValueError(f"{name}: {origin[slot]} but {where}; both are {name} and must be equal")

        tensors: list[tuple[TensorParam, Any]] = []
        for p, arg in zip(self.inputs, args):
            if isinstance(p, ScalarParam):
                value = self._scalar(p, arg)
                values[p.position] = value
                bind_var(p.slot, value, f"argument {p.name} is {value}")
                continue
            self._check_tensor(p, arg, device)
            tensors.append((p, arg))
        if device.check_array is None:  # torch tensors (MLX arrays are immutable: written ones are copied)
            self._check_no_aliasing(tensors)
        for p, arg in tensors:
            arg = values[p.position] = arg if device.check_array is not None else self._laid_out(p, arg)
            for axis, (slot, size) in enumerate(zip(p.dim_slots, arg.shape)):
                if slot is not None:
                    same = sum(1 for s in p.dim_slots if s == slot) > 1
                    bind_var(slot, int(size), f"{p.name}{f'.shape[{axis}]' if same else ''} has {int(size)}")
        self._bind_strides(tensors, values, env, bind_var)
        for p in self.inputs:
            if isinstance(p, TensorParam):
                expected = tuple(d(env) for d in p.dims)
                got = tuple(int(s) for s in values[p.position].shape)
                if expected != got:
                    raise ValueError(f"{p.name}: expected shape {self._expected_text(p, expected, env)}, got {shape_text(got)}")
        allocated: list[tuple[TensorParam, Any]] = []
        for i in self.outputs:
            p = self.params[i]
            assert isinstance(p, TensorParam)
            shape = [int(d(env)) for d in p.dims]
            if any(s < 0 for s in shape):
                raise ValueError(f"output {p.name}: shape {shape_text(p.shape)} evaluates to {shape_text(shape)}")
            values[i] = allocate(shape, torch_dtype(p.dtype))
            allocated.append((p, values[i]))
        self._bind_strides(allocated, values, env, bind_var)
        for p, _ in tensors + allocated:
            self._check_strides(p, values[p.position], env)
        return BoundCall(values, env, self.outputs)

    # ------------------------------------------------------------ layouts
    @staticmethod
    def _bind_strides(tensors: list[tuple[TensorParam, Any]], values: list[Any], env: list[Any], bind_var: Any) -> None:
        """Symbolic strides from the tensors' strides. A stride of a dimension of size 0 or 1 is
        never used to address anything, so it only fills a variable nothing else gives."""
        late: list[tuple[int, int]] = []
        for p, _ in tensors:
            if p.strides is None:
                continue
            arg = values[p.position]
            strides = _strides_of(arg)
            for axis, (slot, size, stride) in enumerate(zip(p.stride_slots, arg.shape, strides)):
                if slot is None:
                    continue
                if int(size) <= 1:
                    late.append((slot, stride))
                    continue
                bind_var(slot, stride, f"{p.name}.stride({axis}) is {stride}")
        for slot, stride in late:
            if env[slot] is None:
                env[slot] = stride

    def _check_strides(self, p: TensorParam, arg: Any, env: list[Any]) -> None:
        """Every declared stride (constant, expression or variable) equals the tensor's, on the
        dimensions that address more than one element; the values fit the kernel's int type."""
        if p.strides is None:
            return
        got = _strides_of(arg)
        if any(int(size) == 0 for size in arg.shape):
            return
        expected = tuple(int(e(env)) for e in p.stride_evals)
        for axis, size in enumerate(arg.shape):
            if int(size) > 1 and expected[axis] != got[axis]:
                declared = shape_text(p.strides)
                form = f" ({declared})" if declared != shape_text(expected) else ""
                raise ValueError(
                    f"{p.name}: expected strides {shape_text(expected)}{form}, got {shape_text(got)} "
                    f"for shape {shape_text(tuple(arg.shape))}"
                )
        for stride in p.strides:
            if isinstance(stride, tir.Var):
                low, high = _integer_range(str(stride.dtype))
                value = env[self.slot_of(stride)]  # type: ignore[index]
                if not low <= value <= high:
                    raise ValueError(f"{p.name}: stride {stride.name}={value} does not fit in the kernel's {stride.dtype}")

    def _laid_out(self, p: TensorParam, arg: Any) -> Any:
        """The tensor the kernels get for a torch argument: itself, or a copy of an input whose layout
        the kernels cannot take; a written tensor is never copied (the writes would be lost)."""
        written = p.position in self.written and p.position in self.used
        if p.strides is None and not arg.is_contiguous():
            if written:
                raise ValueError(
                    f"{p.name}: expected a contiguous tensor, got strides {tuple(arg.stride())} for shape "
                    f"{shape_text(tuple(arg.shape))}; a kernel writes {p.name}, so pass {p.name}.contiguous() and copy "
                    f"the result back, or declare {p.name} with T.StridedTensor"
                )
            arg = arg.contiguous()  # an input: the copy holds the same values
        if p.strides is not None and written and _overlaps_itself(arg):
            raise ValueError(
                f"{p.name}: elements share memory (strides {tuple(arg.stride())} for shape {shape_text(tuple(arg.shape))}) "
                f"and a kernel writes {p.name}; pass a tensor without repeated elements ({p.name}.contiguous(), then copy back)"
            )
        misaligned = _misalignment(arg)
        if misaligned:
            if written:
                raise ValueError(
                    f"{p.name}: data starts {misaligned} bytes past a {_required_alignment(arg)}-byte boundary "
                    f"(storage offset {arg.storage_offset()}); kernels assume aligned buffers and a kernel writes {p.name}: "
                    f"pass an aligned tensor ({p.name}.clone()) and copy the result back"
                )
            arg = arg.clone()  # a new allocation is aligned
        return arg

    def _check_no_aliasing(self, tensors: list[tuple[TensorParam, Any]]) -> None:
        """Kernel buffers are `__restrict`: a tensor a kernel writes shares no memory with another
        tensor argument (inputs may share memory with each other)."""
        used = [(p, t) for p, t in tensors if p.position in self.used]
        for i, (p, a) in enumerate(used):
            for q, b in used[i + 1 :]:
                writer = p if p.position in self.written else q if q.position in self.written else None
                if writer is None or not _overlap(a, b):
                    continue
                other = q if writer is p else p
                fix = f"pass a separate tensor for {writer.name}"
                fix += f" and {other.name}" if other.position in self.written else f", or {other.name}.clone()"
                raise ValueError(
                    f"{writer.name} and {other.name} share memory and a kernel writes {writer.name} (kernel buffers are "
                    f"__restrict): {fix}"
                )

    def _expected_text(self, p: TensorParam, expected: tuple[int, ...], env: list[Any]) -> str:
        text = shape_text(expected)
        if p.symbolic:
            seen: list[Any] = []
            for d in p.shape:
                seen += [v for v in free_vars(d) if not any(v.same_as(s) for s in seen)]
            where = ", ".join(f"{v.name}={env[self.slot_of(v)]}" for v in seen)
            text += f" ({shape_text(p.shape)} with {where})"
        return text

    @staticmethod
    def _check_tensor(p: TensorParam, arg: Any, device: Device) -> None:
        import torch

        if device.check_array is not None:
            device.check_array(p, arg)
            return
        if not isinstance(arg, torch.Tensor):
            raise TypeError(f"{p.name}: expected a torch.Tensor of shape {shape_text(p.shape)}, got {type(arg).__name__}")
        if arg.dim() != len(p.shape):
            raise ValueError(f"{p.name}: expected {len(p.shape)} dims {shape_text(p.shape)}, got shape {shape_text(tuple(arg.shape))}")
        if _dtype_name(arg.dtype) != p.dtype:
            raise TypeError(f"{p.name}: expected dtype {p.dtype}, got {_dtype_name(arg.dtype)}; pass {p.name}.to(torch.{p.dtype})")
        if arg.device.type != device.type:
            raise ValueError(
                f"{p.name}: expected a tensor on {device.type} (execution_backend={device.backend!r}), got device {arg.device}"
            )

    @staticmethod
    def _scalar(p: ScalarParam, arg: Any) -> Any:
        import torch

        if isinstance(arg, torch.Tensor):
            if arg.numel() != 1:
                raise TypeError(f"{p.name}: expected a {p.dtype} scalar, got a tensor of shape {shape_text(tuple(arg.shape))}")
            arg = arg.item()
        elif not isinstance(arg, (bool, int, float)) and hasattr(arg, "item") and hasattr(arg, "shape"):
            if tuple(arg.shape) not in ((), (1,)):  # an MLX or numpy array of one element
                raise TypeError(f"{p.name}: expected a {p.dtype} scalar, got an array of shape {shape_text(tuple(arg.shape))}")
            arg = arg.item()
        if p.dtype == "bool":
            if isinstance(arg, bool) or (isinstance(arg, int) and arg in (0, 1)):
                return bool(arg)
            raise TypeError(f"{p.name}: expected a bool, got {arg!r}")
        if p.dtype.startswith(("int", "uint")):
            if isinstance(arg, float) or isinstance(arg, bool):
                raise TypeError(f"{p.name}: expected an integer for {p.dtype}, got {type(arg).__name__} {arg!r}")
            try:
                value = operator.index(arg)
            except TypeError:
                raise TypeError(f"{p.name}: expected an integer for {p.dtype}, got {type(arg).__name__}") from None
            low, high = _integer_range(p.dtype)
            if not low <= value <= high:
                raise ValueError(f"{p.name}: {value} does not fit in {p.dtype} [{low}, {high}]")
            return value
        if isinstance(arg, (bool, str)):
            raise TypeError(f"{p.name}: expected a number for {p.dtype}, got {type(arg).__name__} {arg!r}")
        try:
            return float(arg)  # ints, floats and numpy scalars
        except (TypeError, ValueError):
            raise TypeError(f"{p.name}: expected a number for {p.dtype}, got {type(arg).__name__}") from None


# ---------------------------------------------------------------- memory of torch tensors
def _strides_of(arg: Any) -> tuple[int, ...]:
    """Element strides: a torch tensor's own; arrays without strides (MLX) reach kernels dense."""
    stride = getattr(arg, "stride", None)
    if callable(stride):
        return tuple(int(st) for st in stride())
    dense, strides = 1, []
    for size in reversed(tuple(arg.shape)):
        strides.append(dense)
        dense *= int(size)
    return tuple(reversed(strides))


def span(tensor: Any) -> int:
    """Elements from the first to one past the last a strided tensor addresses (torch strides are
    never negative)."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum((int(size) - 1) * int(stride) for size, stride in zip(tensor.shape, tensor.stride()))


def kernel_buffer(tensor: Any) -> Any:
    """What a kernel's buffer parameter gets: the tensor itself when dense, else a flat dense view of
    the memory it spans (the kernel addresses it with the strides it was given)."""
    if tensor.is_contiguous():
        return tensor
    return tensor.as_strided((span(tensor),), (1,))


def _required_alignment(tensor: Any) -> int:
    """The alignment kernels assume for a buffer: 16 bytes (the widest vector or copy of 4-byte or
    smaller elements), four elements of an 8-byte type."""
    return max(16, 4 * tensor.element_size())


def _misalignment(tensor: Any) -> int:
    """Bytes past the alignment boundary at which the tensor's data starts (0: aligned). On devices
    whose storages are buffers (MPS) only the offset into the storage counts."""
    if tensor.numel() == 0:
        return 0
    start = tensor.data_ptr() if tensor.device.type == "cpu" else tensor.storage_offset() * tensor.element_size()
    return start % _required_alignment(tensor)


def _byte_range(tensor: Any) -> tuple[int, int]:
    start = tensor.storage_offset() * tensor.element_size()
    return start, start + span(tensor) * tensor.element_size()


def _same_storage(a: Any, b: Any) -> bool:
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _overlap(a: Any, b: Any) -> bool:
    """Whether two tensors address a common byte. Disjoint byte ranges (or storages) settle it;
    otherwise (interleaved views such as two column blocks of one matrix) the runs of contiguous
    bytes of each are compared, sorted (numpy: metadata only, no device memory is touched)."""
    if a.numel() == 0 or b.numel() == 0 or not _same_storage(a, b):
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    if a1 <= b0 or b1 <= a0:
        return False
    if _disjoint_residues(a, b):
        return False
    import numpy as np

    a_starts, a_length = _runs(a)
    b_starts, b_length = _runs(b)
    a_starts.sort()
    # A run [s, s + b_length) of b meets a run [t, t + a_length) of a iff s - a_length < t < s + b_length.
    first = np.searchsorted(a_starts, b_starts - a_length, side="right")
    found = first < a_starts.size
    return bool((a_starts[first[found]] < b_starts[found] + b_length).any())


def _disjoint_residues(a: Any, b: Any) -> bool:
    """Every byte stride of both is a multiple of g, so each tensor's bytes sit at fixed residues
    modulo g: disjoint residues mean disjoint memory (`x[:, ::2]` and `x[:, 1::2]`)."""
    g = 0
    for t in (a, b):
        for n, st in zip(t.shape, t.stride()):
            if int(n) > 1:
                g = math.gcd(g, int(st) * t.element_size())
    if g == 0:
        return False
    ra, rb = _byte_range(a)[0] % g, _byte_range(b)[0] % g
    # Residue intervals [ra, ra + size_a) and [rb, rb + size_b), modulo g.
    return (rb - ra) % g >= a.element_size() and (ra - rb) % g >= b.element_size()


def _runs(tensor: Any) -> tuple[Any, int]:
    """The tensor's memory as runs of contiguous bytes: (start byte of each run in the storage, as
    a numpy array; run length). A dimension of stride 1 makes the runs (rows of a matrix view, or
    columns of a transposed one); without one each element is a run. A stride-0 dimension repeats
    the same runs: kept once. Cost: one entry per run, sorted."""
    import numpy as np

    size = tensor.element_size()
    dims = [(int(n), int(st)) for n, st in zip(tensor.shape, tensor.stride()) if int(n) > 1 and int(st) != 0]
    length = size
    unit = next((i for i, (_, st) in enumerate(dims) if st == 1), None)
    if unit is not None:
        length = dims.pop(unit)[0] * size
    starts = np.array([tensor.storage_offset() * size], dtype=np.int64)
    for n, st in dims:
        starts = (starts[:, None] + np.arange(n, dtype=np.int64) * (st * size)).reshape(-1)
    return starts, length


def _overlaps_itself(tensor: Any) -> bool:
    """Whether two elements of the tensor are the same memory (a broadcast or overlapping-window view)."""
    if any(int(n) > 1 and int(st) == 0 for n, st in zip(tensor.shape, tensor.stride())):
        return True
    dims = sorted((int(st), int(n)) for n, st in zip(tensor.shape, tensor.stride()) if int(n) > 1)
    reach = 1  # elements spanned by the dimensions of smaller stride
    for stride, n in dims:
        if stride < reach:
            break  # not provably distinct: compare the sorted runs
        reach += stride * (n - 1)
    else:
        return False
    starts, length = _runs(tensor)
    starts.sort()
    return bool((starts[1:] - starts[:-1] < length).any())


def poisoned(shape: list[int], dtype: Any, device: str) -> Any:
    """A new tensor whose elements show up when a kernel never writes them: NaN, -1 or the unsigned
    maximum (bool: True)."""
    import torch

    if dtype.is_floating_point:
        fill: Any = float("nan")
    elif dtype == torch.bool:
        fill = True
    elif _dtype_name(dtype).startswith("uint"):
        fill = _integer_range(_dtype_name(dtype))[1]
    else:
        fill = -1
    return torch.full(shape, fill, dtype=dtype, device=device)


__all__ = [
    "BoundCall", "CallSignature", "Device", "KERNEL_DTYPES", "ScalarParam", "TensorParam", "kernel_buffer", "poisoned",
    "span", "torch_dtype",
]  # fmt: skip
