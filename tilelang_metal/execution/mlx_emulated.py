"""`mx.fast.metal_kernel` where MLX has no Metal back-end: the same call, run by the emulator.

`emulated_metal_kernel(...)` takes MLX's arguments and follows MLX's rules for the kernel it builds
(mlx/backend/common/metal_kernel.cpp): `source` is the body; the signature lists the inputs in
order (`const device T* name`, a 0-d input `constant T& name`), then the outputs (`device T*
name`), then `uint`/`uint3` parameters for every position attribute whose name occurs in the
source; `grid` counts threads, `threadgroup` is the threadgroup size. The kernel is compiled and
run by the emulator on the arrays' memory (inputs through DLPack views, so a kernel writing through
an input writes the array, as it would on the GPU); outputs start poisoned (NaN, -1) unless an
`init_value` is given. Template arguments (`template=[("T", mx.float32), ("N", 4)]`) are given to
the body as file-scope names (`using T = float;`, `constexpr int N = 4;`), which is what the body
sees in MLX's templated kernel. What MLX adds that this does not: its `utils` header
(`elem_to_loc` and friends, used by kernels with `ensure_row_contiguous=False`), `atomic_outputs`,
and partial threadgroups at the grid's edge.

`metal_kernel(...)` is the public entry for MLX kernel authors: `mx.fast.metal_kernel` itself where
MLX has a Metal GPU, this emulation elsewhere (Linux CI), with the same arguments and call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.dtypes import MSL_SCALAR

# MLX's table of position attributes and their parameter types (same order).
MLX_ATTRIBUTES = (
    ("dispatch_quadgroups_per_threadgroup", "uint"), ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"), ("grid_origin", "uint3"), ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"), ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"), ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"), ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"), ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"), ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"), ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"), ("threads_per_simdgroup", "uint"), ("threads_per_threadgroup", "uint3"),
)  # fmt: skip


def dtype_name(dtype: Any) -> str:
    """`mlx.core.float16` -> "float16"."""
    return str(dtype).rsplit(".", 1)[-1]


def to_torch(array: Any) -> Any:
    """A CPU torch tensor sharing the (evaluated) MLX array's memory."""
    import mlx.core as mx
    import torch

    mx.eval(array)
    return torch.from_dlpack(array)


def from_torch(tensor: Any) -> Any:
    """A new MLX array holding a copy of a CPU torch tensor (bfloat16 through its bits: numpy has none)."""
    import mlx.core as mx
    import torch

    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return mx.array(t.view(torch.uint16).numpy()).view(mx.bfloat16)
    return mx.array(t.numpy())


