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
- Metal has no asynchronous global -> threadgroup copy, so a pipelined loop's copies of later K
  steps are split (plugin passes around InjectSoftwarePipeline and ThreadSync): device loads into
  registers before the current step's MMAs, threadgroup stores after them, one barrier per step;
- the last passes put lane / simdgroup ids on Metal's execution attributes, unroll the short
  loops over matrix accumulators, hoist position-only address terms into the kernel prelude, record
  which thread arrays live in matrix objects, and check threadgroup resources: every decision is on
  the IR before the printer runs.
"""

from __future__ import annotations


from .target.capabilities import capabilities_of
from .core.ir_attrs import STAGING_KEPT_ATTR, collect_decisions
from .config import LoweringOptions, lowering, lowering_scope, stamp, stamped
from .codegen.build import build_metal, build_metal_runtime
from .lowering_cache import cached_lowering
from .legalize import LowerAtomics, LowerShuffleWidths, SplitWideVectors, UseWideCopies
from .host.passes import infer_layouts, pipeline_options, plan_pipelines, stock_passes
from .ops import LowerMetalAtomicTileOps, LowerMetalTileOps
from .transform.block_swizzle import BlockSwizzleLaunch, BlockSwizzleRemap
from .transform.branch_barriers import SplitBranchBarriers
from .transform.device_memory_sync import SyncDeviceMemory
from .transform.guarded_bodies import legalize_unguarded
from .transform.expression_lets import InlineExpressionLets
from .transform.function_pass import per_function_pass
from .transform.floor_division import LowerFloorDivisions
from .transform.fragment_groups import gemm_roles
from .transform.gemm_plans import RecordGemmPlans
from .transform.hoist_offsets import HoistPositionOffsets
from .transform.interior_split import SplitInteriorThreadgroups
from .transform.layout_failures import no_layout_message
from .transform.math_precision import PreserveMathPrecision
from .transform.matrix_storage import RecordMatrixStorage
from .transform.power_of_two_division import RestorePowerOfTwoDivisions, ShieldPowerOfTwoDivisions, shape_variables
from .transform.register_staging import SplitStagedCopies
from .transform.resource_check import CheckThreadgroupResources, ThreadgroupBufferLog
from .transform.scalar_params import CheckScalarParams
from .transform.imported_sources import CheckImportedSources
from .transform.shared_staging import BypassSharedStaging
from .transform.keep_shuffle_widths import KeepShuffleWidths
from .transform.skipped_body_sync import SyncSkippedBodies
from .transform.simdgroup_forms import UseSimdgroupMatrixForms
from .transform.simdgroup_indices import UseSimdgroupIndices
from .transform.thread_linearization import LinearizeThreadLaunch
from .transform.tile_pointers import UseTilePointers
from .transform.unroll_accumulators import UnrollAccumulatorLoops
from .transform.while_loop_sync import SyncWhileLoops
from .transform.zero_trip_loops import GuardPossiblyEmptyLoops, GuardPossiblyEmptyPipelineLoops


def lower_metal(mod: object, target: object) -> object:
    """The Metal pipeline, run with `target` as TVM's current target: `T.copy` / `T.Parallel`
    lowering asks for it, and `tilelang.lower(func, target=...)` does not enter it (without this,
    such kernels fail with "Target context required" unless the caller wraps `with target:`)."""
    from .host import Target

    # The options are built once here (or were, by the compile that called tilelang.lower) and stay
    # current until the passes end: the GEMM hooks LayoutInference / LowerTileOp call read them.
    with lowering_scope() as options:
        if Target.current(allow_none=True) is not None:
            return cached_lowering(mod, target, options, _lower_metal_passes)
        with Target(target) if not isinstance(target, Target) else target:
            return cached_lowering(mod, target, options, _lower_metal_passes)


def _lower_metal_passes(mod: object, target: object, options: LoweringOptions) -> object:
    tl, tirx, s_tir = stock_passes()  # tilelang.transform, tvm.tirx.transform, tvm.s_tir.transform

    cfg = pipeline_options()
    ctx = tl.get_pass_context()
    threadgroup_buffers = ThreadgroupBufferLog()  # plugin: names and sizes for the threadgroup-memory refusal

    capabilities = capabilities_of(target)  # the plugin passes read these, never the target's keys
    shape_vars = shape_variables(mod)  # plugin: tensor dimensions (>= 0), for ShieldPowerOfTwoDivisions
    mod = tirx.BindTarget(target)(mod)
    mod = CheckScalarParams(mod)  # plugin: a bfloat16 / fp8 scalar parameter by name (MakePackedAPI fails on it without one)
    mod = CheckImportedSources(mod)  # plugin: T.import_source must be MSL (CUDA / PTX refused by line)
    mod = tl.MaterializeKernelLaunch(
        lower_grid_binding=True, lower_thread_binding=True, default_threads=128, unsupported_annotations=["cluster_dims"]
    )(mod)
    mod = LinearizeThreadLaunch(mod)  # plugin: a 2-D / 3-D launch with tile ops runs as one linear x index (tile ops partition over x only)
    mod = GuardPossiblyEmptyLoops(mod)  # plugin: tl.Simplify folds an extent in [0, 1] to 1 unless the loop is known to run
    mod = BypassSharedStaging(mod, capabilities, options)  # plugin: staging-only shared operands -> direct-global T.gemm
    threadgroup_buffers.staging_kept = [str(r) for f in _prim_funcs(mod) if f.attrs is not None and STAGING_KEPT_ATTR in f.attrs for r in f.attrs[STAGING_KEPT_ATTR]]
    mod = SyncDeviceMemory(mod)  # plugin: mem_device barriers where threads exchange data through device memory
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
    mod = plan_pipelines(mod)  # tilelang's PipelinePlanning, its internal errors in one line
    threadgroup_buffers.record_declared(mod)
    mod = tl.InjectSoftwarePipeline()(mod)
    mod = GuardPossiblyEmptyPipelineLoops(mod)  # plugin: the pipeline's body loop (trip count minus the prologue) may be empty too
    threadgroup_buffers.record_pipelined(mod)
    mod = RecordGemmPlans(mod, capabilities, options)  # plugin: each T.gemm's plan on its call (shared accumulators, fragment groups, K-prefetch, register staging: pipelined copies whose stores may move after the MMAs); the passes and GemmMetal read it
    mod = tl.Simplify()(mod)

    # Tile ops: layout inference asks GemmMetal (through the tl.gemm.infer_layout hook) for the
    # accumulator's fragment layout, LowerTileOp asks it (tl.gemm.lower) for the GEMM body.
    mod = LowerMetalAtomicTileOps(mod)  # plugin: tile atomics -> T.Parallel loops of element atomics
    mod = infer_layouts(mod, _conflict_message, _no_layout_message)  # tilelang's LayoutInference + ReducerPlanAndMaterialize, their internal errors in one line
    cfg.LayoutVisual(mod)
    mod = LowerMetalTileOps(mod)  # plugin: tl.reduce / tl.cumsum from the recorded fragment layouts
    mod = tl.LowerTileOp()(mod)
    mod = per_function_pass("tilelang_metal.CollectDecisions", collect_decisions)(mod)  # plugin: the GEMM plans onto the function (--explain)
    mod = tl.VerifyReducerConsumed()(mod)

    mod = tl.DecoupleTypeCast()(mod)
    mod = tl.LegalizeVectorizedLoop()(mod)
    mod = legalize_unguarded(mod, tl.LegalizeSafeMemoryAccess())  # plugin: GEMM bodies guarded by construction skip it
    mod = tl.LowerAccessPtr()(mod)
    mod = tl.Simplify()(mod)
    mod = tl.HoistNonRestrictParams()(mod)

    mod = tl.PlanAndUpdateBufferAllocationLocation()(mod)
    mod = tl.HoistGlobalBufferAllocations()(mod)
    mod = tl.LowerOpaqueBlock()(mod)
    mod = tl.Simplify()(mod)
    mod = tirx.NarrowDataType(32)(mod)
    mod = tl.FlattenBuffer()(mod)
    mod = tl.ConfigIndexBitwidth()(mod)
    mod = tirx.Simplify()(mod)
    mod = tl.VectorizeLoop(enable_vectorize=cfg.allow_vectorize(pass_ctx=ctx))(mod)
    mod = tl.StorageRewrite()(mod)
    mod = tl.LoopUnswitching()(mod)
    mod = tl.UnrollLoop()(mod)
    mod = s_tir.RenormalizeSplitPattern()(mod)
    mod = tirx.Simplify()(mod)
    mod = tirx.RemoveNoOp()(mod)
    mod = s_tir.HoistIfThenElse()(mod)

    mod = tirx.VerifyMemory()(mod)
    mod = tirx.AnnotateEntryFunc()(mod)
    mod = tl.LowerThreadAllreduce()(mod)

    mod = tl.AnnotateDeviceRegions()(mod)
    mod = tl.SplitHostDevice()(mod)
    mod = tl.AnnotateReadOnlyParams()(mod)

    threadgroup_buffers.record_kernels(mod)
    mod = tl.MergeSharedMemoryAllocations(
        enable_aggressive_merge=cfg.should_enable_aggressive_merge(pass_ctx=ctx, target=target),
        disable_reuse=cfg.should_disable_shared_memory_reuse(pass_ctx=ctx),
    )(mod)
    mod = tl.ThreadSync("shared")(mod)
    mod = tl.ThreadSync("shared.dyn")(mod)
    mod = SplitBranchBarriers(mod)  # plugin: ThreadSync's barriers in thread-dependent branches -> between ifs, where every thread reaches them
    mod = SplitStagedCopies(mod)  # plugin: those copies as register loads before the MMAs, stores after, one barrier per step (no cp.async)
    mod = SyncWhileLoops(mod)  # plugin: ThreadSync leaves `while` iterations unordered
    mod = SyncSkippedBodies(mod)  # plugin: a barrier on the path that skips a loop or branch holding one (zero-trip pipelines)
    mod = tl.MergeIfStmt()(mod)
    mod = tl.MakePackedAPI()(mod)
    mod = tl.Simplify()(mod)
    mod = tl.LowerDeviceKernelLaunch()(mod)
    mod = SplitInteriorThreadgroups(mod)  # plugin: interior threadgroups of a ragged GEMM run without edge guards
    mod = BlockSwizzleLaunch(mod)  # plugin: physical launch grid of the block swizzle (padded MLX grid)
    mod = UseSimdgroupIndices(mod)  # plugin: lane / simdgroup ids from Metal attributes
    mod = UnrollAccumulatorLoops(mod)  # plugin: constant accumulator indices allow storage elision
    mod = CheckThreadgroupResources(mod, threadgroup_buffers)  # plugin: 32 KiB of threadgroup memory (names each buffer), 1024 threads
    mod = PreserveMathPrecision(mod)  # plugin: Metal's tanh, float32 erf for 16-bit floats (before LowerIntrin)
    mod = KeepShuffleWidths(mod)  # plugin: tvm_warp_shuffle* keep their width (LowerIntrin would drop it)
    mod = ShieldPowerOfTwoDivisions(mod, shape_vars)  # plugin: x // 2^k of x >= 0 -> truncating division (LowerIntrin's shifts make the next Simplify's Z3 proofs slow)
    return per_function_pass("tilelang_metal.StampOptions", lambda func: stamp(func, options))(mod)  # plugin: the codegen prints under these


def _prim_funcs(mod: object) -> list:
    from .host import tir

    return [f for f in mod.functions.values() if isinstance(f, tir.PrimFunc)]


def _no_layout_message(mod: object, infer: object, reducer: bool) -> str:
    """The no-layout message; a thread count is suggested only if the plugin's tile ops lower with it
    too (its reducer finalize wants power-of-two steps where layout inference does not)."""
    return no_layout_message(mod, lambda m: LowerMetalTileOps(infer(m)), reducer)


def _conflict_message(mod: object, first: str, second: str) -> str:
    """One line naming both fragments, the ops that fixed their layouts and a fix for this kernel.
    transform/fragment_groups.py already makes the layouts of T.gemm fragments that meet element by
    element agree where one row split can serve both, so what reaches here cannot be fixed that way."""
    roles = gemm_roles(mod)
    what = [f"{name} is {roles[name][0]}" if name in roles else f"{name}'s layout comes from another op (a reduction, a copy or an annotation)" for name in (first, second)]
    if first in roles and second in roles and roles[first][1] != roles[second][1]:
        why = f"their T.gemm tiles have different M ({roles[first][1]} vs {roles[second][1]} rows), so no row split serves both"
    else:
        why = "no common thread layout exists for both"
    return (
        f"register fragments {first} and {second} are used together element by element but have different thread layouts: "
        f"{what[0]}, {what[1]}; {why}. Copy {first} to shared memory (T.copy({first}, {first}_shared)) and read "
        f"{first}_shared in the loop instead" + (", or give both T.gemm calls the same M." if "different M" in why else ".")
    )


def finalize_for_codegen(mod: object) -> object:
    """The device module's last passes, run by the codegen entry after tilelang's own pre-codegen
    passes (LowerIntrin, Simplify, HoistBroadcastValues), which would undo them if run earlier:
    Simplify inlines every `Bind`."""
    mod = LowerFloorDivisions(mod)  # plugin: integer floor div / mod that tilelang's Simplify wrote after LowerIntrin -> MSL operators
    mod = RestorePowerOfTwoDivisions(mod)  # plugin: those divisions -> the shifts / masks LowerIntrin would have written
    mod = InlineExpressionLets(mod)  # plugin: MSL has no expression-level let (clamp, floordiv by a runtime divisor)
    mod = BlockSwizzleRemap(mod)  # plugin: physical -> logical tiles once, early return of padding
    mod = UseSimdgroupMatrixForms(mod)  # plugin: whole-matrix fill / simdgroup_store where provably equal
    mod = HoistPositionOffsets(mod)  # plugin: position-only address terms computed once per thread
    mod = UseTilePointers(mod)  # plugin: one `__src` tile pointer per operand and K step (spec 1.4)
    mod = RecordMatrixStorage(mod)  # plugin: which thread arrays are cooperative tensors / simdgroup matrices
    return legalize_for_msl(mod)


def legalize_for_msl(mod: object) -> object:
    """The late MSL legalization (legalize/): the last decisions, taken on TIR, so the printer spells
    one node at a time. After RecordMatrixStorage: the passes read which arrays are matrix objects."""
    mod = UseWideCopies(mod)  # plugin: 16-byte copies proved aligned at both ends -> tlm_copy16 (one uint4 move)
    mod = SplitWideVectors(mod)  # plugin: stores wider than Metal's 4 lanes -> 4-lane stores
    mod = LowerShuffleWidths(mod)  # plugin: CUDA-width shuffles -> Metal's whole-simdgroup shuffles, segment arithmetic, select
    mod = LowerAtomics(mod)  # plugin: element atomics -> native atomics or compare-and-swap helpers on 32-bit words
    return mod



def _module_options(mod: object):
    """The options `mod` was lowered with (stamped by lower_metal), current while it is finalized
    and printed; a module that did not come through lower_metal gets the open compile's, or new ones."""
    options = stamped(_prim_funcs(mod))
    return lowering(options) if options is not None else lowering_scope()


def codegen_build(mod: object, target: object) -> object:
    """The device codegen hook (tilelang's build_without_compile): the late passes, then the MSL source module."""
    with _module_options(mod):
        return build_metal(finalize_for_codegen(mod), target)


def codegen_build_runtime(mod: object, target: object) -> object:
    """The device codegen hook with device compile (execution_backend="tvm_ffi"): the late passes,
    then TVM's Metal runtime module."""
    with _module_options(mod):
        return build_metal_runtime(finalize_for_codegen(mod), target)
