"""Installing the plugin into stock tilelang, and taking it out again: the backend manifest, the
target normalizer and detector, the FFI globals of the GEMM tile op, the kernel-cache key, the JIT
memo, the adapter dispatch and the profiler. Each swap records exactly what it replaced; `uninstall()`
puts those objects back, in reverse order. Also the FFI registry calls the plugin makes."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .base import BackendModule, tvm_ffi
from .. import config
from ..errors import CodegenError
from .vocab import (
    CODEGEN_GLOBAL,
    CODEGEN_RUNTIME_GLOBAL,
    FUNCTION_INFO_FROM_JSON,
    GEMM_INFER_LAYOUT_GLOBAL,
    GEMM_LOWER_GLOBAL,
    METAL_MODULE_FACTORY,
    PLUGIN_BACKEND_NAME,
    RuntimeFunctionInfo,
)

TVM_FFI_BACKEND = "tvm_ffi"  # tilelang's own adapter over the module device compile makes


def get_global_func(name: str) -> Callable[..., Any] | None:
    return tvm_ffi.get_global_func(name, allow_missing=True)


def register_global_func(name: str, func: Callable[..., Any]) -> None:
    tvm_ffi.register_global_func(name, f=func, override=True)


def register_error_types(*classes: type) -> None:
    """Let the plugin's exceptions cross TVM's FFI with their own type (raised inside tilelang's
    pass callbacks, they would otherwise reach the user as a plain RuntimeError)."""
    for cls in classes:
        tvm_ffi.register_error(cls.__name__, cls)


def make_source_module(source: str, fmt: str = "metal") -> Any:
    """A stock TVM source module: `kernel_source`/`inspect_source()` and the torch adapter read it."""
    return tvm_ffi.get_global_func("runtime.SourceModuleCreate")(source, fmt)


def metal_runtime_available() -> bool:
    return get_global_func(METAL_MODULE_FACTORY) is not None


def metal_runtime_unusable() -> str | None:
    """Why device compile cannot make a launchable Metal module here (TVM then makes its fallback
    module: the MSL to inspect, nothing to launch), or None when it can."""
    if get_global_func(METAL_MODULE_FACTORY) is None:
        return f"TVM's Metal runtime ({METAL_MODULE_FACTORY}) is not in this build: only tilelang's macOS wheel has it"
    if config.tvm_compile_force_fallback():
        return "TVM_COMPILE_FORCE_FALLBACK is set"
    return None


def refuse_unlaunchable_metal_module(execution_backend: str) -> None:
    """Raised where a module made without TVM's Metal runtime would be launched."""
    why = metal_runtime_unusable()
    if why is not None:
        raise CodegenError(
            f"execution_backend={execution_backend!r} cannot launch this kernel: it was compiled without a Metal runtime "
            f"({why}), so its module holds only the MSL; use execution_backend='emulator' (or 'torch' on a Mac)"
        )


def make_metal_runtime_module(sources: dict[str, str], infos: list[RuntimeFunctionInfo], inspect_source: str) -> Any:
    """A module of TVM's Metal runtime: `sources` maps each kernel to an MSL file holding it (the
    runtime compiles it when the kernel is first launched), `infos` says how to launch each."""
    factory = get_global_func(METAL_MODULE_FACTORY)
    if factory is None:
        raise CodegenError(
            f"execution_backend='tvm_ffi' needs TVM's Metal runtime ({METAL_MODULE_FACTORY}), which only tilelang's macOS "
            "wheel has; on this host use execution_backend='emulator'"
        )
    fmap = tvm_ffi.get_global_func(FUNCTION_INFO_FROM_JSON)(json.dumps({"func_info": {i.name: i.to_json() for i in infos}}))
    return factory({name: text.encode() for name, text in sources.items()}, "metal", fmap, {"metal": inspect_source})


def in_tree_host_context_hook() -> Any:
    """The in-tree host-codegen hook (marks host functions with the Metal context); reused as is."""
    import tilelang.metal.codegen as metal_codegen

    return metal_codegen.mark_host_metal_context


