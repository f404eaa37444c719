"""Registers per thread of a Metal GEMM, estimated from its plan, and the budget they must fit.

An estimate, not a measurement: Apple's compiler allocates the registers, and nothing on Linux can
ask it. The estimate counts what the lowering keeps live per thread across the K loop, in 32-bit
registers (16-bit values count half):

- accumulator: the thread's share of C, `rows x cols x dest_elems` of the accumulator dtype;
- operands: one K step's A and B fragments (`rows x left_elems + cols x right_elems`);
- prefetch: a second copy of the operands when the K loop loads step k+1 ahead (gemm/prefetch.py);
- staging: the register array of a pipelined shared loop's copies, `(bM*bK + bK*bN) / threads`
  elements of the input dtype (transform/register_staging.py);
- addresses: lane, simdgroup index, the two threadgroup position components and the K counter (5),
  one running offset per device operand and C (3), and on the shared path the threadgroup offsets
  of the copy's stores and of the A and B fragment reads (3). The buffers' base addresses are the
  same for every thread and live in uniform registers, not in the per-thread file;
- reserved: r0 (whose low half holds the execution-mask stack) and r1 (the link register).

`kernel_registers(record)` estimates any printed kernel the same way from its artifact record
(codegen/artifact.py), not from its text: the peak over its lines of the thread arrays and cooperative
tensors live there (simdgroup matrices count rows x cols / 32 elements per lane), plus addresses and
reserved as above. `threadgroups_per_core` turns threads, threadgroup memory and registers into the
threadgroups one core holds at once, naming the resource that limits it.

`attention_registers` predicts `kernel_registers` of flash attention's kernels from their block sizes
(kernels/attention.py picks its default blocks with it), without lowering.

`REGISTER_BUDGET` is the general-purpose register file one thread can address before the
compiler spills, with its sources. Register staging and K-prefetch are turned on only where the
estimate with them fits (a `force` setting overrides); the autotuner drops configurations whose
estimate without them does not fit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..target.capabilities import capabilities_with, resolve_capabilities
from ..core.dtypes import DTYPE_OF_MSL
from ..target.isa import SIMD_WIDTH, MatrixInstruction
from ..core.scopes import FRAGMENT_SCOPES, SIMDGROUP_SCOPES
from ..planning import SHARED, GemmPlan, plan_gemm
from ..selection import Partition, WarpPolicy

_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "uint8": 1, "int32": 4, "int16": 2, "uint16": 2,
          "uint32": 4, "int64": 8, "uint64": 8, "bool": 1}


@dataclass(frozen=True)
class RegisterBudget:
    registers: int  # 32-bit general-purpose registers per thread
    half_registers: int
    sources: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        return f"{self.registers} 32-bit ({self.half_registers} 16-bit) registers per thread, estimated from public measurements"


REGISTER_BUDGET = RegisterBudget(
    registers=128,
    half_registers=256,
    sources=(
        "Dougall Johnson, Apple G13 GPU Architecture Reference (dougallj.github.io/applegpu/docs.html): up to 128 "
        "general-purpose 32-bit registers per thread, r0-r127, each also addressable as two 16-bit halves; r0l holds the "
        "execution-mask stack, r1 the link register; uniform registers u0-u255 hold values common to all threads, such as buffer addresses",
        "Mesa, Asahi AGX compiler (src/asahi/compiler, agx_occupancy_for_register_count, Alyssa Rosenzweig 2023): occupancy "
        "table from 104 half-registers (1024 threads per core) to 256 half-registers (384 threads); no entry beyond 256",
        "Philip Turner, metal-benchmarks (github.com/philipturner/metal-benchmarks, README 'On-Chip Memory'): ~208 KB register "
        "file per core, 384-3072 threads per core; over-allocating registers lowers occupancy, past the limit the compiler spills to memory",
        "Apple WWDC16 session 606 'Advanced Metal Shader Optimization': the more registers a shader uses, the fewer threads "
        "(occupancy); WWDC20 session 10632 'Optimize Metal Performance for Apple silicon Macs': register pressure and 16-bit types",
    ),
)

# Threads per GPU core that stay resident at a register count (half-registers per thread), from the
# Mesa table cited above: (most half-registers, threads per core).
OCCUPANCY = ((104, 1024), (112, 896), (128, 832), (136, 768), (144, 704), (160, 640), (184, 576), (208, 512), (232, 448), (256, 384))

_IDS_AND_COUNTER = 5  # lane, simdgroup index, threadgroup position x / y, K loop counter
_DEVICE_OFFSETS = 3  # A, B, C
_THREADGROUP_OFFSETS = 3  # the copy's stores, A and B fragment reads
_RESERVED = 2  # r0 (execution-mask stack in r0l), r1 (link register)


def registers(elements: int, dtype: str) -> int:
    """32-bit registers holding `elements` values of `dtype` (16-bit values pack two to a register)."""
    return math.ceil(elements * _BYTES.get(str(dtype), 4) / 4)


@dataclass(frozen=True)
class RegisterEstimate:
    """Registers per thread (32-bit units), by what holds them: an estimate (see the module docstring)."""

    accumulator: int
    operands: int
    prefetch: int
    staging: int
    addresses: int
    reserved: int = _RESERVED

    @property
    def total(self) -> int:
        return self.accumulator + self.operands + self.prefetch + self.staging + self.addresses + self.reserved

    @property
    def fits(self) -> bool:
        return self.total <= REGISTER_BUDGET.registers

    @property
    def half_registers(self) -> int:
        return 2 * self.total

    def without(self, *, staging: bool = False, prefetch: bool = False) -> RegisterEstimate:
        """The same plan without register staging and / or K-prefetch."""
        return RegisterEstimate(self.accumulator, self.operands, 0 if prefetch else self.prefetch, 0 if staging else self.staging,
                                self.addresses, self.reserved)

    def breakdown(self) -> dict[str, int]:
        return {"accumulator": self.accumulator, "operands": self.operands, "prefetch": self.prefetch, "staging": self.staging,
                "addresses": self.addresses, "reserved": self.reserved}

    def describe(self) -> str:
        parts = ", ".join(f"{name} {value}" for name, value in self.breakdown().items() if value)
        return f"about {self.total} of {REGISTER_BUDGET.registers} 32-bit registers per thread (estimate: {parts})"


def address_registers(*, shared: bool) -> int:
    """Indices, the K counter and running offsets (see the module docstring)."""
    return _IDS_AND_COUNTER + _DEVICE_OFFSETS + (_THREADGROUP_OFFSETS if shared else 0)


def threads_per_core(estimate: RegisterEstimate) -> int:
    """Resident threads per GPU core at this register count (the Mesa occupancy table); 384, the
    table's floor, past the budget (the compiler spills instead of lowering occupancy further)."""
    return next((threads for most, threads in OCCUPANCY if estimate.half_registers <= most), OCCUPANCY[-1][1])


