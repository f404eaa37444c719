"""`kernel.get_profiler()` for plugin kernels: tilelang's Profiler, on the adapter's device.

tilelang's Profiler assumes CUDA in places (`torch.cuda.synchronize()` around the reference check,
tensors on the "current" GPU, CUDA-event timing when no device is named). The plugin's profiler
keeps its API and changes only those places:
- inputs are supplied on the adapter's device (CPU for the emulator, MPS for the torch backend);
- `assert_allclose` / `manual_assert_close` synchronize that device (MPS) or nothing (CPU);
- `do_bench` times with MPS events on a Mac; in the emulator it returns CPU wall time and warns
  once that the number says nothing about GPU speed;
- for `execution_backend="mlx"` the kernel gets `mx.array`s, the reference program gets the same
  values as CPU torch tensors (tilelang's references are torch code: `a.float() @ b.float()`); a
  reference written for `mx.array`s (an AttributeError on torch tensors, e.g. `.astype`) is called
  again with the `mx.array`s; results
  (torch or MLX) are compared as CPU tensors, and `do_bench` times each call up to `mx.eval` of its
  results (MLX is lazy) with wall time.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ..host import assert_tensors_close, profiler_base
from .binding import Device

EMULATOR_TIMING_WARNING = (
    "tilelang_metal: do_bench on execution_backend='emulator' measures CPU wall time of the emulator "
    "running the MSL on the CPU; it says nothing about the kernel's speed on a GPU"
)


def _as_list(outputs: Any) -> list[Any]:
    if outputs is None:
        return []
    if isinstance(outputs, (list, tuple)):
        return list(outputs)
    return [outputs]


class PluginProfiler(profiler_base()):
    """Built by `JITKernel.get_profiler()` for a plugin adapter (`host.install` routes it here)."""

    device: Device = Device("cpu", "emulator")  # set per instance by `make_profiler`
    _warned_about_emulator_timing = False  # one warning per process

    # --- inputs on the adapter's device ---------------------------------------------------
    def _get_inputs(self, with_output: bool = False, dynamic_symbolic_constraints: dict[str, int] | None = None) -> list[Any]:
        tensors = super()._get_inputs(with_output=with_output, dynamic_symbolic_constraints=dynamic_symbolic_constraints)
        if self.device.type == "mlx":
            from .mlx_emulated import from_torch

            return [from_torch(t) if hasattr(t, "detach") else t for t in tensors]
        return [t.to(self.device.type) if hasattr(t, "to") else t for t in tensors]

    def _synchronize(self) -> None:
        if self.device.type == "mps":
            import torch

            torch.mps.synchronize()

    def _outputs_of_both(self, reference_program: Callable[..., Any], input_tensors: list[Any] | None) -> tuple[list[Any], list[Any]]:
        inputs = self._get_inputs() if input_tensors is None else input_tensors
        expected = _as_list(self._reference(reference_program, inputs))
        self._synchronize()
        produced = _as_list(self.func(*inputs))
        self._synchronize()
        if len(produced) != len(expected):
            raise AssertionError(f"the kernel returned {len(produced)} outputs, the reference program {len(expected)}")
        return produced, expected

    def _reference(self, reference_program: Callable[..., Any], inputs: list[Any]) -> Any:
        if self.device.type != "mlx":
            return reference_program(*inputs)
        try:
            return reference_program(*[_torch_view(x) for x in inputs])
        except AttributeError as torch_style_failed:
            try:
                return reference_program(*inputs)  # an MLX-style reference (mx ops, `.astype`)
            except Exception:
                raise torch_style_failed from None

    # --- checks -----------------------------------------------------------------------------
    def assert_allclose(
        self,
        reference_program: Callable[..., Any],
        input_tensors: list[Any] | None = None,
        atol: float = 1e-2,
        rtol: float = 1e-2,
        max_mismatched_ratio: float = 0.01,
    ) -> None:
        produced, expected = self._outputs_of_both(reference_program, input_tensors)
        for got, want in zip(produced, expected):
            if got is None or want is None:  # a reference may skip an output it cannot define
                continue
            got, want = _torch_view(got), _torch_view(want)
            assert_tensors_close(got, want, atol=atol, rtol=rtol, max_mismatched_ratio=max_mismatched_ratio)

    def manual_assert_close(
        self,
        reference_program: Callable[..., Any],
        input_tensors: list[Any] | None = None,
        manual_check_prog: Callable[..., Any] | None = None,
    ) -> None:
        produced, expected = self._outputs_of_both(reference_program, input_tensors)
        if manual_check_prog is None:
            raise ValueError("manual_assert_close needs manual_check_prog(kernel_outputs, reference_outputs)")
        manual_check_prog(produced, expected)

    # --- timing -----------------------------------------------------------------------------
    def do_bench(self, func: Callable[..., Any] | None = None, *args: Any, backend: str = "event", device: Any = None, **kwargs: Any) -> float:
        if self.device.type == "mlx":
            return self._do_bench_mlx(func, *args, backend=backend, **kwargs)
        if self.device.type == "cpu":
            if backend not in ("event", "wall"):
                raise ValueError(f"do_bench backend {backend!r} needs a CUDA GPU; the emulator runs on the CPU: use backend='wall' (the default here)")
            if not PluginProfiler._warned_about_emulator_timing:
                PluginProfiler._warned_about_emulator_timing = True
                warnings.warn(EMULATOR_TIMING_WARNING, RuntimeWarning, stacklevel=2)
            return super().do_bench(func, *args, backend="wall", device="cpu", **kwargs)
        import torch

        return super().do_bench(func, *args, backend=backend, device=device if device is not None else torch.device(self.device.type), **kwargs)


    def _do_bench_mlx(self, func: Callable[..., Any] | None, *args: Any, backend: str, **kwargs: Any) -> float:
        import mlx.core as mx

        if backend not in ("event", "wall"):
            raise ValueError(f"do_bench backend {backend!r} is not available for execution_backend='mlx': use backend='wall' (the default here)")
        if not mx.metal.is_available():
            self._warn_emulator_timing()
        target = func if func is not None else self.adapter

        def evaluated(*inputs: Any) -> None:
            results = target(*inputs)
            if results is not None:
                mx.eval(results)  # MLX is lazy: the call is done when its results are

        return super().do_bench(evaluated, *args, backend="wall", device="cpu", **kwargs)

    @staticmethod
    def _warn_emulator_timing() -> None:
        if not PluginProfiler._warned_about_emulator_timing:
            PluginProfiler._warned_about_emulator_timing = True
            warnings.warn(EMULATOR_TIMING_WARNING, RuntimeWarning, stacklevel=3)


def _torch_view(value: Any) -> Any:
    """An MLX array as a CPU torch tensor (for tilelang's comparison); anything else unchanged."""
    if type(value).__module__.startswith("mlx"):
        from .mlx_emulated import to_torch

        return to_torch(value)
    return value


def make_profiler(adapter: Any, params: list[Any], out_idx: Any, supply_type: Any, device: Device) -> PluginProfiler:
    profiler = PluginProfiler(params, out_idx, supply_type)
    profiler.device = device
    return profiler.with_default_adapter(adapter)