def resolve_target(target: Any) -> Any:
    """tilelang's own target resolution (normalizers included) as a Target object."""
    from tilelang.backend.target import determine_target

    return determine_target(target, return_object=True)


# --------------------------------------------------------------------------------------------
# Hook bookkeeping
# --------------------------------------------------------------------------------------------


@dataclass
class _Installed:
    restores: list[Callable[[], None]] = field(default_factory=list)


_lock = threading.RLock()
_installed: _Installed | None = None


def is_installed() -> bool:
    return _installed is not None


def _swap_attr(owner: Any, name: str, value: Any, record: _Installed) -> Any:
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    record.restores.append(lambda: setattr(owner, name, original))
    return original


def _swap_global(name: str, func: Callable[..., Any], record: _Installed) -> Callable[..., Any]:
    original = get_global_func(name)
    if original is None:
        raise RuntimeError(f"tilelang_metal: expected the FFI global {name!r} in tilelang; this tilelang build is not supported")
    register_global_func(name, func)
    record.restores.append(lambda: register_global_func(name, original))
    return original


def _swap_macro_rewrite(record: _Installed) -> None:
    """tilelang's macro rewrite done once per library macro (host/frontend.py)."""
    from tilelang.language.eager import builder

    from .frontend import caching_mutate

    _swap_attr(builder, "mutate", caching_mutate(builder.mutate), record)


def _swap_device_preparation(wrap: Callable[[Callable[[Any], Any]], Callable[[Any], Any]], record: _Installed) -> None:
    """tilelang's passes between the host/device split and the device codegen hook (LowerIntrin,
    Simplify, HoistBroadcastValues), run through `wrap` (the plugin's lowering cache)."""
    import importlib

    engine_lower = importlib.import_module("tilelang.engine.lower")  # the package's `lower` attribute is the function
    _swap_attr(engine_lower, "_prepare_device_codegen_mod", wrap(engine_lower._prepare_device_codegen_mod), record)


def _swap_backend(manifest: BackendModule, record: _Installed) -> None:
    from tilelang.backend import module as backend_module

    backends = backend_module._BACKENDS
    index = backend_module._TARGET_KIND_INDEX
    saved_backends = dict(backends)
    saved_index = {kind: list(names) for kind, names in index.items()}
    for kind in manifest.target_kinds:
        for name in index.get(kind, []):
            backends.pop(name, None)
        index[kind] = [manifest.name]
    backends[manifest.name] = manifest

    def restore() -> None:
        backends.clear()
        backends.update(saved_backends)
        index.clear()
        index.update(saved_index)

    record.restores.append(restore)


def _swap_target_hooks(normalizer: Callable[..., Any], detector: Callable[..., Any], record: _Installed) -> None:
    from tilelang.backend import target as backend_target

    normalizers = backend_target._TARGET_NORMALIZERS
    detectors = backend_target._TARGET_DETECTORS
    saved_norm = normalizers.get("metal")
    saved_det = detectors.get("metal")
    backend_target.register_target_normalizer("metal", normalizer, override=True)
    backend_target.register_target_detector("metal", detector, override=True)

    def restore() -> None:
        for table, saved in ((normalizers, saved_norm), (detectors, saved_det)):
            if saved is None:
                table.pop("metal", None)
            else:
                table["metal"] = saved

    record.restores.append(restore)


def _swap_cache_key(identity: dict[str, str], options_scope: Callable[[Any], Any], options_key: Callable[[], str], record: _Installed) -> None:
    """Metal kernels compiled while the plugin is active get the plugin's identity and the key of
    the compile's lowering options in their cache key (tilelang's key knows nothing about which
    backend, under which options, lowered a kernel). Inside `KernelCache.cached` (`_swap_compile_scope`)
    these are the options the kernel is then lowered with."""
    from tilelang.cache.kernel_cache import KernelCache

    original = KernelCache.__dict__["_generate_key"]

    def generate_key(self, func, out_idx, execution_backend="tvm_ffi", args=None, target="auto", *rest, **kwargs):
        key = original(self, func, out_idx, execution_backend, args, target, *rest, **kwargs)
        pass_configs = kwargs.get("pass_configs", rest[1] if len(rest) > 1 else None)
        return _stamp_metal_key(key, target, pass_configs, identity, options_scope, options_key)

    _swap_attr(KernelCache, "_generate_key", generate_key, record)