def gemm_registers(*, M: int, N: int, instruction: MatrixInstruction, partition: Partition, a_dtype: str, b_dtype: str,
                   acc_dtype: str, shared: bool, staging_elements: int = 0, staging_dtype: str = "float16",
                   prefetch: bool = False) -> RegisterEstimate:
    """The estimate for one T.gemm tile of M x N split by `partition` over simdgroups of `instruction`."""
    rows = M // partition.m_warp // instruction.m
    cols = N // partition.n_warp // instruction.n
    accumulator = registers(rows * cols * instruction.dest_elems, acc_dtype)
    operands = registers(rows * instruction.left_elems, a_dtype) + registers(cols * instruction.right_elems, b_dtype)
    addresses = address_registers(shared=shared)
    staging = registers(staging_elements, staging_dtype) if staging_elements else 0
    return RegisterEstimate(accumulator, operands, operands if prefetch else 0, staging, addresses)


def staging_elements(block_m: int, block_n: int, block_k: int, threads: int) -> int:
    """Elements one thread copies per K step of a shared A (block_m x block_k) and B (block_k x block_n) tile."""
    return math.ceil((block_m * block_k + block_k * block_n) / threads)


def estimate_registers(subject: Any, *, dtype: str = "float16", acc_dtype: str = "float32", target: Any = None,
                       staging: bool | None = None, prefetch: bool = False, fragment_ct: bool = True) -> RegisterEstimate:
    """Registers per thread of a GEMM plan GemmMetal made (`planning.GemmPlan`) or an autotuner configuration (anything
    with `path`, `block_m`, `block_n`, `threads`, `block_k`, `num_stages`: `autotune.GemmConfig`).

    A configuration is planned as GemmMetal would plan it on `target` (a Target, "metal", None for
    this host's, or `TargetCapabilities`): its instruction and warp partition; `staging` (default:
    a shared path with 2 or more stages) adds the register-staging
    array, `prefetch` the K-prefetch copy of the operands. A plan carries no staging tile, so
    `staging` must be False or None for one."""
    if isinstance(subject, GemmPlan):
        p = subject.problem
        if p is None:
            raise ValueError("a GemmPlan planned from a shape alone has no operand types: estimate it from the configuration")
        if staging:
            raise ValueError("a GemmPlan does not know its staging tile: estimate staging from the configuration (block_m, block_n, block_k)")
        in_registers = p.C.scope in FRAGMENT_SCOPES + SIMDGROUP_SCOPES  # else GemmMetal allocates a float32 accumulator
        return gemm_registers(M=p.M, N=p.N, instruction=subject.instruction, partition=subject.partition, a_dtype=p.A.dtype,
                              b_dtype=p.B.dtype, acc_dtype=p.C.dtype if in_registers else "float32",
                              shared=subject.dataflow == SHARED, prefetch=prefetch)
    cfg = subject
    shared = cfg.path == SHARED
    planned = plan_gemm(c_scope="local.fragment" if shared else "global", M=cfg.block_m, N=cfg.block_n,
                        K=cfg.block_k if shared else 16, threads=cfg.threads, policy=WarpPolicy.SQUARE,
                        capabilities=resolve_capabilities(target), fragment_ct=fragment_ct)
    part = planned.partition
    if part is None:
        raise ValueError(f"no legal warp partition of a {cfg.block_m}x{cfg.block_n} tile over {cfg.threads // SIMD_WIDTH} simdgroups")
    with_staging = (shared and cfg.num_stages >= 2) if staging is None else bool(staging)
    elements = staging_elements(cfg.block_m, cfg.block_n, cfg.block_k, cfg.threads) if with_staging else 0
    return gemm_registers(M=cfg.block_m, N=cfg.block_n, instruction=planned.instruction, partition=part, a_dtype=dtype,
                          b_dtype=dtype, acc_dtype=acc_dtype, shared=shared, staging_elements=elements, staging_dtype=dtype,
                          prefetch=prefetch and not shared)


