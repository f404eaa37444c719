"""`execution_backend="mlx"`: kernels called on `mx.array`s, launched through `mx.fast.metal_kernel`.

MLX arrays are immutable and a metal_kernel's inputs are read-only, so a call returns every array
the kernels write: the `out_idx` outputs (in `out_idx` order), then every other parameter a kernel
writes (in declaration order); one array alone, a list for several. Read-only inputs are passed as
they are (never copied; inputs of fewer than 8 elements are padded into a copy of 8, because MLX
passes smaller arrays in the `constant` address space).

How a written parameter reaches a kernel:
- an `out_idx` output the module has not written yet is an MLX *output* of the launch (no copy);
- a parameter whose contents matter (passed by the caller, or written by an earlier launch in
  place) is copied once into a private array, which the kernels then write through (the body casts
  MLX's `const device T*`); after the last launch it is copied into a new array that is the output
  of a kernel. That second copy is what makes the result safe to use: MLX orders GPU work by the
  outputs of kernels, and a write through an input is invisible to it.
- every launch also has a one-element output `done`, passed to the next launch (and to the final
  copies) as an input, so launches that communicate through private arrays run in order.
- a workspace (`T.alloc_global`) is handled like an `out_idx` output that is never returned: the
  first launch that writes it gets it as an MLX output, later launches read it (or write it in
  place, as a private array).

On a Mac with MLX's Metal back-end the kernels run through `mx.fast.metal_kernel`; elsewhere the
same calls go to `mlx_emulated.emulated_metal_kernel`, which runs them in the CPU emulator. Kernels
with cooperative tensors (the `metal4` key) need MSL 4, which MLX (>= 0.30) requests from Metal on
macOS 26 and later; elsewhere they are refused when the kernel is compiled (metal4_launch.py).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import metal4_launch
from ..errors import CodegenError
from ..target.limits import BUFFER_ARGUMENT_SLOTS
from .binding import Device, TensorParam, shape_text
from .calling import PluginKernelAdapter
from .launch import KernelLaunch
from .mlx_emulated import dtype_name, emulated_metal_kernel
from .mlx_source import AFTER, DONE, MLXKernelSource, Role, mlx_kernel_source

MIN_DEVICE_ELEMENTS = 8  # MLX passes inputs with fewer elements in the constant address space
COPY_THREADS = 256
MAX_GRID = (1 << 31) - 1  # MLX takes the grid as int


def mlx_module() -> Any:
    try:
        import mlx.core as mx
    except ImportError as err:
        raise ImportError(
            f"execution_backend='mlx' needs MLX: pip install mlx (on Linux: pip install 'mlx[cpu]') ({err})"
        ) from None
    return mx


def metal_kernel_factory() -> Callable[..., Any]:
    """`mx.fast.metal_kernel` where MLX runs on Metal, else the emulated one (looked up per call, so
    tests can replace either)."""
    mx = mlx_module()
    if mx.metal.is_available():
        return mx.fast.metal_kernel
    return emulated_metal_kernel


def mx_dtype(name: str) -> Any:
    """MLX's dtype of a kernel dtype name (`bool` is `mx.bool_`)."""
    mx = mlx_module()
    return mx.bool_ if name == "bool" else getattr(mx, name)


def _check_mlx_array(p: TensorParam, arg: Any) -> None:
    mx = mlx_module()
    if not isinstance(arg, mx.array):
        raise TypeError(f"{p.name}: expected an mx.array of shape {shape_text(p.shape)}, got {type(arg).__name__}")
    if arg.ndim != len(p.shape):
        raise ValueError(f"{p.name}: expected {len(p.shape)} dims {shape_text(p.shape)}, got shape {shape_text(tuple(arg.shape))}")
    if dtype_name(arg.dtype) != p.dtype:
        raise TypeError(f"{p.name}: expected dtype {p.dtype}, got {dtype_name(arg.dtype)}")


MLX = Device("mlx", "mlx", check_array=_check_mlx_array)


@dataclass
class _CallState:
    """Per call: the current array of each buffer slot (the host parameters by position, then the
    workspaces); which arrays are private to the call (safe to write through) and which were written
    through an input (copied out at the end)."""

    state: list[Any]
    owned: set[int] = field(default_factory=set)
    dirty: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class _Unwritten:
    """An `out_idx` output no launch has written yet."""

    shape: tuple[int, ...]
    dtype: str


def _poison(shape: tuple[int, ...], dtype: str) -> Any:
    mx = mlx_module()
    if dtype.startswith("float") or dtype == "bfloat16":
        return mx.full(shape, float("nan"), dtype=mx_dtype(dtype))
    if dtype == "bool":
        return mx.full(shape, True)
    if dtype.startswith("uint"):
        return mx.full(shape, (1 << int(dtype[4:])) - 1, dtype=mx_dtype(dtype))
    return mx.full(shape, -1, dtype=mx_dtype(dtype))