def _stamp_metal_key(key: str, target: Any, pass_configs: Any, identity: dict[str, str], options_scope: Callable[[Any], Any],
                     options_key: Callable[[], str]) -> str:
    """`key` mixed with the plugin's identity and the key of the lowering options `pass_configs` give
    (with the settings), for a Metal target; other targets' keys are returned unchanged."""
    kind = getattr(getattr(target, "kind", None), "name", str(target))
    if "metal" not in str(kind):
        return key
    with options_scope(pass_configs):
        stamp = json.dumps({**identity, "options": options_key()}, sort_keys=True)
    return hashlib.sha256((key + stamp).encode()).hexdigest()


def _switch_memo(owner: Any, stamp: str, names: tuple[str, ...], make_empty: Callable[[], tuple[Any, ...]]) -> None:
    """Give `owner` the memo attributes `names` kept for options key `stamp`: the first call under a new
    key parks the current ones under the key they were filled with and takes that key's (or empty ones)."""
    state = owner.__dict__
    seen = state.get("_tilelang_metal_settings")
    if seen == stamp:
        return
    if seen is not None:
        memos = state.setdefault("_tilelang_metal_memos", {})
        memos[seen] = tuple(getattr(owner, name) for name in names)
        for name, memo in zip(names, memos.pop(stamp, None) or make_empty()):
            setattr(owner, name, memo)
    state["_tilelang_metal_settings"] = stamp


def _swap_compile_scope(options_scope: Callable[[Any], Any], record: _Installed) -> None:
    """`KernelCache.cached` (every `tilelang.compile`) runs in one options scope: the cache key and
    the lowering of a miss use the same lowering options, built once."""
    from tilelang.cache.kernel_cache import KernelCache

    original = KernelCache.__dict__["cached"]

    @functools.wraps(original)
    def cached(self, *args, **kwargs):
        with options_scope(kwargs.get("pass_configs")):
            return original(self, *args, **kwargs)

    _swap_attr(KernelCache, "cached", cached, record)


def _swap_jit_memo(options_scope: Callable[[Any], Any], options_key: Callable[[], str], record: _Installed) -> None:
    """`@tilelang.jit` functions memoize kernels by call arguments only. Keep one memo per key of
    the lowering options, so a kernel lowered under one value is never returned under another; the
    call runs in that options scope, so a compile it triggers lowers under the same options."""
    jit_module = importlib.import_module("tilelang.jit")
    jit_impl = jit_module.JITImpl
    original = jit_impl.__dict__["__call__"]
    new_call_form_cache = jit_module._CallFormCache

    @functools.wraps(original)
    def call(self, *args, **kwargs):
        with options_scope(getattr(self, "pass_configs", None)):
            _switch_memo(self, options_key(), ("_kernel_cache", "_call_form_cache"), lambda: ({}, new_call_form_cache()))
            return original(self, *args, **kwargs)

    _swap_attr(jit_impl, "__call__", call, record)