@dataclass(frozen=True)
class RegisterDecision:
    """A register-hungry feature turned off because the estimate with it is over the budget (CLI --explain)."""

    feature: str  # "register staging" | "K-prefetch"
    subject: str  # what it would have applied to
    setting: str  # the environment variable that forces it
    with_it: RegisterEstimate

    def describe(self) -> str:
        return (f"{self.feature} off for registers: {self.subject} would need {self.with_it.describe()}, over the budget; "
                f"{self.setting}=force turns it on anyway")


# ---------------------------------------------------------------- any kernel, from its artifact record

# Threadgroup memory one GPU core holds for its resident threadgroups (Philip Turner, metal-benchmarks,
# README "On-Chip Memory": ~60 KB on Apple 7 / 8; an estimate, Apple publishes no figure), and the most
# threads a core keeps resident (the Mesa occupancy table's first entry: 1024 at few registers).
THREADGROUP_MEMORY_PER_CORE = 60 * 1024
MAX_THREADS_PER_CORE = OCCUPANCY[0][1]

_SIMDGROUP_MATRIX = re.compile(r"^simdgroup_(?P<scalar>[a-z]+?)(?P<rows>\d+)x(?P<cols>\d+)$")
_VECTOR = re.compile(r"^(?P<scalar>[a-z]+?)(?P<lanes>[234])?$")


def msl_registers(elem_type: str, count: int) -> int:
    """32-bit registers per thread of `count` values of MSL type `elem_type`: a scalar or vector type,
    or a simdgroup matrix (`simdgroup_half8x8`: 64 values spread over 32 lanes, 2 per lane)."""
    m = _SIMDGROUP_MATRIX.match(elem_type)
    if m is not None:
        per_lane = int(m["rows"]) * int(m["cols"]) // SIMD_WIDTH
        return registers(count * per_lane, DTYPE_OF_MSL.get(m["scalar"], "float32"))
    m = _VECTOR.match(elem_type)
    if m is None or m["scalar"] not in DTYPE_OF_MSL:
        raise ValueError(f"no register size for thread array type {elem_type!r}")
    return registers(count * int(m["lanes"] or 1), DTYPE_OF_MSL[m["scalar"]])


@dataclass(frozen=True)
class KernelRegisters:
    """Registers per thread of one printed kernel (32-bit units, an estimate): `arrays` is the peak
    over the kernel's lines of the thread arrays and cooperative tensors live on that line, `peak`
    the arrays that make it up."""

    arrays: int
    addresses: int
    reserved: int = _RESERVED
    peak: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.arrays + self.addresses + self.reserved

    @property
    def half_registers(self) -> int:
        return 2 * self.total

    @property
    def fits(self) -> bool:
        return self.total <= REGISTER_BUDGET.registers

    def describe(self) -> str:
        held = f" ({', '.join(self.peak)})" if self.peak else ""
        return (f"about {self.total} of {REGISTER_BUDGET.registers} 32-bit registers per thread (estimate: arrays {self.arrays}{held}, "
                f"addresses {self.addresses}, reserved {self.reserved})")


