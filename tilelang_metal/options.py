"""The lowering options: every setting that changes how a kernel is lowered or printed, read once.

A `LoweringOptions` is built once per lowering, from the `TILELANG_METAL_*` settings (config.py)
and the kernel's pass configs in the plugin's namespace (kernel_options.py), and is frozen. Nothing
in the lowering reads a setting after that:

- the compile entry points (`tilelang.compile`, `@tilelang.jit`, tilelang's kernel cache) open one
  `compile_scope(pass_configs)`; the first use builds the options and every later use in the scope
  (the kernel-cache key, the lowering, the printer) gets that same object;
- `pipeline.lower_metal` runs under `lowering_scope()` (the compile's options, or new ones for a
  direct `tilelang.lower`), hands them to the plugin passes as an argument and stamps them on every
  PrimFunc (`OPTIONS_ATTR`), so the codegen hook reads the options the module was lowered with from
  the IR, not from the environment;
- the GEMM hooks, called from C++ during LayoutInference and LowerTileOp, and the printer read
  `current_options()`, which raises outside a lowering.

`key()` hashes the options that change generated code; it is the plugin's part of tilelang's
kernel-cache key and of the `@tilelang.jit` memo.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, fields
from typing import Any

from . import config, kernel_options

# A PrimFunc attribute (JSON text): the options the function was lowered with (pipeline.lower_metal).
OPTIONS_ATTR = "tilelang_metal.options"

# 16-bit float inputs: what relaxed_precision="auto" lets the matrix units compute relaxed.
_SHORT_FLOATS = ("float16", "bfloat16")


@dataclass(frozen=True)
class LoweringOptions:
    """What the lowering and the printer may depend on besides the IR and the target."""

    fragment_ct: bool = True  # TILELANG_METAL_FRAGMENT_CT
    staging_bypass: bool = True  # TILELANG_METAL_STAGING_BYPASS
    k_prefetch: str = config.OFF  # TILELANG_METAL_K_PREFETCH: off / fit / force
    register_staging: str = config.FIT  # TILELANG_METAL_REGISTER_STAGING: off / fit / force
    relaxed_precision: str = "auto"  # TILELANG_METAL_RELAXED_PRECISION or the pass config: auto / on / off
    precise_math: bool = False  # TILELANG_METAL_PRECISE_MATH or the pass config
    debug: bool = False  # TILELANG_METAL_DEBUG (log level of the GEMM decisions; no effect on code)

    @classmethod
    def from_settings(cls, pass_configs: Mapping[Any, Any] | None = None) -> LoweringOptions:
        """The settings now, with the kernel's `tilelang_metal.*` pass configs winning over them.
        `pass_configs` may hold tilelang's own keys too (they are ignored); a bad value or an
        unknown `tilelang_metal.*` key raises `ConfigError`."""
        ours, _ = kernel_options.split_pass_configs(pass_configs)
        relaxed = ours.get(kernel_options.RELAXED_PRECISION)
        precise = ours.get(kernel_options.PRECISE_MATH)
        return cls(
            fragment_ct=config.fragment_ct(),
            staging_bypass=config.staging_bypass(),
            k_prefetch=config.k_prefetch_mode(),
            register_staging=config.register_staging_mode(),
            relaxed_precision=relaxed if relaxed is not None else config.relaxed_precision(),
            precise_math=precise if precise is not None else config.precise_math(),
            debug=config.debug(),
        )

    def codegen_items(self) -> dict[str, str]:
        """The options that change generated code, by setting name (part of kernel identity)."""
        return {CODEGEN_SETTINGS[name]: str(getattr(self, name)) for name in CODEGEN_SETTINGS}

    def key(self) -> str:
        """A stable hash of `codegen_items()`: equal for options that lower to the same code."""
        return hashlib.sha256(json.dumps(self.codegen_items(), sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LoweringOptions:
        values = json.loads(text)
        return cls(**{f.name: values[f.name] for f in fields(cls)})

    def matmul_relaxed(self, a_dtype: str, b_dtype: str) -> bool:
        """The `relaxed_precision` flag of a matmul2d descriptor with these input types. `auto` keeps
        float32 exact (Apple's default is exact; relaxed lets the implementation trade accuracy for
        speed) and lets 16-bit inputs run relaxed, as MLX's kernels do."""
        if self.relaxed_precision == "auto":
            return str(a_dtype) in _SHORT_FLOATS and str(b_dtype) in _SHORT_FLOATS
        return self.relaxed_precision == "on"


