"""Module passes that rewrite each PrimFunc independently (the plugin's passes are all of this kind)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..host import tir, tvm


def per_function_pass(name: str, rewrite: Callable[[Any], Any], *, kernels_only: bool = False) -> Any:
    """A module pass applying `rewrite` to every PrimFunc (only device kernels when `kernels_only`:
    functions that carry a `thread_extent` launch attribute)."""

    def apply(mod: Any, _ctx: Any) -> Any:
        updates = {}
        for gvar, func in mod.functions.items():
            if not isinstance(func, tir.PrimFunc):
                continue
            if kernels_only and (func.attrs is None or "thread_extent" not in func.attrs):
                continue
            updates[gvar] = rewrite(func)
        for gvar, func in updates.items():
            mod[gvar] = func
        return mod

    return tvm.transform.module_pass(apply, opt_level=0, name=name)