def record_address_registers(record: Any) -> int:
    """The GEMM rule of `address_registers`, for any kernel: indices and a loop counter (5), one
    running offset per device buffer, and with threadgroup memory one offset per threadgroup array
    it reads (a merged pool's views, not the pool) plus one for the stores."""
    pools = {v.pool for v in record.threadgroup_views}
    tg_buffers = len(record.threadgroup_views) + sum(1 for a in record.threadgroup_arrays if a.name not in pools)
    return _IDS_AND_COUNTER + len(record.buffers) + (tg_buffers + 1 if tg_buffers else 0)


def kernel_registers(record: Any) -> KernelRegisters:
    """The estimate of a kernel from its artifact record (`codegen.artifact.KernelRecord`). An array
    without a live range (hand-written MSL) counts as live everywhere."""
    held: list[tuple[str, int, tuple[int, int] | None]] = [
        (t.name, msl_registers(t.elem_type, t.count), t.live) for t in record.thread_arrays]
    held += [(f"{c.name} ({c.count} cooperative tensors)", registers(c.count * c.elements, DTYPE_OF_MSL.get(c.elem_type, "float32")),
              c.live) for c in record.cooperative_tensors]
    everywhere = [h for h in held if h[2] is None]
    ranged = [h for h in held if h[2] is not None]
    best: tuple[int, tuple[str, ...]] = (0, ())
    # the peak is where some segment starts
    for line in sorted({first for h in ranged for first, _ in h[2]}) or [0]:
        live = everywhere + [h for h in ranged if any(first <= line <= last for first, last in h[2])]
        best = max(best, (sum(h[1] for h in live), tuple(h[0] for h in live)), key=lambda b: b[0])
    return KernelRegisters(best[0], record_address_registers(record), peak=best[1])


def threadgroup_bytes(record: Any) -> int:
    """Threadgroup memory one threadgroup of the kernel allocates (its arrays; views lie in pools)."""
    sizes = {"half": 2, "bfloat": 2, "float": 4, "char": 1, "uchar": 1, "short": 2, "ushort": 2, "int": 4, "uint": 4,
             "long": 8, "ulong": 8, "bool": 1}
    return sum(a.count * sizes.get(a.elem_type, 4) for a in record.threadgroup_arrays)


def threads_of(record: Any) -> int:
    """Threads per threadgroup: the static block, else the kernel's bound."""
    if record.block is not None:
        return math.prod(record.block)
    return int(record.max_total_threads or MAX_THREADS_PER_CORE)


@dataclass(frozen=True)
class Occupancy:
    """Threadgroups one GPU core holds at once (an estimate) and the resource that limits them."""

    threadgroups: int
    limited_by: str  # "threads" | "registers" | "threadgroup memory"
    threads: int
    threadgroup_bytes: int
    registers: int

    def describe(self) -> str:
        return (f"{self.threadgroups} threadgroup(s) of {self.threads} threads per core, limited by {self.limited_by} "
                f"(estimate: {self.registers} registers per thread, {self.threadgroup_bytes} B of threadgroup memory)")