class EmulatedMetalKernel:
    def __init__(
        self,
        name: str,
        input_names: Sequence[str],
        output_names: Sequence[str],
        source: str,
        header: str = "",
        ensure_row_contiguous: bool = True,
        atomic_outputs: bool = False,
    ):
        if not output_names:
            raise ValueError("[metal_kernel] Must specify at least one output.")
        if atomic_outputs:
            raise NotImplementedError("the emulated metal_kernel does not implement atomic_outputs")
        self.name = name
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.source = source
        self.header = header
        self.ensure_row_contiguous = ensure_row_contiguous
        self.attributes = [(attr, t) for attr, t in MLX_ATTRIBUTES if attr in source]

    def full_source(self, inputs: Sequence[Any], output_dtypes: Sequence[Any], template: Sequence[tuple[str, Any]] = ()) -> str:
        """The kernel MLX would compile (with the emulator's spelling of the element types)."""
        params = []
        index = 0
        for name, array in zip(self.input_names, inputs):
            msl = MSL_SCALAR[dtype_name(array.dtype)]
            if array.ndim == 0:
                params.append(f"  constant {msl}& {name} [[ buffer({index}) ]]")
            else:
                params.append(f"  const device {msl}* {name} [[ buffer({index}) ]]")
            index += 1
        for name, dtype in zip(self.output_names, output_dtypes):
            params.append(f"  device {MSL_SCALAR[dtype_name(dtype)]}* {name} [[ buffer({index}) ]]")
            index += 1
        params += [f"  {t} {attr} [[{attr}]]" for attr, t in self.attributes]
        names = "".join(_template_name(name, value) for name, value in template)
        # MLX's generated source includes the Metal standard library and `using namespace metal` (its utils header does)
        stdlib = "" if "#include <metal_stdlib>" in self.header else "#include <metal_stdlib>\nusing namespace metal;\n"
        return f"{stdlib}{self.header}\n{names}[[kernel]] void custom_kernel_{self.name}(\n" + ",\n".join(params) + ") {\n" + self.source + "\n}\n"

    def __call__(
        self,
        *,
        inputs: Sequence[Any],
        output_shapes: Sequence[Sequence[int]],
        output_dtypes: Sequence[Any],
        grid: tuple[int, int, int],
        threadgroup: tuple[int, int, int],
        template: Any = None,
        init_value: float | None = None,
        verbose: bool = False,
        stream: Any = None,
    ) -> list[Any]:
        import torch

        from .. import emulator

        if len(inputs) != len(self.input_names):
            raise ValueError(f"[metal_kernel] Expected `inputs` to have size {len(self.input_names)} but got size {len(inputs)}.")
        if len(output_shapes) != len(self.output_names) or len(output_dtypes) != len(self.output_names):
            raise ValueError(f"[metal_kernel] Expected {len(self.output_names)} output shapes and dtypes.")
        if any(g % t for g, t in zip(grid, threadgroup)):
            # MLX dispatches partial threadgroups at the grid's edge; the emulator runs whole ones.
            raise NotImplementedError(f"the emulated metal_kernel needs a grid {grid} that is a multiple of the threadgroup {threadgroup}")
        source = self.full_source(inputs, output_dtypes, template or ())
        if verbose:
            print(source)
        kernel = emulator.compile_kernel(source)
        values: list[Any] = []
        for array in inputs:
            if array.ndim == 0:
                values.append(array.item())
                continue
            tensor = to_torch(array)
            values.append(tensor.contiguous() if self.ensure_row_contiguous else tensor)
        outputs = []
        for shape, dtype in zip(output_shapes, output_dtypes):
            torch_dtype = getattr(torch, dtype_name(dtype))
            if init_value is not None:
                fill: Any = init_value
            elif torch_dtype.is_floating_point:
                fill = float("nan")
            else:
                fill = True if torch_dtype == torch.bool else -1 if torch_dtype.is_signed else torch.iinfo(torch_dtype).max
            outputs.append(torch.full(tuple(shape), fill, dtype=torch_dtype))
        blocks = tuple(g // t for g, t in zip(grid, threadgroup))
        if all(b > 0 for b in blocks):
            kernel.launch(values + outputs, blocks, tuple(threadgroup))
        return [from_torch(t) for t in outputs]


def _template_name(name: str, value: Any) -> str:
    """One template argument as the body sees it: a type (an MLX dtype), an int or a bool."""
    if isinstance(value, bool):
        return f"constexpr bool {name} = {'true' if value else 'false'};\n"
    if isinstance(value, int):
        return f"constexpr int {name} = {value};\n"
    kind = dtype_name(value)
    if kind not in MSL_SCALAR:
        raise ValueError(f"[metal_kernel] template argument {name}={value!r}: use an MLX dtype, an int or a bool")
    return f"using {name} = {MSL_SCALAR[kind]};\n"


def emulated_metal_kernel(*args: Any, **kwargs: Any) -> EmulatedMetalKernel:
    """Drop-in for `mx.fast.metal_kernel` (same arguments)."""
    return EmulatedMetalKernel(*args, **kwargs)


def metal_kernel(*args: Any, **kwargs: Any) -> Any:
    """`mx.fast.metal_kernel` where MLX has a Metal GPU (a Mac), the emulator elsewhere: the same
    arguments, the same call (`kernel(inputs=..., template=..., grid=..., threadgroup=...,
    output_shapes=..., output_dtypes=...)`), so a custom MLX kernel is tested in Linux CI."""
    import mlx.core as mx

    if mx.metal.is_available():
        return mx.fast.metal_kernel(*args, **kwargs)
    return emulated_metal_kernel(*args, **kwargs)


__all__ = ["EmulatedMetalKernel", "MLX_ATTRIBUTES", "dtype_name", "emulated_metal_kernel", "from_torch", "metal_kernel", "to_torch"]
