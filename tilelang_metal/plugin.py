"""Assemble what the plugin installs into tilelang: manifest, target hooks, GEMM hooks, codegen."""

from __future__ import annotations

from typing import Any

from . import config
from . import host as _host
from . import gemm as gemm_metal
from .pipeline import codegen_build, codegen_build_runtime
from .errors import CodegenError, ConfigError, GemmLoweringError, MetalLoweringError
from .execution.backends import EMULATOR, MLX, execution_backends, unavailable_hint
from .lowering_cache import caching_device_preparation, source_fingerprint
from .pipeline import lower_metal
from .target.normalize import detect_metal_target, is_metal, normalize_metal_target
from .version import __version__


def _gemm_lower_hook(original: Any) -> Any:
    def lower(gemm: Any, layout_map: Any, target: Any, thread_bounds: Any, thread_index: Any, mbar_phase: Any) -> Any:
        if is_metal(target):
            return gemm_metal.lower(gemm, layout_map, target, thread_bounds, thread_index)
        return original(gemm, layout_map, target, thread_bounds, thread_index, mbar_phase)

    return lower


def _gemm_infer_layout_hook(original: Any) -> Any:
    def infer_layout(gemm: Any, target: Any, thread_bounds: Any) -> Any:
        if is_metal(target):
            return gemm_metal.infer_layout(gemm, target, thread_bounds)
        return original(gemm, target, thread_bounds)

    return infer_layout


NO_METAL_HERE = (
    "no Metal GPU on this host (Metal runs on macOS on Apple silicon); on any host, pass "
    'target="metal" (or a Target with the "metal4" key for cooperative tensors, e.g. '
    "tilelang_metal.kernels.metal4_target()) to tilelang.compile / @tilelang.jit, and "
    'execution_backend="emulator" to run the MSL on the CPU'
)


def _detect_metal_or_explain() -> Any:
    """tilelang's `target="auto"` detector: the local Metal target, or an error that tilelang lists
    in its "No registered target detector found an available target" message."""
    detected = detect_metal_target()
    if detected is None:
        raise RuntimeError(NO_METAL_HERE)
    return detected


def _codegen_via_global(mod: Any, target: Any) -> Any:
    # Go through the registered TVM global so the plugin codegen is reachable by name as well.
    return _host.get_global_func(_host.CODEGEN_GLOBAL)(mod, target)


def _runtime_codegen_via_global(mod: Any, target: Any) -> Any:
    # tilelang asks for a compiled device module only for execution backends with device compile
    # (tvm_ffi): TVM's Metal runtime module, in the signature that runtime launches.
    return _host.get_global_func(_host.CODEGEN_RUNTIME_GLOBAL)(mod, target)


def _pass_config_scope(pass_configs: Any) -> tuple[dict, Any]:
    """tilelang's pass configs without the plugin's, and the options scope the kernel is lowered in
    (config.py: the plugin's pass configs over the settings)."""
    _, rest = config.split_pass_configs(pass_configs)
    return rest, config.compile_scope(pass_configs)


def _options_key() -> str:
    return config.current_options().key()


def _make_emulator_adapter(**kwargs: Any) -> Any:
    from .execution.emulator_adapter import EmulatorKernelAdapter

    return EmulatorKernelAdapter(**kwargs)


def _make_mlx_adapter(**kwargs: Any) -> Any:
    from .execution.mlx_adapter import MLXKernelAdapter

    return MLXKernelAdapter(**kwargs)


def _make_mps_adapter(**kwargs: Any) -> Any:
    from .execution.mps_adapter import MPSKernelAdapter

    return MPSKernelAdapter(**kwargs)


def build_hooks() -> _host.HostHooks:
    mark_host_context = _host.in_tree_host_context_hook()
    manifest = _host.BackendModule(
        name=_host.PLUGIN_BACKEND_NAME,
        target_kinds=("metal",),
        pipelines={"metal": _host.PassPipeline("metal", lower_metal)},
        device_codegens={"metal": _host.DeviceCodegen("metal", build=_runtime_codegen_via_global, build_without_compile=_codegen_via_global)},
        host_codegen_hooks={"metal": (_host.HostCodegenHook("metal_context", mark_host_context),)},
        execution_backends=execution_backends(),
        host_codegens=_host.STANDARD_HOST_CODEGENS,
    )
    return _host.HostHooks(
        manifest=manifest,
        normalize_target=normalize_metal_target,
        detect_target=_detect_metal_or_explain,
        gemm_lower=_gemm_lower_hook,
        gemm_infer_layout=_gemm_infer_layout_hook,
        codegen_build=codegen_build,
        codegen_build_runtime=codegen_build_runtime,
        cache_identity={"tilelang_metal": __version__, "source": source_fingerprint()},
        options_scope=config.compile_scope,
        options_key=_options_key,
        error_types=(MetalLoweringError, GemmLoweringError, CodegenError, ConfigError),
        adapters={EMULATOR: _make_emulator_adapter, "torch": _make_mps_adapter, MLX: _make_mlx_adapter},
        unavailable_hint=unavailable_hint,
        pass_config_scope=_pass_config_scope,
        device_preparation=caching_device_preparation,
    )