# field -> the setting it comes from, for the fields that change generated code (every setting with
# changes_codegen=True in config.SETTINGS; tests/unit/test_options.py checks they agree).
CODEGEN_SETTINGS = {
    "fragment_ct": config.PREFIX + "FRAGMENT_CT",
    "staging_bypass": config.PREFIX + "STAGING_BYPASS",
    "k_prefetch": config.PREFIX + "K_PREFETCH",
    "register_staging": config.PREFIX + "REGISTER_STAGING",
    "relaxed_precision": config.PREFIX + "RELAXED_PRECISION",
    "precise_math": config.PREFIX + "PRECISE_MATH",
}


class _Scope:
    """The options of one compile: built on first use, then the same object for every use."""

    def __init__(self, pass_configs: Mapping[str, Any] | None, options: LoweringOptions | None = None) -> None:
        self.pass_configs = dict(pass_configs or {})  # the plugin's keys only (split_pass_configs)
        self._options = options

    def options(self) -> LoweringOptions:
        if self._options is None:
            self._options = LoweringOptions.from_settings(self.pass_configs)
        return self._options


_current: ContextVar[_Scope | None] = ContextVar("tilelang_metal_lowering_options", default=None)


def current_options() -> LoweringOptions:
    """The options of the lowering in progress (the GEMM hooks, the printer). Raises outside one."""
    scope = _current.get()
    if scope is None:
        raise RuntimeError(
            "no Metal lowering in progress: tilelang_metal.options.current_options() is only defined while the plugin "
            "lowers or prints a kernel; wrap the call in `with tilelang_metal.options.lowering(LoweringOptions.from_settings()):`"
        )
    return scope.options()


@contextmanager
def _entered(scope: _Scope) -> Iterator[_Scope]:
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)


@contextmanager
def compile_scope(pass_configs: Mapping[Any, Any] | None) -> Iterator[None]:
    """One compile: the options are built from the settings and these pass configs at their first
    use. Inside an open scope with the same plugin pass configs (the JIT memo, then the kernel cache,
    then tilelang's compile), the open scope's options are kept."""
    ours, _ = kernel_options.split_pass_configs(pass_configs)
    open_scope = _current.get()
    if open_scope is not None and open_scope.pass_configs == ours:
        yield
        return
    with _entered(_Scope(ours)):
        yield


@contextmanager
def lowering_scope() -> Iterator[LoweringOptions]:
    """The pipeline's scope: the open compile's options, or new ones from the settings (a direct
    `tilelang.lower`). Yields the options, built now."""
    open_scope = _current.get()
    if open_scope is not None:
        yield open_scope.options()
        return
    scope = _Scope(None)
    with _entered(scope):
        yield scope.options()


@contextmanager
def lowering(options: LoweringOptions) -> Iterator[LoweringOptions]:
    """Make `options` current (the codegen hook, with the options stamped on the module)."""
    with _entered(_Scope(None, options)):
        yield options


def stamp(func: Any, options: LoweringOptions) -> Any:
    """`func` (a PrimFunc) carrying the options it was lowered with."""
    return func.with_attr(OPTIONS_ATTR, options.to_json())


def stamped(funcs: Any) -> LoweringOptions | None:
    """The options stamped on these PrimFuncs (None when none carries them); different options on
    functions of one module mean the module was assembled from two lowerings, which is refused."""
    found = {str(f.attrs[OPTIONS_ATTR]) for f in funcs if f.attrs is not None and OPTIONS_ATTR in f.attrs}
    if len(found) > 1:
        raise RuntimeError(f"a module whose functions were lowered under different tilelang_metal options: {sorted(found)}")
    return LoweringOptions.from_json(found.pop()) if found else None
