"""The front door for MSL the plugin did not write (`compile_msl`): MLX's kernels, hand-written Metal.

The plugin's own MSL carries its artifact (codegen/artifact.py), whose records drive signature.py's
rewrites (hand-written MSL in the printer's fixed shape is parsed there line by line). Foreign MSL is free
C++: templates instantiated under a `[[host_name("...")]]`, parameters without `[[buffer(n)]]`
(Metal numbers them in order), `constant` structs by reference, `[[function_constant(n)]]` globals,
threadgroup arrays declared in kernels *and* in helper functions, address-space-qualified member
functions. This package owns all of that parsing: translation.py translates the source and every
header it includes from `include_dirs` into C++ for the shim (keeping every line where it was, so
diagnostics point at the original lines; source_scan.py masks comments and literals first), this
module finds the kernel behind the host name, and kernel_entry.py reads its parameters and generates
a driver that lets the C++ compiler work out the parameter types (so a template parameter `T` needs
no parsing). launcher.py launches the result (`ForeignKernel`) over guarded_memory.py.

Checks of a foreign launch (see docs/emulator.md, "Foreign MSL"): argument kinds, dtypes and struct
sizes against the compiled types; device buffers sit against PROT_NONE guard pages, so an access
past a buffer's end (or far before its start) is an error naming the buffer, wherever it happens;
threadgroup memory counts against Metal's 32 KiB. Not checked: accesses inside threadgroup memory
and within the last 16 bytes of a buffer whose size is not a multiple of 16.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from .. import toolchain
from ..errors import EmulatorCompileError
from .kernel_entry import _driver, parse_params
from .launcher import ForeignKernel
from .translation import KernelDefinition, _Closure, _closure

# What the real Metal compiler predefines for an MSL 3.2 (macOS 15) library, and nothing else: code
# that tests them (MLX's defines.h, logging.h) takes the path it takes on the GPU.
PREDEFINES = ("-D__METAL__=1", "-D__METAL_VERSION__=320")


def _find_kernel(host_name: str, closure: _Closure) -> tuple[str, KernelDefinition]:
    """The callee (`f<A...>` or `f`) and the definition of the kernel `host_name` names."""
    insts = [i for t in closure.files.values() for i in t.instantiations if i.host_name == host_name]
    plain = [t.host_named[host_name] for t in closure.files.values() if host_name in t.host_named]
    definitions = [k for t in closure.files.values() for k in t.kernels]
    if insts:
        inst = insts[0]
        callee, function = inst.callee, inst.function.split("::")[-1]
    elif plain:
        callee = function = plain[0]
    elif any(k.name == host_name for k in definitions):
        callee = function = host_name
    else:
        known = sorted({i.host_name for t in closure.files.values() for i in t.instantiations}
                       | {k.name for k in definitions})
        raise EmulatorCompileError(
            f"no kernel named '{host_name}' in the source: instantiate it with "
            f"`template [[host_name(\"{host_name}\")]] [[kernel]] decltype(f<...>) f<...>;` (known: {', '.join(known) or 'none'})"
        )
    matches = [k for k in definitions if k.name == function]
    if not matches:
        raise EmulatorCompileError(f"kernel '{host_name}' instantiates {callee}, but no `[[kernel]] void {function}(` is defined in the included files")
    if len({(k.file, k.line) for k in matches}) > 1:
        where = ", ".join(f"{k.file}:{k.line}" for k in matches)
        raise EmulatorCompileError(f"kernel '{host_name}': several `[[kernel]] void {function}(` definitions ({where}); the emulator cannot tell which one is meant")
    return callee, matches[0]


def _refuse_graphics_functions(kernel_name: str, closure: _Closure) -> None:
    """Vertex and fragment functions are render stages, not compute kernels: the emulator has no
    rasterizer, stage_in or textures to run or even compile them."""
    graphics = [g for t in closure.files.values() for g in t.graphics]
    asked = [g for g in graphics if g[1] == kernel_name]
    if asked:
        kind, name, file, line = asked[0]
        raise EmulatorCompileError(f"{file}:{line}: '{name}' is a {kind} function, not a compute kernel: the emulator runs only `kernel void` / `[[kernel]]` functions")
    if graphics:
        kind, name, file, line = graphics[0]
        raise EmulatorCompileError(
            f"{file}:{line}: {kind} function '{name}' is a render stage the emulator cannot compile: "
            f"pass compile_msl the source of kernel '{kernel_name}' without it"
        )


def _constant_values(closure: _Closure, constants: Mapping[int | str, Any]) -> dict[str, Any]:
    """Function constant name -> the value given for it (by index or by name)."""
    return {fc.name: constants.get(fc.index, constants.get(fc.name))
            for t in closure.files.values() for fc in t.constants}


_compile_lock = threading.Lock()
_memo: dict[str, ForeignKernel] = {}


def compile_msl(
    source: str,
    kernel_name: str,
    *,
    include_dirs: Sequence[str | Path] = (),
    function_constants: Mapping[int | str, bool | int | float] | None = None,
    instrument: str | None = None,
) -> ForeignKernel:
    """Compile the kernel `kernel_name` (a host name or a plain kernel's name) of MSL `source` that
    the plugin did not write, with headers from `include_dirs`; `function_constants` gives every
    `[[function_constant(n)]]` a value (by index or by name). `instrument` builds the "counters" or
    "racecheck" flavour (ForeignKernel.counters / .racecheck build theirs on demand)."""
    constants = dict(function_constants or {})
    closure = _closure(source, [Path(d) for d in include_dirs], constants)
    _refuse_graphics_functions(kernel_name, closure)
    callee, definition = _find_kernel(kernel_name, closure)
    for name, value in _constant_values(closure, constants).items():
        if value is None and re.search(rf"\b{re.escape(name)}\b", definition.body_text + definition.params_text):
            index = next(fc.index for t in closure.files.values() for fc in t.constants if fc.name == name)
            raise EmulatorCompileError(
                f"kernel '{kernel_name}': function constant '{name}' (index {index}) has no value: "
                f"pass function_constants={{{index}: ...}} to compile_msl"
            )
    params = parse_params(definition, _constant_values(closure, constants))
    driver = _driver(callee, params, kernel_name)
    main = closure.files["main.metal"].text
    extra = tuple(sorted((rel, t.text) for rel, t in closure.files.items() if rel != "main.metal"))
    flags = (*PREDEFINES, *(f"-I{d}" for d in closure.include_dirs))
    traced = instrument == "counters" and toolchain.memory_trace_unavailable() is None
    if traced:
        flags += toolchain.MEMORY_TRACE_FLAGS
    safe = re.sub(r"\W", "_", kernel_name)[:40]
    unit = toolchain.SourceUnit(safe, source, main, driver, extra_files=extra, extra_flags=flags)
    key = hashlib.sha256((unit.text + repr(extra) + repr(flags) + str(instrument)).encode()).hexdigest()
    memo_key = f"{key}:{toolchain.cache_dir()}:{toolchain.compiler()}:{toolchain.fiber_flavour()}"
    with _compile_lock:
        hit = _memo.get(memo_key)
    if hit is not None:
        return hit
    lib = toolchain.kernel_library(unit, True, instrument)
    rebuild = partial(_compile_flavour, source, kernel_name, tuple(str(d) for d in include_dirs), constants)
    kernel = ForeignKernel(kernel_name, callee, params, lib, unit, instrument, rebuild=rebuild, memory_traced=traced)
    with _compile_lock:
        _memo[memo_key] = kernel
    return kernel


def _compile_flavour(source: str, kernel_name: str, include_dirs: tuple[str, ...], constants: dict[int | str, Any],
                     instrument: str) -> ForeignKernel:
    return compile_msl(source, kernel_name, include_dirs=include_dirs, function_constants=constants, instrument=instrument)


def memory_counts_unavailable() -> str | None:
    """Why ForeignKernel.counters leaves memory traffic out with this emulator compiler, or None."""
    return toolchain.memory_trace_unavailable()
