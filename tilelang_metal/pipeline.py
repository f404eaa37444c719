"""The complete Metal lowering pass order, in one place.

Mostly stock tilelang / TVM passes; the plugin's own passes are marked `# plugin`. Differences from
the in-tree Metal pipeline, and why:
- no fragment-to-simdgroup scope rewrite before layout inference: GemmMetal gives register
  accumulators a real fragment layout (the lane layout of the chosen instruction), so `T.Parallel`
  epilogues and `T.copy` on accumulators lower through ordinary layout inference;
- block swizzles are resolved on the device function after the split (plugin pass): the MLX order
  pads the launch grid, and the kernel maps physical to logical tiles once, returning early for
  padding threadgroups;
- tile ops tilelang has no Metal implementation for (reductions, reducer finalize, scans) are
  rewritten by the plugin right before LowerTileOp, from the layouts layout inference recorded;
- the last passes put lane / simdgroup ids on Metal's execution attributes and unroll the short
  loops over matrix accumulators, so the printer can keep them in cooperative tensors.
"""

from __future__ import annotations

from ._host import pipeline_options
from .ops import LowerMetalTileOps
from .transform.block_swizzle import BlockSwizzle
from .transform.gemm_launch_check import CheckGemmLaunch
from .transform.simdgroup_indices import UseSimdgroupIndices
from .transform.unroll_accumulators import UnrollAccumulatorLoops

def lower_metal(mod: object, target: object) -> object:
    import tilelang

    tl = tilelang.transform
    from tvm import s_tir, tirx

    cfg = pipeline_options()
    ctx = tl.get_pass_context()

    mod = tirx.transform.BindTarget(target)(mod)
    mod = tl.MaterializeKernelLaunch(
        lower_grid_binding=True, lower_thread_binding=True, default_threads=128, unsupported_annotations=["cluster_dims"]
    )(mod)
    mod = CheckGemmLaunch(mod)  # plugin: GEMM needs 1-D threads (clear error instead of redundant work)
    if cfg.should_force_let_inline():
        mod = tl.LetInline()(mod)
    mod = tl.AddWrapperForSingleBufStore()(mod)
    mod = tl.LegalizeNegativeIndex()(mod)
    if cfg.should_enable_race_check():
        mod = tl.VerifyParallelLoop()(mod)
    mod = tl.InjectAssumes()(mod)
    mod = tl.Simplify()(mod)
    mod = tl.CanonicalizeLegacyReducer()(mod)
    mod = tl.VerifyReducerEpoch()(mod)
    mod = tl.VerifyBufferInit()(mod)

    mod = tl.IfStmtBinding()(mod)
    mod = tl.PipelinePlanning()(mod)
    mod = tl.InjectSoftwarePipeline()(mod)
    mod = tl.Simplify()(mod)

    # Tile ops: layout inference asks GemmMetal (through the tl.gemm.infer_layout hook) for the
    # accumulator's fragment layout, LowerTileOp asks it (tl.gemm.lower) for the GEMM body.
    mod = tl.LayoutInference()(mod)
    mod = tl.ReducerPlanAndMaterialize()(mod)
    cfg.LayoutVisual(mod)
    mod = LowerMetalTileOps(mod)  # plugin: tl.reduce / tl.cumsum from the recorded fragment layouts
    mod = tl.LowerTileOp()(mod)
    mod = tl.VerifyReducerConsumed()(mod)

    mod = tl.DecoupleTypeCast()(mod)
    mod = tl.LegalizeVectorizedLoop()(mod)
    mod = tl.LegalizeSafeMemoryAccess()(mod)
    mod = tl.LowerAccessPtr()(mod)
    mod = tl.Simplify()(mod)
    mod = tl.HoistNonRestrictParams()(mod)

    mod = tl.PlanAndUpdateBufferAllocationLocation()(mod)
    mod = tl.HoistGlobalBufferAllocations()(mod)
    mod = tl.LowerOpaqueBlock()(mod)
    mod = tl.Simplify()(mod)
    mod = tirx.transform.NarrowDataType(32)(mod)
    mod = tl.FlattenBuffer()(mod)
    mod = tl.ConfigIndexBitwidth()(mod)
    mod = tirx.transform.Simplify()(mod)
    mod = tl.VectorizeLoop(enable_vectorize=cfg.allow_vectorize(pass_ctx=ctx))(mod)
    mod = tl.StorageRewrite()(mod)
    mod = tl.LoopUnswitching()(mod)
    mod = tl.UnrollLoop()(mod)
    mod = s_tir.transform.RenormalizeSplitPattern()(mod)
    mod = tirx.transform.Simplify()(mod)
    mod = tirx.transform.RemoveNoOp()(mod)
    mod = s_tir.transform.HoistIfThenElse()(mod)

    mod = tirx.transform.VerifyMemory()(mod)
    mod = tirx.transform.AnnotateEntryFunc()(mod)
    mod = tl.LowerThreadAllreduce()(mod)

    mod = tl.AnnotateDeviceRegions()(mod)
    mod = tl.SplitHostDevice()(mod)
    mod = tl.AnnotateReadOnlyParams()(mod)

    mod = tl.MergeSharedMemoryAllocations(
        enable_aggressive_merge=cfg.should_enable_aggressive_merge(pass_ctx=ctx, target=target),
        disable_reuse=cfg.should_disable_shared_memory_reuse(pass_ctx=ctx),
    )(mod)
    mod = tl.ThreadSync("shared")(mod)
    mod = tl.ThreadSync("shared.dyn")(mod)
    mod = tl.MergeIfStmt()(mod)
    mod = tl.MakePackedAPI()(mod)
    mod = tl.Simplify()(mod)
    mod = tl.LowerDeviceKernelLaunch()(mod)
    mod = BlockSwizzle(mod)  # plugin: physical -> logical tiles once, padded MLX grid
    mod = UseSimdgroupIndices(mod)  # plugin: lane / simdgroup ids from Metal attributes
    mod = UnrollAccumulatorLoops(mod)  # plugin: constant accumulator indices allow storage elision
    return mod

