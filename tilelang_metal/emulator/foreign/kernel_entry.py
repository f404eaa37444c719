"""A foreign kernel's entry: its parameters as declared (`[[buffer(i)]]` bindings, explicit or
numbered in order as Metal does, `function_constant` gates, position attributes) and the generated C++
driver that calls it, leaving the parameter types to the C++ compiler (`tlm::foreign::param_t`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..driver import launch_entry
from ..errors import EmulatorCompileError
from ..signature import POSITION_ATTRIBUTES, check_buffer_slots
from .source_scan import _split_top
from .translation import KernelDefinition

# foreign kernels' device buffers sit between guard pages; the runtime's fault handler reads them
_GUARD_FIELDS = "  p.guards = tlm::foreign::guards.regions;\n  p.nguards = tlm::foreign::guards.count;\n"


@dataclass(frozen=True)
class ForeignParam:
    """One kernel parameter: a `[[buffer(i)]]` binding (pointer or reference) or a position attribute."""

    position: int  # in the parameter list
    name: str
    text: str  # declaration as written (one line)
    buffer: int | None  # [[buffer(i)]], explicit or assigned in order
    attribute: str | None  # position attribute name
    function_constant: str | None = None  # `[[buffer(i), function_constant(c)]]`: present only if c is true
    enabled: bool = True  # False: c is false, the parameter does not exist (no launch argument)

    def describe(self) -> str:
        return f"parameter '{self.name}' (buffer {self.buffer}, `{self.text}`)"

    @property
    def space(self) -> str | None:
        """The binding's address space as written (`device` or `constant`), None for a position attribute."""
        if self.attribute is not None:
            return None
        m = _ADDRESS_SPACE_RE.search(_PARAM_ATTR_LIST_RE.sub("", self.text))
        return m.group(1) if m else None


_PARAM_ATTR_LIST_RE = re.compile(r"\[\[(?P<body>.*?)\]\]")
_PARAM_ATTR_RE = re.compile(r"^\s*(?P<attr>[A-Za-z_]\w*)\s*(?:\(\s*(?P<arg>[^()]*?)\s*\))?\s*$")
_ADDRESS_SPACE_RE = re.compile(r"\b(device|constant)\b")


def _param_attributes(one: str, where: str) -> list[tuple[str, str | None]]:
    """`[[buffer(5), function_constant(has_mask)]]` -> [("buffer", "5"), ("function_constant", "has_mask")]."""
    attrs = []
    for group in _PARAM_ATTR_LIST_RE.finditer(one):
        for item in _split_top(group.group("body")):
            m = _PARAM_ATTR_RE.match(item)
            if not m:
                raise EmulatorCompileError(f"{where}: cannot read the attribute `{item.strip()}`")
            attrs.append((m.group("attr"), m.group("arg")))
    return attrs


