"""Every setting of the plugin, in this one module: the `TILELANG_METAL_*` environment variables, the
per-kernel pass configs in the plugin's namespace, and the frozen `LoweringOptions` a lowering reads.

Environment variables: each has one typed accessor that returns its value or its default. Accessors
read the environment on every call, so changing a variable inside a running process takes effect at
the next lowering / launch (tests use `monkeypatch.setenv`). A bad value raises `ConfigError` with one
line naming the variable and the values it accepts. This module imports nothing heavy (no tilelang,
no torch): `import tilelang_metal` and the CLI's `--help` stay cheap.

Pass configs: `tilelang_metal.relaxed_precision` / `tilelang_metal.precise_math` in a kernel's
`pass_configs` win over the variables for that kernel (`split_pass_configs`).

Lowering options: the settings that change how a kernel is lowered or printed are read once per
lowering, into a frozen `LoweringOptions` (the kernel's pass configs applied); no lowering module
calls their accessors (tests/unit/test_options.py). Those that change the generated MSL
(`changes_codegen=True`) make up the options' `key()`, which the plugin folds into tilelang's
kernel-cache key and the per-function JIT memo, so a kernel lowered under one value is never served
under another.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError

PREFIX = "TILELANG_METAL_"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_BOOL_VALUES = "0 or 1 (also true/false, yes/no, on/off)"
_FORCE_VALUES = _BOOL_VALUES + ", or force"


@dataclass(frozen=True)
class Setting:
    """One environment variable: its documented default, accepted values and effect."""

    name: str  # full variable name
    default: str  # as documented (what an unset or empty variable means)
    allowed: str
    meaning: str
    changes_codegen: bool


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            PREFIX + "AUTOLOAD",
            "1",
            _BOOL_VALUES,
            "activate the plugin as soon as tilelang is imported after `import tilelang_metal`; 0 leaves tilelang untouched until `tilelang_metal.activate()`",
            False,
        ),
        Setting(
            PREFIX + "FRAGMENT_CT",
            "1",
            _BOOL_VALUES,
            "a `local.fragment` GEMM accumulator on a metal4 target uses cooperative tensors when they apply; 0 sends it to simdgroup matrices, as in the spec's table",
            True,
        ),
        Setting(
            PREFIX + "STAGING_BYPASS",
            "1",
            _BOOL_VALUES,
            "shared buffers that only stage a T.gemm operand (written only by a T.copy from global, read only by the T.gemm) are dropped and the T.gemm reads global memory (metal4 always; plain metal when the staging does not fit 32 KiB even with fewer pipeline stages); 0 keeps the kernel's staging as written",
            True,
        ),
        Setting(
            PREFIX + "K_PREFETCH",
            "0",
            _FORCE_VALUES,
            "1: a direct-global T.gemm loads the operands of K step k+1 into a second set of registers while step k's matrix operations run (K loop unrolled by 2), where the register estimate with it fits the budget (register_budget.py); force: everywhere; costs one more copy of the per-step operand arrays",
            True,
        ),
        Setting(
            PREFIX + "REGISTER_STAGING",
            "1",
            _FORCE_VALUES,
            "in a `T.Pipelined(num_stages>=2)` loop, each T.copy from global into shared memory of a later K step loads into thread registers before the current step's matrix operations and stores to threadgroup memory after them (the loads overlap the matrix operations); costs a register array of the elements each thread copies per K step, so 1 applies it only where the register estimate with it fits the budget (register_budget.py); force: everywhere; 0 keeps load-and-store together",
            True,
        ),
        Setting(
            PREFIX + "RELAXED_PRECISION",
            "auto",
            "auto, 0 or 1 (also true/false, yes/no, on/off)",
            "the `relaxed_precision` flag of every MPP `matmul2d` descriptor (metal4 cooperative-tensor GEMMs): auto = relaxed for 16-bit float inputs, exact for float32 inputs; 1 = relaxed for all inputs; 0 = exact for all; a kernel's pass config `tilelang_metal.relaxed_precision` overrides it",
            True,
        ),
        Setting(
            PREFIX + "PRECISE_MATH",
            "0",
            _BOOL_VALUES,
            "1: float32 math functions, division and square roots print as `metal::precise::` calls (exact whatever fast-math mode the runtime compiles with) and NaN / infinity tests as bit tests; a kernel's pass config `tilelang_metal.precise_math` overrides it",
            True,
        ),
        Setting(
            PREFIX + "DEBUG",
            "0",
            _BOOL_VALUES,
            "log every GEMM path decision at WARNING level (stderr) instead of INFO",
            False,
        ),
        Setting(
            PREFIX + "LOWERING_CACHE",
            "off",
            "a directory path (created if missing); unset, empty or 0 = off",
            "keep each lowered module on disk, keyed by the complete input IR, target, options, pass configs and the plugin's code, so lowering the same kernel again loads it instead of running the passes",
            False,
        ),
        Setting(
            PREFIX + "EMULATOR_CACHE",
            "~/.cache/tilelang_metal/emulator",
            "a directory path (created if missing)",
            "where the emulator keeps compiled runtimes, kernel libraries and syntax-check stamps",
            False,
        ),
        Setting(
            PREFIX + "EMULATOR_CACHE_MB",
            "1024",
            "an integer >= 1",
            "size limit of the emulator cache in MiB: when it is passed, least-recently-used entries are evicted down to 90% of it (soft: checked as builds add entries)",
            False,
        ),
        Setting(
            PREFIX + "EMULATOR_CXX",
            "clang++-19 if on PATH, else g++",
            "a C++20 compiler command",
            "the compiler that builds MSL as C++ for the emulator (its identity is part of the build-cache key); clang 19 builds kernels about 1.5x faster than g++ 12 -O2",
            False,
        ),
        Setting(
            PREFIX + "EMULATOR_FIBERS",
            "native",
            "native or portable",
            "emulator thread switching: hand-written context switch, or makecontext/_longjmp",
            False,
        ),
        Setting(
            PREFIX + "EMULATOR_WORKERS",
            "CPUs available to the process",
            "an integer >= 1",
            "OS threads that run threadgroups in the emulator",
            False,
        ),
        Setting(
            PREFIX + "EMULATOR_STACK_KB",
            "0 (default limit 16384 KiB)",
            "an integer >= 0",
            "upper limit of each emulated GPU thread's (fiber's) stack, in KiB: the stack is sized from the kernel's thread arrays; 0 means the default",
            False,
        ),
    )
}


def _raw(name: str) -> str | None:
    """The variable's text, or None when unset or blank (blank means "use the default")."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def _bad(name: str, value: str) -> ConfigError:
    return ConfigError(f"{name}={value!r} is not valid: use {SETTINGS[name].allowed}")


