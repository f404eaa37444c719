"""tilelang's calling convention for a lowered Metal module, shared by the plugin's adapters.

`KernelCall` = the host signature (binding.py: argument checks, symbolic sizes, `out_idx`
outputs) + the module's launches in host program order (launch.py: each kernel's arguments and
grid from its own host call site), checked against the kernels' artifact records (the MSL's own
account of each kernel's parameters and threadgroup size, codegen/artifact.py). Adapters only say
where tensors live and how one launch runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..host import base_kernel_adapter
from ..codegen.artifact import STANDARD, BufferParam, KernelArtifact, KernelRecord, artifact_of
from ..codegen.debug_print import refuse_debug_print
from .binding import KERNEL_DTYPES, BoundCall, CallSignature, Device, poisoned, torch_dtype
from .launch import KernelLaunch, LaunchShape, Workspace, kernel_launches, workspace_plan

__all__ = ["KERNEL_DTYPES", "KernelCall", "PluginKernelAdapter", "torch_dtype"]


class KernelCall:
    def __init__(self, result_idx: list[int], func: Any, device_mod: Any, host_mod: Any):
        self.signature = CallSignature(func, result_idx)
        self.workspaces: list[Workspace] = workspace_plan(self.signature, host_mod)
        self.launches: list[KernelLaunch] = kernel_launches(self.signature, host_mod, device_mod)
        self.records: dict[str, KernelRecord] = {}  # kernel name -> its artifact record (check_artifact)
        buffers = [arg for launch in self.launches for arg in launch.arguments if arg.is_buffer]
        self.signature.set_accesses(
            used={a.position for a in buffers}, written={a.position for a in buffers if a.written}  # type: ignore[misc]
        )

    def check_artifact(self, artifact: KernelArtifact) -> None:
        """Every host call site agrees with its kernel's record: the kernel exists, takes as many
        [[ buffer(i) ]] arguments, a buffer where the host passes one, and a writable one where
        the host's analysis says the kernel writes it."""
        if artifact.convention != STANDARD:
            raise ValueError(f"tilelang_metal: the MSL uses the {artifact.convention} convention; the plugin's adapters launch {STANDARD} kernels")
        for launch in self.launches:
            record = artifact.kernel(launch.kernel_name)
            bound = record.bound
            if len(bound) != len(launch.arguments):
                raise ValueError(
                    f"kernel {launch.kernel_name}: the MSL has {len(bound)} buffer parameters ({', '.join(p.name for p in bound)}), "
                    f"the host call site passes {len(launch.arguments)}"
                )
            for arg, param in zip(launch.arguments, bound):
                is_buffer = isinstance(param, BufferParam)
                if arg.is_buffer != is_buffer or (is_buffer and arg.written and param.is_const):  # type: ignore[union-attr]
                    raise ValueError(f"kernel {launch.kernel_name}: host argument {arg.name} does not fit MSL {param.describe()}")
        self.records = {launch.kernel_name: artifact.kernel(launch.kernel_name) for launch in self.launches}

    def bind(self, args: tuple, device: Device, poison: bool) -> BoundCall:
        """Checked arguments, freshly allocated outputs and workspaces (poisoned: NaN / -1, so
        elements the kernels never write show up)."""
        import torch

        if poison:
            allocate: Callable[[list[int], Any], Any] = lambda shape, dtype: poisoned(shape, dtype, device.type)
        else:
            allocate = lambda shape, dtype: torch.empty(shape, dtype=dtype, device=device.type)
        bound = self.signature.bind(args, device, allocate)
        bound.workspaces = [allocate(ws.shape(bound.env), torch_dtype(ws.dtype)) for ws in self.workspaces]
        return bound

    def run(self, args: tuple, device: Device, poison: bool, launch_one: Callable[[KernelLaunch, LaunchShape, BoundCall], None]) -> Any:
        """Bind, run every launch with a non-empty grid in order, return the `out_idx` outputs."""
        bound = self.bind(args, device, poison)
        for launch in self.launches:
            shape = launch.shape(bound)
            if not shape.empty:
                self.check_block(shape)
                launch_one(launch, shape, bound)
        return bound.results()

    def check_block(self, shape: LaunchShape) -> None:
        """The host's threadgroup size is the one the kernel was printed for (when static)."""
        record = self.records.get(shape.kernel_name)
        if record is not None and record.block is not None and tuple(shape.block) != record.block:
            raise ValueError(
                f"kernel {shape.kernel_name}: the host launches threadgroups of {tuple(shape.block)} threads, "
                f"the MSL was printed for {record.block}"
            )


class PluginKernelAdapter(base_kernel_adapter()):
    """What the plugin's adapters share: the MSL source and a KernelCall made at construction.

    tilelang's base class builds the callable (`_convert_torch_func`) inside its own __init__, so
    the call plan is made there, from arguments stashed before delegating.
    """

    def __init__(
        self,
        params: list,
        result_idx: Any,
        func_or_mod: Any,
        device_mod: Any,
        kernel_source: str,
        host_mod: Any = None,
        target: Any = None,
    ):
        self.kernel_global_source = kernel_source
        self.artifact = artifact_of(kernel_source)  # one line for MSL the plugin did not print
        self._call_inputs = (func_or_mod, device_mod, host_mod)
        super().__init__(func_or_mod, params=params, result_idx=result_idx)

    def get_kernel_source(self, kernel_only: bool = True) -> str:
        return self.kernel_global_source

    def _convert_torch_func(self) -> Any:
        func, device_mod, host_mod = self._call_inputs
        if host_mod is None:
            raise ValueError("tilelang_metal: the adapter needs the lowered host module (artifact.host_mod)")
        if not self.shows_print_output:
            refuse_debug_print(self.artifact, self.device.backend)
        self.call = KernelCall(self.result_idx, func, device_mod, host_mod)
        self.call.check_artifact(self.artifact)
        return self.make_runner()

    device: Device  # where the adapter's tensors live
    shows_print_output = False  # whether T.print's lines reach the user (the emulator's do)

    def make_runner(self) -> Any:
        raise NotImplementedError

    def make_profiler(self, params: list, result_idx: list[int], supply_type: Any) -> Any:
        """What `kernel.get_profiler()` returns for this adapter (execution/profiling.py)."""
        from .profiling import make_profiler

        return make_profiler(self, params, result_idx, supply_type, self.device)

    def warm_up(self) -> None:
        """Build every kernel of the module now (otherwise the first call builds it), so callers
        can time compilation apart from the launch."""
        for launch in self.call.launches:
            self.compiled(launch.kernel_name)

    def compiled(self, kernel_name: str) -> Any:
        raise NotImplementedError
