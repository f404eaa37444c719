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

`REGISTER_BUDGET` is the general-purpose register file one thread can address before the
compiler spills, with its sources. Register staging and K-prefetch are turned on only where the
estimate with them fits (a `force` setting overrides); the autotuner drops configurations whose
estimate without them does not fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .isa import SIMD_WIDTH, MatrixInstruction
from .scopes import FRAGMENT_SCOPES, SIMDGROUP_SCOPES
from .selection import Partition, WarpPolicy, select_inst, warp_partition

_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "uint8": 1, "int32": 4}


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
    """Registers per thread of a GEMM plan (`gemm.GemmPlan`) or an autotuner configuration (anything
    with `path`, `block_m`, `block_n`, `threads`, `block_k`, `num_stages`: `autotune.GemmConfig`).

    A configuration is planned as GemmMetal would plan it on `target` (its instruction and warp
    partition); `staging` (default: a shared path with 2 or more stages) adds the register-staging
    array, `prefetch` the K-prefetch copy of the operands. A plan carries no staging tile, so
    `staging` must be False or None for one."""
    if hasattr(subject, "problem") and hasattr(subject, "partition"):  # a GemmPlan
        p = subject.problem
        if staging:
            raise ValueError("a GemmPlan does not know its staging tile: estimate staging from the configuration (block_m, block_n, block_k)")
        in_registers = p.C.scope in FRAGMENT_SCOPES + SIMDGROUP_SCOPES  # else GemmMetal allocates a float32 accumulator
        return gemm_registers(M=p.M, N=p.N, instruction=subject.instruction, partition=subject.partition, a_dtype=p.A.dtype,
                              b_dtype=p.B.dtype, acc_dtype=p.C.dtype if in_registers else "float32",
                              shared=subject.dataflow == "shared", prefetch=prefetch)
    cfg = subject
    shared = cfg.path == "shared"
    selection = select_inst(c_scope="local.fragment" if shared else "global", M=cfg.block_m, N=cfg.block_n,
                            K=cfg.block_k if shared else 16, threads=cfg.threads, policy=WarpPolicy.SQUARE,
                            has_metal4=_has_metal4(target), route_fragments_to_cooperative_tensor=fragment_ct)
    c_scope = "local.fragment" if shared else "global"
    part = warp_partition(selection, c_scope, WarpPolicy.SQUARE, cfg.block_m, cfg.block_n, cfg.threads // SIMD_WIDTH)
    if part is None:
        raise ValueError(f"no legal warp partition of a {cfg.block_m}x{cfg.block_n} tile over {cfg.threads // SIMD_WIDTH} simdgroups")
    with_staging = (shared and cfg.num_stages >= 2) if staging is None else bool(staging)
    elements = staging_elements(cfg.block_m, cfg.block_n, cfg.block_k, cfg.threads) if with_staging else 0
    return gemm_registers(M=cfg.block_m, N=cfg.block_n, instruction=selection.instruction, partition=part, a_dtype=dtype,
                          b_dtype=dtype, acc_dtype=acc_dtype, shared=shared, staging_elements=elements, staging_dtype=dtype,
                          prefetch=prefetch and not shared)


def _has_metal4(target: Any) -> bool:
    if isinstance(target, bool):
        return target
    from .host import resolve_target
    from .target import has_metal4

    return has_metal4(resolve_target(target if target is not None else "metal"))


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
