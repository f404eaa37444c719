"""The launches of a lowered module, taken from the host function's kernel calls.

Each `T.Kernel` block becomes one device kernel and one call site in the host function, in
program order. The call site says which values the kernel gets, in its own [[ buffer(i) ]] order
(buffers by their data variable, so views of a parameter bind to that parameter and parameters the
kernel never reads are simply absent), and its grid and threadgroup extents as expressions of the
symbolic sizes; both are evaluated per call from a `BoundCall` (binding.py).

A kernel buffer that is no parameter is a workspace: a `T.alloc_global` of the prim_func, which
the host allocates per call (`Workspace`, shapes evaluated like output shapes) and passes to every
kernel that names it, as tilelang's CUDA host does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..host import host_kernel_calls, host_workspaces, readonly_param_indices, tir
from .binding import BoundCall, CallSignature, kernel_buffer, shape_text, torch_dtype
from .host_expr import Evaluator, UnboundVariable, compile_expr


@dataclass(frozen=True)
class LaunchShape:
    kernel_name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    @property
    def empty(self) -> bool:
        """No threadgroup to run (a zero-size dimension): the launch is skipped."""
        return 0 in self.grid or 0 in self.block


@dataclass(frozen=True)
class Workspace:
    """A `T.alloc_global` buffer: allocated by the host for each call, never seen by the caller."""

    name: str
    dtype: str
    declared: tuple[Any, ...]  # the declared dims, for messages
    dims: tuple[Evaluator, ...]

    def shape(self, env: list[Any]) -> list[int]:
        shape = [int(d(env)) for d in self.dims]
        if any(s < 0 for s in shape):
            raise ValueError(f"workspace {self.name} (T.alloc_global): shape {shape_text(self.declared)} evaluates to {shape_text(shape)}")
        return shape


@dataclass(frozen=True)
class KernelArgument:
    """One [[ buffer(i) ]] of a kernel: a host tensor parameter, a workspace, or a scalar computed
    from the call."""

    name: str
    dtype: str  # as the kernel's pointer sees it (bool parameters are int8 storage)
    position: int | None  # host parameter of a buffer
    value: Evaluator | None  # scalar, evaluated on the call's symbolic environment
    written: bool = False  # a buffer the kernel may write (not in its readonly_param_indices)
    workspace: int | None = None  # index into the call's workspaces

    @property
    def is_buffer(self) -> bool:
        return self.position is not None or self.workspace is not None


@dataclass(frozen=True)
class KernelLaunch:
    kernel_name: str
    arguments: tuple[KernelArgument, ...]
    grid: tuple[Evaluator, Evaluator, Evaluator]
    block: tuple[Evaluator, Evaluator, Evaluator]

    def shape(self, bound: BoundCall) -> LaunchShape:
        grid = tuple(int(e(bound.env)) for e in self.grid)
        block = tuple(int(e(bound.env)) for e in self.block)
        if any(v < 0 for v in grid + block):
            raise ValueError(
                f"kernel {self.kernel_name}: launch grid {grid} x threadgroup {block} has a negative extent "
                "(a symbolic size or scalar argument is negative)"
            )
        return LaunchShape(self.kernel_name, grid, block)  # type: ignore[arg-type]

    def values(self, bound: BoundCall, scalar: Callable[[Any, str], Any] = lambda v, dtype: v) -> list[Any]:
        """The kernel's arguments in [[ buffer(i) ]] order; `scalar(value, dtype)` wraps scalars
        the way the runtime passes them."""
        out = []
        for arg in self.arguments:
            if arg.position is not None:
                out.append(_as_kernel_dtype(kernel_buffer(bound.values[arg.position]), arg.dtype))
            elif arg.workspace is not None:
                out.append(_as_kernel_dtype(bound.workspaces[arg.workspace], arg.dtype))
            else:
                out.append(scalar(arg.value(bound.env), arg.dtype))  # type: ignore[misc]
        return out


def _as_kernel_dtype(tensor: Any, dtype: str) -> Any:
    """The parameter's storage with the kernel's element type: bool parameters are `char` buffers
    in the kernel (TVM stores bool as int8)."""
    if str(tensor.dtype).removeprefix("torch.") == dtype:
        return tensor
    return tensor.reshape(-1).view(torch_dtype(dtype))


_AXES = "xyz"


def _launch_extents(call: Any, signature: CallSignature) -> tuple[list[Evaluator], list[Evaluator]]:
    """Grid and threadgroup extents of one launch. The device function's `thread_extent` attribute
    is authoritative (plugin passes such as BlockSwizzle rewrite it after the host/device split);
    its expressions use the kernel's parameters, replaced here by the call site's arguments. The
    call site's own launch arguments serve when the attribute is absent."""
    attrs = call.device_func.attrs
    extents: list[tuple[str, Any]] = list(call.launch)
    if attrs is not None and "thread_extent" in attrs:
        to_host = {param: arg for param, arg in zip(call.device_func.params, call.args) if str(param.dtype) != "handle"}
        extents = [(str(tag), tir.stmt_functor.substitute(extent, to_host)) for tag, extent in attrs["thread_extent"].items()]
    grid: list[Evaluator] = [lambda env: 1] * 3
    block: list[Evaluator] = [lambda env: 1] * 3
    for tag, extent in extents:
        if tag.startswith(("blockIdx.", "threadIdx.")) and tag[-1] in _AXES:
            target = grid if tag.startswith("blockIdx") else block
            target[_AXES.index(tag[-1])] = _compile(call.kernel_name, f"launch extent {tag}", extent, signature)
        elif tag.endswith("use_dyn_shared_memory"):
            continue  # the MSL declares its threadgroup memory with static sizes (printer.py)
        else:
            raise ValueError(f"kernel {call.kernel_name}: launch parameter {tag!r} is not supported by the Metal backend")
    return grid, block