def _swap_autotune(identity: dict[str, str], options_scope: Callable[[Any], Any], options_key: Callable[[], str],
                   memory_only: tuple[str, ...], record: _Installed) -> None:
    """`@tilelang.autotune` keeps tuned kernels in three places that know nothing of the plugin: the
    decorated function's memo (by call arguments), and the autotuner's result cache in memory and on
    disk (by a key of the function's source, configs and compile arguments). Keep one memo per key of
    the lowering options, stamp the plugin identity and that key on the result-cache key of Metal
    targets (as `_swap_cache_key` does for the kernel cache), and keep results of the plugin's own
    execution backends (`memory_only`, adapters tilelang cannot serialize) off the disk."""
    tuner_module = importlib.import_module("tilelang.autotuner.tuner")
    param_module = importlib.import_module("tilelang.autotuner.param")
    impl, tuner, result = tuner_module.AutoTuneImpl, tuner_module.AutoTuner, param_module.AutotuneResult
    original_call = impl.__dict__["__call__"]
    original_key = tuner.__dict__["generate_cache_key"]
    original_save = result.__dict__["save_to_disk"]

    @functools.wraps(original_call)
    def call(self, *args, **kwargs):
        with options_scope(getattr(self.jit_impl, "pass_configs", None)):
            _switch_memo(self, options_key(), ("_tuner_cache",), lambda: ({},))
            return original_call(self, *args, **kwargs)

    @functools.wraps(original_key)
    def generate_cache_key(self, parameters, extra_parameters):
        key = original_key(self, parameters, extra_parameters)
        if key is None:
            return None
        args = self.compile_args
        return _stamp_metal_key(key, args.target, args.pass_configs, identity, options_scope, options_key)

    @functools.wraps(original_save)
    def save_to_disk(self, path, verbose=False):
        kernel = self.kernel
        if kernel.execution_backend in memory_only and getattr(kernel.backend, "name", None) == PLUGIN_BACKEND_NAME:
            return None
        return original_save(self, path, verbose)

    _swap_attr(impl, "__call__", call, record)
    _swap_attr(tuner, "generate_cache_key", generate_cache_key, record)
    _swap_attr(result, "save_to_disk", save_to_disk, record)


def _swap_adapter_dispatch(adapters: dict[str, Callable[..., Any]], record: _Installed) -> None:
    """Route the named execution backends to the plugin's adapters, in JITKernel and in the
    kernel-cache dispatch (names tilelang does not know get a memory-only cache)."""
    kernel_module = importlib.import_module("tilelang.jit.kernel")
    jit_kernel = kernel_module.JITKernel
    original = jit_kernel.__dict__["_create_adapter_from_artifact"]

    def create_adapter_from_artifact(self, tilelang_func, out_idx, artifact, pass_configs, compile_metadata):
        make_adapter = adapters.get(self.execution_backend)
        if self.execution_backend == TVM_FFI_BACKEND and self.backend.name == PLUGIN_BACKEND_NAME:
            refuse_unlaunchable_metal_module(self.execution_backend)  # device compile made a source-only module
        if make_adapter is not None and self.backend.name == PLUGIN_BACKEND_NAME:
            return make_adapter(
                params=artifact.params,
                # a copy: tilelang's adapter base class writes the positions of negative indices
                # into the list it gets, so a caller's list shared by two compiles changed meaning
                result_idx=list(out_idx) if isinstance(out_idx, list) else out_idx,
                func_or_mod=tilelang_func,
                device_mod=artifact.device_mod,
                host_mod=artifact.host_mod,
                kernel_source=artifact.kernel_source,
                target=self.target,
            )
        return original(self, tilelang_func, out_idx, artifact, pass_configs, compile_metadata)

    _swap_attr(jit_kernel, "_create_adapter_from_artifact", create_adapter_from_artifact, record)

    import tilelang.cache as cache_pkg

    dispatch = cache_pkg._dispatch_map
    added = [name for name in adapters if name not in dispatch]
    for name in added:
        dispatch[name] = make_memory_only_kernel_cache()

    def restore() -> None:
        for name in added:
            dispatch.pop(name, None)

    record.restores.append(restore)


def _swap_pass_configs(scope: Callable[[Any], tuple[Any, Any]], record: _Installed) -> None:
    """The plugin's own `pass_configs` keys (`tilelang_metal.*`) never reach TVM's PassContext, which
    refuses keys not registered in C++: `scope` splits them off and returns the options scope the
    kernel is lowered and printed in (the one the kernel cache opened, when it did). Kernel-cache
    keys are computed before, from the whole dict."""
    kernel_module = importlib.import_module("tilelang.jit.kernel")
    jit_kernel = kernel_module.JITKernel
    original = jit_kernel.__dict__["_compile_artifact"]

    @functools.wraps(original)
    def compile_artifact(self, tilelang_func, pass_configs, compile_metadata):
        rest, options = scope(pass_configs)
        with options:
            return original(self, tilelang_func, rest, compile_metadata)

    _swap_attr(jit_kernel, "_compile_artifact", compile_artifact, record)