def threadgroups_per_core(threads: int, threadgroup_memory: int, registers_per_thread: int) -> Occupancy:
    """Threadgroups resident per core: the core's thread limit, the threads the register count leaves
    resident (the Mesa table), and ~60 KB of threadgroup memory, whichever is smallest; at least 1 (a
    threadgroup that fits nothing still runs, alone, spilling). Ties name the first of threads,
    registers, threadgroup memory."""
    by_registers = threads_per_core(KernelRegisters(registers_per_thread, 0, 0))
    limits = [("threads", MAX_THREADS_PER_CORE // threads), ("registers", by_registers // threads)]
    if threadgroup_memory:
        limits.append(("threadgroup memory", THREADGROUP_MEMORY_PER_CORE // threadgroup_memory))
    resource, count = min(limits, key=lambda item: item[1])
    return Occupancy(max(1, count), resource, threads, threadgroup_memory, registers_per_thread)


def kernel_occupancy(record: Any) -> tuple[KernelRegisters, Occupancy]:
    """The register estimate of a printed kernel and the threadgroups per core it allows."""
    regs = kernel_registers(record)
    return regs, threadgroups_per_core(threads_of(record), threadgroup_bytes(record), regs.total)


# ---------------------------------------------------------------- flash attention, before lowering

_ATTENTION_ROW_STATS = 7  # row_max, row_max_prev, row_rescale, row_sum, denominator and the two reductions' partials


@dataclass(frozen=True)
class AttentionPlan:
    """How the plugin lowers an attention tile (kernels/attention.py): both GEMMs on `instruction`,
    the query rows over `m_warp` simdgroups, the other simdgroups replicating S and splitting the
    output along head_dim (`head_dim_split` ways), as transform/fragment_groups.py decides."""

    instruction: MatrixInstruction
    m_warp: int
    head_dim_split: int

    def describe(self) -> str:
        return (f"{self.instruction.name}, rows over {self.m_warp} simdgroup(s)"
                + (f", head_dim split {self.head_dim_split} ways" if self.head_dim_split > 1 else ""))


def attention_plan(head_dim: int, block_m: int, block_n: int, threads: int, *, metal4: bool) -> AttentionPlan | None:
    """The instruction and row split of attention's two GEMMs (S = Q K^T, O += P V with P in
    registers), as fragment_groups chooses them: the instruction with the fewest replicas, a
    cooperative tensor on a tie; None when no whole-tile split exists."""
    from ..target.isa import COOPERATIVE_TENSOR_KIND, METAL4_FEATURE
    from ..selection import cooperative_instructions, row_partition, simdgroup_instruction

    features = capabilities_with({METAL4_FEATURE} if metal4 else ()).features  # the dataflow's, not a target's
    warps = threads // SIMD_WIDTH
    best: tuple[int, AttentionPlan] | None = None
    for inst in (cooperative_instructions(features) if metal4 else []) + [simdgroup_instruction(features)]:
        whole = not (block_m % inst.m or block_n % inst.n or head_dim % inst.k or head_dim % inst.n or block_n % inst.k)
        if inst.kind == COOPERATIVE_TENSOR_KIND and not whole:
            continue
        if head_dim % inst.n or block_n % inst.n:
            continue
        scores = row_partition(block_m, block_n, warps, inst.m, inst.n, split_n=False)
        output = row_partition(block_m, head_dim, warps, inst.m, inst.n, split_n=True)
        if scores is None or output is None:
            continue
        cost = max(scores.replicas, output.replicas)
        if best is None or cost < best[0]:
            best = (cost, AttentionPlan(inst, output.m_warp, output.n_warp))
    return None if best is None else best[1]


def attention_registers(head_dim: int, block_m: int, block_n: int, threads: int, *, metal4: bool, staged: bool,
                        dtype: str = "float16", row_bounds: bool = False, inputs: int = 4) -> KernelRegisters:
    """`kernel_registers` of flash attention's forward kernel (kernels/attention.py) predicted from
    its configuration, without lowering: per lane, for the rows `rows = block_m / m_warp` of its
    simdgroup, Q (rows x head_dim, `dtype`), the output (rows x head_dim / head_dim_split, float),
    S (rows x block_n, float) and P (`dtype`), the row statistics (rows / 8 floats each; the
    per-row key bound too with `row_bounds`: causal or a mask) and the larger of the two GEMMs'
    K-step operands, all live at once in the key loop. Addresses as `record_address_registers`:
    `inputs` device buffers (Q, K, V, O and a mask or sinks), on the staged dataflow the K and V
    tiles. tests/numerics/test_attention_defaults.py checks it against the lowered kernels' records."""
    plan = attention_plan(head_dim, block_m, block_n, threads, metal4=metal4)
    if plan is None:
        raise ValueError(f"no whole-tile split of a {block_m}x{block_n} attention tile (head_dim {head_dim}) over {threads} threads")
    inst, lanes = plan.instruction, SIMD_WIDTH
    rows = block_m // plan.m_warp
    out_cols = head_dim // plan.head_dim_split
    stats = (_ATTENTION_ROW_STATS + (1 if row_bounds else 0)) * math.ceil(rows / 8)
    score_operands = registers(rows * inst.k // lanes, dtype) + registers(inst.k * block_n // lanes, dtype)
    value_operands = registers(rows * inst.k // lanes, dtype) + registers(inst.k * out_cols // lanes, dtype)
    arrays = (registers(rows * head_dim // lanes, dtype) + registers(rows * out_cols // lanes, "float32")
              + registers(rows * block_n // lanes, "float32") + registers(rows * block_n // lanes, dtype)
              + stats + max(score_operands, value_operands))
    addresses = _IDS_AND_COUNTER + inputs + (3 if staged else 0)  # K_shared, V_shared and the stores
    return KernelRegisters(arrays, addresses)