def _compile(kernel: str, what: str, expr: Any, signature: CallSignature) -> Evaluator:
    try:
        return compile_expr(expr, signature.slot_of)
    except UnboundVariable as err:
        raise ValueError(
            f"kernel {kernel}: {what} `{expr}` uses {err}, which is neither a parameter nor a symbolic size of "
            f"{signature.name}'s parameters"
        ) from None


def _pointee_dtype(param: Any, default: str) -> str:
    annotation = getattr(param, "type_annotation", None)
    element = getattr(annotation, "element_type", None)
    return str(element.dtype) if element is not None and hasattr(element, "dtype") else default


def workspace_plan(signature: CallSignature, host_mod: Any) -> list[Workspace]:
    """The module's `T.alloc_global` buffers, with shapes compiled over the call's symbolic sizes."""
    plan = []
    for ws in host_workspaces(host_mod):
        torch_dtype(ws.dtype)  # refuse dtypes torch cannot hold, at compile time
        try:
            dims = tuple(compile_expr(d, signature.slot_of) for d in ws.shape)
        except UnboundVariable as err:
            raise ValueError(
                f"workspace {ws.name} (T.alloc_global) of shape {shape_text(ws.shape)} uses {err}, which is neither a "
                f"parameter nor a symbolic size of {signature.name}'s parameters; size it from those"
            ) from None
        plan.append(Workspace(ws.name, ws.dtype, tuple(int(d) if isinstance(d, tir.IntImm) else d for d in ws.shape), dims))
    return plan


def kernel_launches(signature: CallSignature, host_mod: Any, device_mod: Any) -> list[KernelLaunch]:
    """Every kernel launch of the module, in host program order."""
    workspaces = host_workspaces(host_mod)  # same order as workspace_plan
    calls = host_kernel_calls(host_mod, device_mod)
    if not calls:
        names = [str(g.name_hint) for g in device_mod.functions]
        raise ValueError(f"{signature.name}: no kernel launch found in the host function (device kernels: {names})")
    launches = []
    for call in calls:
        arguments = []
        readonly = readonly_param_indices(call.device_func)
        for index, (param, expr) in enumerate(zip(call.device_func.params, call.args)):
            name = str(param.name)
            if str(param.dtype) == "handle":
                position = signature.position_of_data(expr) if isinstance(expr, tir.Var) else None
                workspace = next((i for i, ws in enumerate(workspaces) if ws.data.same_as(expr)), None)
                if workspace is not None:
                    dtype = _pointee_dtype(param, workspaces[workspace].dtype)
                    arguments.append(KernelArgument(name, dtype, None, None, workspace=workspace))
                    continue
                if position is None:
                    raise ValueError(
                        f"kernel {call.kernel_name}: buffer argument {name} (`{expr}`) is not the data of a "
                        f"parameter of {signature.name} nor a T.alloc_global workspace; only parameters, views of "
                        "them and T.alloc_global buffers can reach a kernel"
                    )
                dtype = _pointee_dtype(param, signature.params[position].dtype)
                arguments.append(KernelArgument(name, dtype, position, None, written=index not in readonly))
            else:
                value = _compile(call.kernel_name, f"argument {name}", expr, signature)
                arguments.append(KernelArgument(name, str(param.dtype), None, value))
        grid, block = _launch_extents(call, signature)
        launches.append(KernelLaunch(call.kernel_name, tuple(arguments), tuple(grid), tuple(block)))  # type: ignore[arg-type]
    return launches
