"""The host side of tilelang's calling convention, checked on every call.

The caller passes the host function's parameters in order, minus the `out_idx` outputs (allocated
here and returned). Each tensor's rank, shape, dtype, device and contiguity is checked; each
symbolic dimension (`T.dynamic("M")`) takes its value from the first argument that has it and
must agree everywhere else; scalar parameters are range-checked for their dtype. The result, a
`BoundCall`, holds every host parameter's value and the values of the symbolic variables, from
which the launches (launch.py) take their arguments and grids.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._host import tir
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
        self._check_outputs_are_determined()

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
        self._check_compact(name, buffer)
        symbolic = any(not isinstance(d, int) for d in shape)
        return TensorParam(position, name, dtype, shape, dims, dim_slots, symbolic)

    @staticmethod
    def _check_compact(name: str, buffer: Any) -> None:
        """Kernels index parameters as dense row-major arrays; a declared strided layout is refused."""
        strides = list(buffer.strides)
        if not strides:
            return
        from .._host import tvm

        analyzer = tvm.arith.Analyzer()
        expected: Any = 1
        for dim, stride in zip(reversed(list(buffer.shape)), reversed(strides)):
            if not analyzer.can_prove_equal(stride, expected):
                raise ValueError(
                    f"parameter {name}: declared strides {shape_text(strides)} are not the dense row-major layout "
                    f"of shape {shape_text(buffer.shape)}; the Metal backend takes contiguous tensors only"
                )
            expected = expected * dim

    def _check_outputs_are_determined(self) -> None:
        known: set[int] = set()
        for p in self.inputs:
            if isinstance(p, ScalarParam):
                known.add(p.slot)
            else:
                known.update(s for s in p.dim_slots if s is not None)
        for p in self.params:
            if not isinstance(p, TensorParam):
                continue
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

        for p, arg in zip(self.inputs, args):
            if isinstance(p, ScalarParam):
                value = self._scalar(p, arg)
                values[p.position] = value
                bind_var(p.slot, value, f"argument {p.name} is {value}")
                continue
            self._check_tensor(p, arg, device)
            values[p.position] = arg
            for axis, (slot, size) in enumerate(zip(p.dim_slots, arg.shape)):
                if slot is not None:
                    same = sum(1 for s in p.dim_slots if s == slot) > 1
                    bind_var(slot, int(size), f"{p.name}{f'.shape[{axis}]' if same else ''} has {int(size)}")
        for p in self.inputs:
            if isinstance(p, TensorParam):
                expected = tuple(d(env) for d in p.dims)
                got = tuple(int(s) for s in values[p.position].shape)
                if expected != got:
                    raise ValueError(f"{p.name}: expected shape {self._expected_text(p, expected, env)}, got {shape_text(got)}")
        for i in self.outputs:
            p = self.params[i]
            assert isinstance(p, TensorParam)
            shape = [int(d(env)) for d in p.dims]
            if any(s < 0 for s in shape):
                raise ValueError(f"output {p.name}: shape {shape_text(p.shape)} evaluates to {shape_text(shape)}")
            values[i] = allocate(shape, torch_dtype(p.dtype))
        return BoundCall(values, env, self.outputs)

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
        if not arg.is_contiguous():
            raise ValueError(
                f"{p.name}: expected a contiguous tensor, got strides {tuple(arg.stride())} for shape "
                f"{shape_text(tuple(arg.shape))}; pass {p.name}.contiguous() (and copy results back if it is written)"
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


__all__ = ["BoundCall", "CallSignature", "Device", "KERNEL_DTYPES", "ScalarParam", "TensorParam", "poisoned", "torch_dtype"]
