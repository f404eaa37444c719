"""tilelang's and TVM's stock passes as the plugin's pipeline calls them, tilelang's pass-config
readers, and the translation of the host's internal errors into one-line messages with the fix (the
pass list itself, in order, is `tilelang_metal/pipeline.py`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..errors import MetalLoweringError
from .base import tvm


def tilelang_passes() -> Any:
    import tilelang.transform

    return tilelang.transform


def stock_passes() -> tuple[Any, Any, Any]:
    """(tilelang.transform, tvm.tirx.transform, tvm.s_tir.transform)."""
    from tvm import s_tir

    return tilelang_passes(), tvm.tirx.transform, s_tir.transform


def pass_context() -> Any:
    """A default TVM PassContext (`with pass_context(), target:` for lowering outside tilelang.compile)."""
    return tvm.transform.PassContext()

def pass_context_state() -> tuple[list[tuple[str, str]], bool]:
    """The current PassContext's config as sorted (key, text) pairs, and whether it carries pass
    instruments (whose observations a lowering skipped by a cache would lose)."""
    ctx = tvm.transform.PassContext.current()
    items = sorted((str(key), str(value)) for key, value in ctx.config.items())
    return items, bool(list(ctx.instruments))


# tilelang's pass config that turns its ThreadSync pass off (kernels that place their own T.sync_threads)
DISABLE_THREAD_STORAGE_SYNC = "tl.disable_thread_storage_sync"


def thread_storage_sync_disabled() -> bool:
    """Whether the current PassContext turns tilelang's ThreadSync off: then no pass places the
    barriers of the threadgroup exchanges the plugin itself lowers, and the plugin must."""
    value = tvm.transform.PassContext.current().config.get(DISABLE_THREAD_STORAGE_SYNC)
    return bool(value) if value is not None else False


def module_to_json(*mods: Any) -> str:
    """The complete, deterministic serialization of one IRModule, or of several together
    (`tvm.ir.save_json`; variables they share stay shared when loaded)."""
    return tvm.ir.save_json(mods[0] if len(mods) == 1 else list(mods))


def module_from_json(text: str) -> Any:
    """What `module_to_json` wrote: the module, or the list of modules. TVM's own loader, without
    `tvm.ir.load_json`'s Python round trip through `json_compact.upgrade_json` (a json.loads and an
    indented json.dumps of the whole text: 80 ms of a lowering-cache hit's 90 on a 0.5 MB entry, and
    a no-op on text this TVM wrote, which the cache key guarantees)."""
    return tvm.runtime._ffi_node_api.LoadJSON(text)


def device_target(mod: Any) -> Any | None:
    """The target a device module's functions carry (tilelang's host/device split stamps it), or None."""
    for func in mod.functions.values():
        target = func.attrs.get("target") if func.attrs is not None else None
        if target is not None:
            return target
    return None


def pipeline_options() -> Any:
    """tilelang's pass-config readers (vectorize, let-inline, shared-memory merge policy, ...)."""
    from tilelang.backend.pass_pipeline import pipeline_utils

    return pipeline_utils


LAYOUT_CONFLICT = re.compile(r"Layout infer conflict between (\S+) and (\S+)")
LAYOUT_TWICE = re.compile(r"Get different layout for (\S+)")
NO_LAYOUT = "no available layout found"
LAYOUT_ERRORS = re.compile(r"Layout .* has errors: .*(bijective|full iter space)")  # a reducer's layout that is not one
PIPELINE_TWO_WRITES = re.compile(r"both writing to buffer '([^']+)' with overlapping regions")


def plan_pipelines(mod: Any) -> Any:
    """tilelang's PipelinePlanning, with its multi-line internal error on a staged buffer that is
    written twice in one iteration turned into one line naming the fix."""
    try:
        return tilelang_passes().PipelinePlanning()(mod)
    except Exception as err:
        twice = PIPELINE_TWO_WRITES.search(str(err))
        if not twice:
            raise
        raise MetalLoweringError(
            f"T.Pipelined: shared buffer {twice.group(1)} is written by two statements of one iteration (a T.copy "
            f"and a later in-place update), which tilelang cannot pipeline. Write the update into another "
            f"buffer, or use num_stages=0."
        ) from None


def infer_layouts(
    mod: Any, conflict_message: Callable[[Any, str, str], str], no_layout_message: Callable[[Any, Callable[[Any], Any], bool], str]
) -> Any:
    """tilelang's LayoutInference and ReducerPlanAndMaterialize (the reducers' layouts), with their
    bare internal check failures turned into one line that names the cause and the fix
    (`conflict_message(mod, first, second)` words the one for two fragments whose layouts disagree:
    the plugin knows which ops fixed them; `no_layout_message(mod, run, reducer)` the one for a
    buffer with no thread layout, given `run` to try the two passes on a relaunched module)."""
    passes = tilelang_passes()

    def run(module: Any) -> Any:
        return passes.ReducerPlanAndMaterialize()(passes.LayoutInference()(module))

    try:
        inferred = passes.LayoutInference()(mod)
    except Exception as err:
        conflict = LAYOUT_CONFLICT.search(str(err))
        if conflict:
            raise MetalLoweringError(conflict_message(mod, *conflict.groups())) from None
        twice = LAYOUT_TWICE.search(str(err))
        if twice:
            raise MetalLoweringError(
                f"fragment {twice.group(1)} is given two different thread layouts: one by T.annotate_layout or an "
                f"earlier op, another by a T.gemm that reads or accumulates it in its lane layout. Remove the "
                f"annotation on {twice.group(1)}, or copy it into a separate fragment for the T.gemm."
            ) from None
        if NO_LAYOUT not in str(err):
            raise
        raise MetalLoweringError(no_layout_message(mod, run, False)) from None
    try:
        return passes.ReducerPlanAndMaterialize()(inferred)
    except Exception as err:
        if LAYOUT_ERRORS.search(str(err)) is None:
            raise
        raise MetalLoweringError(no_layout_message(mod, run, True)) from None
