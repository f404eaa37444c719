"""One printed Metal kernel as an `mx.fast.metal_kernel`: a header, a body and MLX's argument names.

MLX generates the kernel's signature itself (from `input_names`, `output_names`, the inputs'
dtypes and the position attributes the body mentions) and takes only the *body*. So the plugin's
kernel is split at its parameter list: everything before the kernel (includes, helper functions)
is MLX's `header`; the body is the kernel's own body behind a prologue that binds the plugin's
parameter names to MLX's:

    auto A = tlm_mlx_A;                             // read-only buffer: an MLX input
    auto C = tlm_mlx_C;                             // written, fresh: an MLX output
    auto C = (device half*)(tlm_mlx_C);             // written in place: a private copy passed as input
    auto n = tlm_mlx_n;                             // scalar: a 0-d MLX input (`constant T&`)
    uint3 blockIdx = uint3(threadgroup_position_in_grid);

Threadgroup memory stays declared in the body, where MSL requires it (kernel scope). The
parameters and where the kernel starts come from the kernel's artifact record (codegen/artifact.py),
not from reading the signature; the header drops the artifact line (it describes the plugin's
kernels, not the one MLX writes).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..codegen.artifact import BufferParam, KernelRecord, PositionParam, ScalarParam, strip_artifact
from ..codegen.kernel_text import matching_bracket
from .metal4_launch import runs_metal4

PREFIX = "tlm_mlx_"
AFTER = PREFIX + "after"  # input: the previous launch's `done`, so MLX orders the two launches
DONE = PREFIX + "done"  # output: one element, never written; what later work waits on


class Role(Enum):
    SCALAR = "scalar"  # a 0-d input
    INPUT = "input"  # a buffer the kernel only reads
    OUTPUT = "output"  # a written buffer with no prior contents: MLX allocates it
    IN_PLACE = "in_place"  # a written buffer whose contents matter: a private copy, written through


@dataclass(frozen=True)
class KernelParam:
    name: str  # the plugin's parameter name
    kind: str  # "buffer" | "scalar"
    elem_type: str  # MSL element type
    written: bool

    @property
    def mlx_name(self) -> str:
        return PREFIX + self.name


@dataclass(frozen=True)
class MLXKernelSource:
    """The parts of one printed kernel that an `mx.fast.metal_kernel` is made of."""

    kernel_name: str
    header: str
    body: str
    params: tuple[KernelParam, ...]  # the kernel's [[ buffer(i) ]] parameters, in order
    positions: tuple[PositionParam, ...]
    instructions: tuple[str, ...] = ()  # the matrix instructions it runs (its artifact record's)

    @property
    def needs_metal4(self) -> bool:
        """Cooperative tensors (its record says it runs an MPP instruction), which MSL 4 (macOS 26) provides."""
        return runs_metal4(self.instructions)

    def source(self, roles: tuple[Role, ...]) -> str:
        """The body MLX compiles for one assignment of roles to the parameters."""
        if len(roles) != len(self.params):
            raise ValueError(f"kernel {self.kernel_name}: {len(roles)} roles for {len(self.params)} parameters")
        lines = [f"  // {self.kernel_name}: the plugin's parameter names, bound to MLX's arguments"]
        for p, role in zip(self.params, roles):
            if role is Role.IN_PLACE:
                lines.append(f"  auto {p.name} = (device {p.elem_type}*)({p.mlx_name});")
            else:
                lines.append(f"  auto {p.name} = {p.mlx_name};")
        for pos in self.positions:
            lines.append(f"  {pos.type} {pos.name} = {pos.type}({pos.attribute});")
        # Not a nested block: threadgroup arrays must stay at kernel function scope.
        return "\n".join(lines) + "\n" + self.body + "\n"


def _matching(text: str, open_pos: int, open_ch: str, close_ch: str) -> int:
    close = matching_bracket(text, open_pos, open_ch, close_ch)
    if close is None:
        raise ValueError(f"unbalanced {open_ch}{close_ch} in the kernel source")
    return close


def mlx_kernel_source(msl: str, record: KernelRecord) -> MLXKernelSource:
    """Split the printed MSL of the kernel `record` describes (its module's source, or the kernel's
    own from `emulator.split_kernels`) into MLX's header and body."""
    start = msl.find(record.opening())
    if start < 0 or msl.find(record.opening(), start + 1) >= 0:
        raise ValueError(f"kernel {record.name}: its artifact's opening line `{record.opening()}` is not once in the source")
    close = _matching(msl, start + len(record.opening()) - 1, "(", ")")
    open_brace = msl.index("{", close)
    end_brace = _matching(msl, open_brace, "{", "}")
    params: list[KernelParam] = []
    positions: list[PositionParam] = []
    for p in record.params:
        if isinstance(p, BufferParam):
            params.append(KernelParam(p.name, "buffer", p.elem_type, written=not p.is_const))
        elif isinstance(p, ScalarParam):
            params.append(KernelParam(p.name, "scalar", p.elem_type, written=False))
        elif isinstance(p, PositionParam):
            positions.append(p)
        else:
            raise ValueError(f"kernel {record.name}: {p.describe()} has no MLX form (TVM's argument struct)")
    return MLXKernelSource(
        kernel_name=record.name,
        header=strip_artifact(msl[:start]),
        body=msl[open_brace + 1 : end_brace],
        params=tuple(params),
        positions=tuple(positions),
        instructions=record.instructions,
    )


__all__ = ["AFTER", "DONE", "KernelParam", "MLXKernelSource", "PREFIX", "Role", "mlx_kernel_source"]
