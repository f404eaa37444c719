"""Per-kernel options: `pass_configs` keys in the plugin's namespace, over the `TILELANG_METAL_*`
settings (config.py) that give their defaults.

    tilelang.compile(func, target=..., pass_configs={"tilelang_metal.relaxed_precision": True})

TVM accepts only pass-config keys registered in C++ (an unknown key fails when tilelang builds its
PassContext), so `_host` takes the plugin's keys out of `pass_configs` first (`split_pass_configs`);
they become part of the kernel's `LoweringOptions` (options.py), which is what the lowering reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import config
from .errors import ConfigError

NAMESPACE = "tilelang_metal."
RELAXED_PRECISION = NAMESPACE + "relaxed_precision"  # True / False / "auto" (config.relaxed_precision)
PRECISE_MATH = NAMESPACE + "precise_math"  # True / False (config.precise_math)
PASS_CONFIG_KEYS = (RELAXED_PRECISION, PRECISE_MATH)


def _relaxed_value(value: Any) -> str:
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return "on" if value else "off"
    if isinstance(value, str) and value.strip().lower() in config.RELAXED_MODES + ("true", "false", "1", "0"):
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