def make_memory_only_kernel_cache() -> Any:
    """A kernel cache for backends whose artifacts are not serialized by tilelang (memory only)."""
    from tilelang.cache.kernel_cache import KernelCache

    class MemoryOnlyKernelCache(KernelCache):
        # KernelCache.__new__ keeps its singleton in `cls._instance`, which a subclass inherits: once
        # anything has built a bare KernelCache, this class would return that instance (and write to disk)
        _instance = None

        def _load_kernel_from_disk(self, *args: Any, **kwargs: Any) -> None:
            return None

        def _save_kernel_to_disk(self, *args: Any, **kwargs: Any) -> None:
            return None

        def _set_adapter_cache_path(self, *args: Any, **kwargs: Any) -> None:
            return None

    return MemoryOnlyKernelCache()


def profiler_base() -> type:
    """tilelang's `Profiler` (what `JITKernel.get_profiler()` returns), for the plugin's subclass."""
    from tilelang.profiler import Profiler

    return Profiler


def assert_tensors_close(got: Any, want: Any, *, atol: float, rtol: float, max_mismatched_ratio: float) -> None:
    """tilelang's element-ratio tolerant comparison (the one its Profiler uses)."""
    from tilelang.utils.tensor import torch_assert_close

    torch_assert_close(got, want, rtol=rtol, atol=atol, max_mismatched_ratio=max_mismatched_ratio, base_name="tilelang", ref_name="ref")


def _swap_profiler(record: _Installed) -> None:
    """`kernel.get_profiler()` of a kernel run by a plugin adapter asks the adapter for its
    profiler (stock tilelang's assumes CUDA); every other kernel gets tilelang's own."""
    jit_kernel = importlib.import_module("tilelang.jit.kernel").JITKernel
    original = jit_kernel.__dict__["get_profiler"]

    @functools.wraps(original)
    def get_profiler(self, *args: Any, **kwargs: Any) -> Any:
        make = getattr(self.adapter, "make_profiler", None)
        if make is None or self.backend.name != PLUGIN_BACKEND_NAME:
            return original(self, *args, **kwargs)
        profiler = original(self, *args, **kwargs)  # tilelang's, for its parameter handling
        return make(profiler.params, profiler.result_idx, profiler.supply_type)

    _swap_attr(jit_kernel, "get_profiler", get_profiler, record)


_backend_hint_installed = False
_unavailable_hint: Callable[[str], str | None] = lambda name: None


def _install_inactive_backend_hint(plugin_backends: tuple[str, ...], unavailable_hint: Callable[[str], str | None]) -> None:
    """After `deactivate()`, `execution_backend="emulator"` on a Metal target fails in tilelang with
    only "Allowed: torch, tvm_ffi". Add how to get it back. Installed once, at the first
    activation, and kept on purpose: it changes that error's text and nothing else (every
    successful resolution and every other error pass through untouched)."""
    global _backend_hint_installed, _unavailable_hint
    _unavailable_hint = unavailable_hint  # why a plugin backend is unavailable (e.g. MLX not installed)
    if _backend_hint_installed:
        return
    _backend_hint_installed = True
    original = BackendModule.__dict__["resolve_execution_backend"]

    @functools.wraps(original)
    def resolve_execution_backend(self, requested, target, *args, **kwargs):
        try:
            return original(self, requested, target, *args, **kwargs)
        except ValueError as err:
            name = str(requested).lower() if requested is not None else ""
            kind = getattr(getattr(target, "kind", None), "name", "")
            if name in plugin_backends and kind == "metal" and not is_installed():
                raise ValueError(
                    f"{err} execution_backend={name!r} comes from the tilelang_metal plugin, which is not "
                    "active: `import tilelang_metal` (activates it) or call `tilelang_metal.activate()`."
                ) from err
            why = _unavailable_hint(name) if name in plugin_backends and kind == "metal" else None
            if why:
                raise ValueError(f"{err} {why}") from err
            raise

    BackendModule.resolve_execution_backend = resolve_execution_backend