def parse_params(kernel: KernelDefinition, constants: Mapping[str, Any] | None = None) -> list[ForeignParam]:
    """Classify the kernel's parameters; buffer indices without an attribute are assigned in order,
    skipping the explicit ones (as Metal does). `constants` (function constant name -> value) decides
    which `function_constant(c)` parameters exist."""
    raw = _split_top(kernel.params_text)
    parsed = []
    explicit = set()
    for pos, text in enumerate(raw):
        one = " ".join(text.split())
        decl = _PARAM_ATTR_LIST_RE.sub("", one).strip()
        name_m = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*$", decl)
        name = name_m.group(1) if name_m else f"#{pos}"
        where = f"{kernel.file}:{kernel.line}: kernel {kernel.name}, parameter '{name}'"
        attrs = _param_attributes(one, where)
        gate = next((arg for a, arg in attrs if a == "function_constant"), None)
        enabled = True
        if gate is not None:
            if constants is None or gate not in constants:
                known = ", ".join(sorted(constants or ())) or "none"
                raise EmulatorCompileError(f"{where}: function_constant({gate}) names no `[[function_constant(n)]]` "
                                           f"constant of the included files (known: {known})")
            enabled = bool(constants[gate])  # not None: compile_msl refused constants the parameters name without a value
        attrs = [(a, arg) for a, arg in attrs if a != "function_constant"]
        attr, arg = attrs[0] if attrs else (None, None)
        if len(attrs) > 1:
            raise EmulatorCompileError(f"{where}: several attributes ({', '.join(a for a, _ in attrs)}) are not supported")
        if attr == "buffer":
            if arg is None or not arg.isdigit():
                raise EmulatorCompileError(f"{where}: [[buffer({arg})]] needs a literal index")
            explicit.add(int(arg))
            parsed.append([pos, name, one, int(arg), None, gate, enabled])
        elif attr in POSITION_ATTRIBUTES:
            parsed.append([pos, name, one, None, attr, gate, enabled])
        elif attr is None:
            if not _ADDRESS_SPACE_RE.search(decl):
                raise EmulatorCompileError(f"{where}: no attribute and not a device/constant binding: `{one}`")
            parsed.append([pos, name, one, None, None, gate, enabled])
        elif attr == "threadgroup":
            raise EmulatorCompileError(
                f"{where}: [[threadgroup(n)]] kernel parameters (memory sized by the host) are not supported "
                "by the emulator: declare the array in the kernel"
            )
        else:
            raise EmulatorCompileError(f"{where}: unsupported attribute [[{attr}]]")
    next_index = 0
    out = []
    for pos, name, one, buf, attr, gate, enabled in parsed:
        if buf is None and attr is None:
            while next_index in explicit:
                next_index += 1
            buf = next_index
            explicit.add(buf)
        out.append(ForeignParam(pos, name, one, buf, attr, gate, enabled))
    indices = [p.buffer for p in out if p.buffer is not None]
    if len(set(indices)) != len(indices):
        raise EmulatorCompileError(
            f"{kernel.file}:{kernel.line}: kernel {kernel.name}: buffer indices {sorted(indices)} repeat (bindings that "
            "share an index under complementary function constants are not supported by the emulator)"
        )
    check_buffer_slots(f"{kernel.file}:{kernel.line}: kernel {kernel.name}", indices)
    return out


# ---------------------------------------------------------------- driver

def _position_arg(p: ForeignParam, ptype: str) -> str:
    comps, _width = POSITION_ATTRIBUTES[p.attribute]
    padded = list(comps) + ["0u"] * (3 - len(comps))
    return f"tlm::foreign::position<{ptype}>({', '.join(padded)})"


def _buffer_slots(params: Sequence[ForeignParam]) -> list[ForeignParam]:
    """Every [[buffer(i)]] parameter (present or not) in index order: the driver's `__buf[slot]`."""
    return sorted((p for p in params if p.buffer is not None), key=lambda p: p.buffer)


def _driver(callee: str, params: list[ForeignParam], host_name: str) -> str:
    slot_of = {p.buffer: i for i, p in enumerate(_buffer_slots(params))}
    args = []
    for p in params:
        ptype = f"tlm::foreign::param_t<{p.position}, decltype(&{callee})>"
        if p.attribute is not None:
            args.append(_position_arg(p, ptype))
        else:
            args.append(f"tlm::foreign::bind<{ptype}>(__buf[{slot_of[p.buffer]}])")
    bound = sorted((p for p in params if p.buffer is not None), key=lambda p: p.buffer)
    info = "\n".join(
        f"    case {p.buffer}: tlm::foreign::describe<tlm::foreign::param_t<{p.position}, decltype(&{callee})>>(out); return 1;"
        for p in bound
    )
    arg_text = ",\n      ".join(args)
    return f"""
#line 1 "tlm_driver"
// Generated by tilelang_metal.emulator.foreign for host name {host_name} ({callee}).
namespace {{
void tlm_entry(const tlm::rt::lane_info& __li, void* const* __buf, const int64_t* __n) {{
  (void)__li; (void)__buf; (void)__n;
  {callee}(
      {arg_text});
}}
}}  // namespace

extern "C" __attribute__((visibility("default"))) int tlm_param_info(int index, int64_t* out) {{
  switch (index) {{
{info}
    default: return 0;
  }}
}}

{launch_entry(False, _GUARD_FIELDS)}
extern "C" __attribute__((visibility("default"))) void tlm_set_guards(const tlm::rt::guard_region* r, uint32_t n) {{
  tlm::foreign::guards.regions = r;
  tlm::foreign::guards.count = n;
}}

extern "C" __attribute__((visibility("default"))) const char* tlm_shim_version() {{ return TLM_SHIM_VERSION; }}
"""