class MLXKernelAdapter(PluginKernelAdapter):
    device = MLX

    # ---------------------------------------------------------------- kernels
    def kernel_source(self, kernel_name: str) -> MLXKernelSource:
        sources = self.__dict__.setdefault("_sources", {})
        if kernel_name not in sources:
            from ..emulator import split_kernels

            msl = split_kernels(self.kernel_global_source).get(kernel_name)
            if msl is None:
                raise ValueError(f"kernel {kernel_name} is not in the module's MSL")
            source = mlx_kernel_source(msl, self.artifact.kernel(kernel_name))
            slots = len(source.params) + 2  # MLX binds each input and output; AFTER and DONE order the launches
            if slots > BUFFER_ARGUMENT_SLOTS:
                raise CodegenError(
                    f"kernel {kernel_name} needs {slots} [[ buffer(i) ]] slots under execution_backend='mlx' ({len(source.params)} "
                    f"parameters and MLX's 2 launch-ordering buffers), Metal allows {BUFFER_ARGUMENT_SLOTS} per kernel: pass "
                    f"{slots - BUFFER_ARGUMENT_SLOTS} fewer tensors or scalars, or use execution_backend='torch'"
                )
            mx = mlx_module()
            if source.needs_metal4 and mx.metal.is_available():
                metal4_launch.check(kernel_name, metal4_launch.current("mlx"))
            sources[kernel_name] = source
        return sources[kernel_name]

    def compiled(self, kernel_name: str) -> Any:
        return self.kernel_source(kernel_name)

    def _metal_kernel(self, source: MLXKernelSource, roles: tuple[Role, ...]) -> Any:
        kernels = self.__dict__.setdefault("_kernels", {})
        factory = metal_kernel_factory()
        key = (factory, source.kernel_name, roles)
        if key not in kernels:
            inputs = [p.mlx_name for p, r in zip(source.params, roles) if r is not Role.OUTPUT] + [AFTER]
            outputs = [p.mlx_name for p, r in zip(source.params, roles) if r is Role.OUTPUT] + [DONE]
            body = source.source(roles)
            # MLX caches compiled kernels by name (and rebuilds when a name's source changes): one
            # name per distinct source, so two compiled modules never evict each other.
            digest = hashlib.sha256((source.header + body).encode()).hexdigest()[:16]
            kernels[key] = factory(
                name=f"{source.kernel_name}_{digest}", input_names=inputs, output_names=outputs,
                source=body, header=source.header,
            )
        return kernels[key]

    def _copy_kernel(self, msl_type: str) -> Any:
        kernels = self.__dict__.setdefault("_copies", {})
        factory = metal_kernel_factory()
        if (factory, msl_type) not in kernels:
            body = "  uint i = thread_position_in_grid.x;\n  if (i < tlm_count) tlm_dst[i] = tlm_src[i];\n"
            kernels[factory, msl_type] = factory(
                name=f"tlm_copy_{msl_type}", input_names=["tlm_src", "tlm_count", AFTER], output_names=["tlm_dst"],
                source=body, header="#include <metal_stdlib>\nusing namespace metal;\n",
            )
        return kernels[factory, msl_type]

    def _copy(self, flat: Any, count: int, size: int, after: Any) -> Any:
        """A new array of `size` elements whose first `count` are `flat`'s (the output of a kernel)."""
        from ..core.dtypes import MSL_SCALAR

        mx = mlx_module()
        threads = -(-size // COPY_THREADS) * COPY_THREADS
        tg = min(COPY_THREADS, threads)
        after = after if after is not None else mx.zeros((1,), dtype=mx.uint32)
        return self._copy_kernel(MSL_SCALAR[dtype_name(flat.dtype)])(
            inputs=[flat, mx.array(count, dtype=mx.uint32), after], output_shapes=[(size,)], output_dtypes=[flat.dtype],
            grid=(threads, 1, 1), threadgroup=(tg, 1, 1),
        )[0]

    # ---------------------------------------------------------------- calls
    def make_runner(self) -> Any:
        written = self._written_positions()
        returned = list(self.call.signature.outputs) + [i for i in sorted(written) if i not in self.call.signature.outputs]
        for launch in self.call.launches:
            self.kernel_source(launch.kernel_name)  # refuse unsupported kernels at compile time

        def run(*args: Any) -> Any:
            return self._run(args, returned)

        return run

    def _written_positions(self) -> set[int]:
        written: set[int] = set()
        for launch in self.call.launches:  # arity checked against the artifact (KernelCall.check_artifact)
            source = self.kernel_source(launch.kernel_name)
            written |= {a.position for a, p in zip(launch.arguments, source.params) if p.written and a.position is not None}
        return written

    def _run(self, args: tuple, returned: list[int]) -> Any:
        mx = mlx_module()
        bound = self.call.signature.bind(args, MLX, lambda shape, dtype: _Unwritten(tuple(shape), str(dtype).removeprefix("torch.")))
        workspaces = [_Unwritten(tuple(ws.shape(bound.env)), ws.dtype) for ws in self.call.workspaces]
        calls = _CallState(list(bound.values) + workspaces)
        after = None
        for launch in self.call.launches:
            shape = launch.shape(bound)
            if shape.empty:
                continue
            after = self._launch(launch, shape, bound, calls, after)
        results = []
        for position in returned:
            value = calls.state[position]
            param = self.call.signature.params[position]
            assert isinstance(param, TensorParam)
            shape = _shape_of(bound.values[position])
            if isinstance(value, _Unwritten):
                results.append(_poison(value.shape, value.dtype))
                continue
            count = _count(shape)
            # Written through an input: copied into the output of a kernel, which MLX orders correctly.
            value = self._copy(value, count, count, after) if position in calls.dirty else value[:count]
            shaped = value.reshape(shape)
            if dtype_name(shaped.dtype) != param.dtype:
                shaped = shaped.view(mx_dtype(param.dtype))
            results.append(shaped)
        if not results:
            return None
        return results[0] if len(results) == 1 else results

    def _launch(self, launch: KernelLaunch, shape: Any, bound: Any, calls: _CallState, after: Any) -> Any:
        mx = mlx_module()
        source = self.kernel_source(launch.kernel_name)
        pairs = list(zip(launch.arguments, source.params))
        slot = self._slot
        uses = Counter(slot(a) for a in launch.arguments if a.is_buffer)
        written_here = {slot(a) for a, p in pairs if p.written and a.is_buffer}
        for position in written_here:  # written with contents that matter (or aliased): a private array
            value = calls.state[position]
            if isinstance(value, _Unwritten) and uses[position] == 1:
                continue  # a fresh MLX output
            if position not in calls.owned or value.size < MIN_DEVICE_ELEMENTS:
                dtype = mx_dtype(next(a.dtype for a in launch.arguments if a.is_buffer and slot(a) == position))
                flat = _flat(_poison(value.shape, value.dtype) if isinstance(value, _Unwritten) else value, dtype)
                calls.state[position] = self._copy(flat, flat.size, max(flat.size, MIN_DEVICE_ELEMENTS), after)
                calls.owned.add(position)
        roles: list[Role] = []
        inputs: list[Any] = []
        outputs: list[tuple[int, tuple[int, ...], Any]] = []  # (slot, flat shape, dtype)
        for arg, param in pairs:
            if not arg.is_buffer:
                roles.append(Role.SCALAR)
                inputs.append(mx.array(arg.value(bound.env), dtype=mx_dtype(arg.dtype)))  # type: ignore[misc]
                continue
            value = calls.state[slot(arg)]
            kernel_dtype = mx_dtype(arg.dtype)
            if isinstance(value, _Unwritten) and param.written:
                roles.append(Role.OUTPUT)
                outputs.append((slot(arg), (_count(value.shape),), kernel_dtype))
            elif param.written:
                roles.append(Role.IN_PLACE)
                inputs.append(value)
                calls.dirty.add(slot(arg))
            else:
                roles.append(Role.INPUT)
                if isinstance(value, _Unwritten):  # read before any kernel wrote it
                    value = _poison(value.shape, value.dtype)
                inputs.append(self._as_input(_flat(value, kernel_dtype), after))
        inputs.append(after if after is not None else mx.zeros((1,), dtype=mx.uint32))
        threads = tuple(g * b for g, b in zip(shape.grid, shape.block))
        if any(t > MAX_GRID for t in threads):
            raise ValueError(f"kernel {launch.kernel_name}: a grid of {threads} threads exceeds what mx.fast.metal_kernel takes (2^31 - 1 per axis)")
        kernel = self._metal_kernel(source, tuple(roles))
        produced = kernel(
            inputs=inputs,
            output_shapes=[s for _, s, _ in outputs] + [(1,)],
            output_dtypes=[d for _, _, d in outputs] + [mx.uint32],
            grid=threads,
            threadgroup=tuple(shape.block),
        )
        for (position, _, _), array in zip(outputs, produced):
            calls.state[position] = array
            calls.owned.add(position)  # ours alone: later launches may write it in place
        return produced[-1]

    def _slot(self, arg: Any) -> int:
        """The call-state slot of a buffer argument: its host position, or a workspace after them."""
        if arg.position is not None:
            return arg.position
        return len(self.call.signature.params) + arg.workspace

    def _as_input(self, flat: Any, after: Any) -> Any:
        if flat.size >= MIN_DEVICE_ELEMENTS:
            return flat
        return self._copy(flat, flat.size, MIN_DEVICE_ELEMENTS, after)


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _shape_of(value: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in value.shape)


def _flat(array: Any, kernel_dtype: Any) -> Any:
    """The array as the kernel's flat element buffer (bool parameters are `char` buffers)."""
    flat = array.reshape(-1)
    return flat if flat.dtype == kernel_dtype else flat.view(kernel_dtype)


__all__ = ["MLX", "MLXKernelAdapter", "metal_kernel_factory", "mx_dtype"]