def base_kernel_adapter() -> type:
    from tilelang.jit.adapter.base import BaseKernelAdapter

    return BaseKernelAdapter


@dataclass(frozen=True)
class HostHooks:
    """What the plugin installs; built by `tilelang_metal.plugin`."""

    manifest: BackendModule
    normalize_target: Callable[..., Any]
    detect_target: Callable[..., Any]
    gemm_lower: Callable[[Callable[..., Any]], Callable[..., Any]]
    gemm_infer_layout: Callable[[Callable[..., Any]], Callable[..., Any]]
    codegen_build: Callable[..., Any]
    codegen_build_runtime: Callable[..., Any]  # the device codegen of execution_backend="tvm_ffi"
    cache_identity: dict[str, str]
    options_scope: Callable[[Any], Any]  # pass_configs -> the compile's options scope (a context manager)
    options_key: Callable[[], str]  # inside that scope: the key of its lowering options
    error_types: tuple[type, ...]  # plugin exceptions that must cross TVM's FFI with their own type
    adapters: dict[str, Callable[..., Any]]  # execution backend name -> adapter factory
    unavailable_hint: Callable[[str], str | None] = lambda name: None  # why a backend is unavailable here
    # pass_configs -> (the entries for tilelang's PassContext, a context manager holding the plugin's)
    pass_config_scope: Callable[[Any], tuple[Any, Any]] = lambda configs: (configs, contextlib.nullcontext())
    # tilelang's device-module preparation -> the one the compile runs (the lowering cache's)
    device_preparation: Callable[[Callable[[Any], Any]], Callable[[Any], Any]] = lambda prepare: prepare


def install(hooks: HostHooks) -> bool:
    """Install every hook; returns False when already installed. Thread-safe."""
    global _installed
    with _lock:
        if _installed is not None:
            return False
        record = _Installed()
        try:
            register_error_types(*hooks.error_types)
            register_global_func(CODEGEN_GLOBAL, hooks.codegen_build)
            register_global_func(CODEGEN_RUNTIME_GLOBAL, hooks.codegen_build_runtime)
            _swap_backend(hooks.manifest, record)
            _swap_target_hooks(hooks.normalize_target, hooks.detect_target, record)
            original_lower = get_global_func(GEMM_LOWER_GLOBAL)
            original_infer = get_global_func(GEMM_INFER_LAYOUT_GLOBAL)
            _swap_global(GEMM_LOWER_GLOBAL, hooks.gemm_lower(original_lower), record)
            _swap_global(GEMM_INFER_LAYOUT_GLOBAL, hooks.gemm_infer_layout(original_infer), record)
            _swap_cache_key(hooks.cache_identity, hooks.options_scope, hooks.options_key, record)
            _swap_compile_scope(hooks.options_scope, record)
            _swap_jit_memo(hooks.options_scope, hooks.options_key, record)
            _swap_autotune(hooks.cache_identity, hooks.options_scope, hooks.options_key, tuple(hooks.adapters), record)
            _swap_adapter_dispatch(hooks.adapters, record)
            _swap_profiler(record)
            _swap_pass_configs(hooks.pass_config_scope, record)
            _swap_macro_rewrite(record)
            _swap_device_preparation(hooks.device_preparation, record)
            _install_inactive_backend_hint(tuple(spec.name for spec in hooks.manifest.execution_backends), hooks.unavailable_hint)
        except BaseException:
            for restore in reversed(record.restores):
                restore()
            raise
        _installed = record
        return True


def uninstall() -> bool:
    """Restore everything `install` replaced, in reverse order. Returns False when not installed."""
    global _installed
    with _lock:
        if _installed is None:
            return False
        for restore in reversed(_installed.restores):
            restore()
        _installed = None
        return True