def _flag(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise _bad(name, value)


def _integer(name: str, minimum: int) -> int | None:
    value = _raw(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise _bad(name, value) from None
    if number < minimum:
        raise _bad(name, value)
    return number


def autoload() -> bool:
    return _flag(PREFIX + "AUTOLOAD", True)


def fragment_ct() -> bool:
    """Route a `local.fragment` accumulator to cooperative tensors on metal4 (the plugin's one
    deliberate change to the spec's selection table, docs/selection.md)."""
    return _flag(PREFIX + "FRAGMENT_CT", True)


def staging_bypass() -> bool:
    """Lower GEMMs whose shared operands are only staging on the direct-global path
    (transform/shared_staging.py)."""
    return _flag(PREFIX + "STAGING_BYPASS", True)


OFF, FIT, FORCE = "off", "fit", "force"


def _register_feature(name: str, default: bool) -> str:
    """`off`, `fit` (on where the register estimate with it fits the budget) or `force` (on everywhere)."""
    value = _raw(name)
    if value is not None and value.lower() == FORCE:
        return FORCE
    return FIT if _flag(name, default) else OFF


def k_prefetch_mode() -> str:
    """Register prefetch of the next K step's operands on the direct-global path (gemm/prefetch.py):
    `off`, `fit` or `force`."""
    return _register_feature(PREFIX + "K_PREFETCH", False)


def k_prefetch() -> bool:
    """K-prefetch is asked for (`fit` or `force`; whether it fits is the lowering's decision)."""
    return k_prefetch_mode() != OFF


def register_staging_mode() -> str:
    """Split a pipelined loop's global -> shared copies into register loads before the matrix
    operations and threadgroup stores after them (transform/register_staging.py): `off`, `fit`
    (the default) or `force`."""
    return _register_feature(PREFIX + "REGISTER_STAGING", True)


def register_staging() -> bool:
    """Register staging is asked for (`fit` or `force`)."""
    return register_staging_mode() != OFF


RELAXED_MODES = ("auto", "on", "off")


def relaxed_precision() -> str:
    """`auto` (relaxed for 16-bit float matmul2d inputs only), `on` or `off` (codegen/matrix_printer.py)."""
    name = PREFIX + "RELAXED_PRECISION"
    value = _raw(name)
    if value is None or value.lower() == "auto":
        return "auto"
    return "on" if _flag(name, False) else "off"


def precise_math() -> bool:
    """Print float32 math as `metal::precise::` calls (codegen/math_functions.py)."""
    return _flag(PREFIX + "PRECISE_MATH", False)


def debug() -> bool:
    return _flag(PREFIX + "DEBUG", False)


def lowering_cache() -> Path | None:
    """Directory of the lowering cache, or None when it is off (the default)."""
    value = _raw(PREFIX + "LOWERING_CACHE")
    return None if not value or value == "0" else Path(value).expanduser()


def emulator_cache() -> Path:
    value = _raw(PREFIX + "EMULATOR_CACHE")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "tilelang_metal" / "emulator"


def emulator_cache_mb() -> int:
    """Size limit of the emulator cache in MiB (least recently used entries go first)."""
    return _integer(PREFIX + "EMULATOR_CACHE_MB", 1) or 1024


# clang 14 cannot compile the shim's _Float16 here; 19 (Debian package clang-19) can, and is faster.
PREFERRED_CXX = ("clang++-19", "g++")


def emulator_cxx() -> str:
    import shutil

    chosen = _raw(PREFIX + "EMULATOR_CXX")
    if chosen:
        return chosen
    return next((cxx for cxx in PREFERRED_CXX if shutil.which(cxx)), PREFERRED_CXX[-1])


def emulator_fibers() -> str:
    name = PREFIX + "EMULATOR_FIBERS"
    value = _raw(name) or "native"
    if value not in ("native", "portable"):
        raise _bad(name, value)
    return value


def emulator_workers() -> int | None:
    """Worker threads for emulator launches; None means one per CPU available to the process."""
    return _integer(PREFIX + "EMULATOR_WORKERS", 1)


def emulator_stack_kb() -> int:
    """Upper limit of a GPU thread's fiber stack in KiB (the stack is sized from the kernel's thread
    arrays up to this limit); 0 means the emulator's default limit."""
    return _integer(PREFIX + "EMULATOR_STACK_KB", 0) or 0


def tvm_compile_force_fallback() -> bool:
    """TVM's own `TVM_COMPILE_FORCE_FALLBACK`, read with TVM's rule (unset, empty, 0 or false: off;
    anything else: on): device compile makes the module TVM makes without its Metal runtime, the
    MSL to inspect but nothing to launch, even where that runtime is linked."""
    value = os.environ.get("TVM_COMPILE_FORCE_FALLBACK")
    return bool(value) and value not in ("0", "false", "False", "FALSE")

# ---------------------------------------------------------------------------------------------
# Per-kernel pass configs: `pass_configs` keys in the plugin's namespace, over the settings above.
#
#     tilelang.compile(func, target=..., pass_configs={"tilelang_metal.relaxed_precision": True})
#
# TVM accepts only pass-config keys registered in C++ (an unknown key fails when tilelang builds its
# PassContext), so the host adapter takes the plugin's keys out of `pass_configs` first
# (`split_pass_configs`); they become part of the kernel's `LoweringOptions`.

NAMESPACE = "tilelang_metal."
RELAXED_PRECISION = NAMESPACE + "relaxed_precision"  # True / False / "auto" (relaxed_precision())
PRECISE_MATH = NAMESPACE + "precise_math"  # True / False (precise_math())
PASS_CONFIG_KEYS = (RELAXED_PRECISION, PRECISE_MATH)


def _relaxed_value(value: Any) -> str:
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return "on" if value else "off"
    if isinstance(value, str) and value.strip().lower() in RELAXED_MODES + ("true", "false", "1", "0"):
        text = value.strip().lower()
        return {"true": "on", "1": "on", "false": "off", "0": "off"}.get(text, text)
    raise ConfigError(f"pass_configs[{RELAXED_PRECISION!r}]={value!r} is not valid: use True, False or 'auto'")


def _bool_value(key: str, value: Any) -> bool:
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise ConfigError(f"pass_configs[{key!r}]={value!r} is not valid: use True or False")


def split_pass_configs(pass_configs: Mapping[Any, Any] | None) -> tuple[dict[str, Any], dict[Any, Any]]:
    """(the plugin's options, validated; every other entry, for tilelang's PassContext)."""
    ours: dict[str, Any] = {}
    rest: dict[Any, Any] = {}
    for key, value in (pass_configs or {}).items():
        name = str(getattr(key, "value", key))
        if not name.startswith(NAMESPACE):
            rest[key] = value
        elif name == RELAXED_PRECISION:
            ours[name] = _relaxed_value(value)
        elif name == PRECISE_MATH:
            ours[name] = _bool_value(name, value)
        else:
            raise ConfigError(f"pass_configs key {name!r} is not a tilelang_metal option: use one of {', '.join(PASS_CONFIG_KEYS)}")
    return ours, rest


# ---------------------------------------------------------------------------------------------
# The lowering options: every setting that changes how a kernel is lowered or printed, read once.
#
# A `LoweringOptions` is built once per lowering, from the `TILELANG_METAL_*` settings and the
# kernel's pass configs in the plugin's namespace (both above), and is frozen. Nothing
# in the lowering reads a setting after that:
#
# - the compile entry points (`tilelang.compile`, `@tilelang.jit`, tilelang's kernel cache) open one
#   `compile_scope(pass_configs)`; the first use builds the options and every later use in the scope
#   (the kernel-cache key, the lowering, the printer) gets that same object;
# - `pipeline.lower_metal` runs under `lowering_scope()` (the compile's options, or new ones for a
#   direct `tilelang.lower`), hands them to the plugin passes as an argument and stamps them on every
#   PrimFunc (`OPTIONS_ATTR`), so the codegen hook reads the options the module was lowered with from
#   the IR, not from the environment;
# - the GEMM hooks, called from C++ during LayoutInference and LowerTileOp, and the printer read
#   `current_options()`, which raises outside a lowering.
#
# `key()` hashes the options that change generated code; it is the plugin's part of tilelang's
# kernel-cache key and of the `@tilelang.jit` memo.

# A PrimFunc attribute (JSON text): the options the function was lowered with (pipeline.lower_metal).
OPTIONS_ATTR = "tilelang_metal.options"

# 16-bit float inputs: what relaxed_precision="auto" lets the matrix units compute relaxed.
_SHORT_FLOATS = ("float16", "bfloat16")


@dataclass(frozen=True)
class LoweringOptions:
    """What the lowering and the printer may depend on besides the IR and the target."""

    fragment_ct: bool = True  # TILELANG_METAL_FRAGMENT_CT
    staging_bypass: bool = True  # TILELANG_METAL_STAGING_BYPASS
    k_prefetch: str = OFF  # TILELANG_METAL_K_PREFETCH: off / fit / force
    register_staging: str = FIT  # TILELANG_METAL_REGISTER_STAGING: off / fit / force
    relaxed_precision: str = "auto"  # TILELANG_METAL_RELAXED_PRECISION or the pass config: auto / on / off
    precise_math: bool = False  # TILELANG_METAL_PRECISE_MATH or the pass config
    debug: bool = False  # TILELANG_METAL_DEBUG (log level of the GEMM decisions; no effect on code)

    @classmethod
    def from_settings(cls, pass_configs: Mapping[Any, Any] | None = None) -> LoweringOptions:
        """The settings now, with the kernel's `tilelang_metal.*` pass configs winning over them.
        `pass_configs` may hold tilelang's own keys too (they are ignored); a bad value or an
        unknown `tilelang_metal.*` key raises `ConfigError`."""
        ours, _ = split_pass_configs(pass_configs)
        relaxed = ours.get(RELAXED_PRECISION)
        precise = ours.get(PRECISE_MATH)
        return cls(
            fragment_ct=fragment_ct(),
            staging_bypass=staging_bypass(),
            k_prefetch=k_prefetch_mode(),
            register_staging=register_staging_mode(),
            relaxed_precision=relaxed if relaxed is not None else relaxed_precision(),
            precise_math=precise if precise is not None else precise_math(),
            debug=debug(),
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
# changes_codegen=True in SETTINGS; tests/unit/test_options.py checks they agree).
CODEGEN_SETTINGS = {
    "fragment_ct": PREFIX + "FRAGMENT_CT",
    "staging_bypass": PREFIX + "STAGING_BYPASS",
    "k_prefetch": PREFIX + "K_PREFETCH",
    "register_staging": PREFIX + "REGISTER_STAGING",
    "relaxed_precision": PREFIX + "RELAXED_PRECISION",
    "precise_math": PREFIX + "PRECISE_MATH",
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
            "no Metal lowering in progress: tilelang_metal.config.current_options() is only defined while the plugin "
            "lowers or prints a kernel; wrap the call in `with tilelang_metal.config.lowering(LoweringOptions.from_settings()):`"
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
    ours, _ = split_pass_configs(pass_configs)
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
