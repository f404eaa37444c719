"""Instruction selection for `T.gemm` on Metal: pure functions of shape, scope, policy and target keys.

Stage 1 of the spec (section 2.1) chooses between two instruction kinds; the `Selection` carries
the instruction itself (`isa.REGISTRY`, filtered by the target's features), its kind derived from it:

| condition                                                          | kind                      |
|--------------------------------------------------------------------|---------------------------|
| C is in `metal.simdgroup`                                          | `metal.simdgroup`         |
| C is in `local.fragment` and fragments are not routed to MPP       | `metal.simdgroup`         |
| target has `metal4` and `can_use_cooperative_tensor(...)`          | `metal.cooperative_tensor`|
| otherwise                                                          | `metal.simdgroup`         |

`fragment_ct` (the option of that name, TILELANG_METAL_FRAGMENT_CT) is the one deliberate extension of the spec's table (see
docs/selection.md): the spec sends every `local.fragment` accumulator to simdgroup MMA; with it on,
a fragment that passes `can_use_cooperative_tensor` on a `metal4` target lowers to destination
cooperative tensors. Nothing here touches TVM, so the table is unit-testable without lowering.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from .target.capabilities import TargetCapabilities
from .target.isa import COOPERATIVE_TENSOR_KIND, METAL4_FEATURE, REGISTRY, SIMD_WIDTH, SIMDGROUP_KIND, MatrixInstruction
from .core.scopes import FRAGMENT_SCOPES, SIMDGROUP_SCOPES


class WarpPolicy(IntEnum):
    """Same numbering as tilelang's GemmWarpPolicy."""

    SQUARE = 0
    FULL_ROW = 1
    FULL_COL = 2


@dataclass(frozen=True)
class Partition:
    """`m_warp x n_warp` simdgroups tile C; `replicas` copies of that grid compute the same tile.

    Simdgroup `sg` = warp_m + m_warp * (warp_n + n_warp * replica). Replicas exist where a register
    fragment needs whole rows in more simdgroups than the rows can be split over (a register A
    operand with few rows, and the accumulator that produces it: gemm/register_operand.py)."""

    m_warp: int
    n_warp: int
    replicas: int = 1

    @property
    def simdgroups(self) -> int:
        return self.m_warp * self.n_warp * self.replicas


@dataclass(frozen=True)
class Selection:
    instruction: MatrixInstruction
    reason: str
    partition: Partition | None = None

    @property
    def kind(self) -> str:
        return self.instruction.kind


def simdgroup_instruction(features: Iterable[str] = ()) -> MatrixInstruction:
    """The simdgroup instruction: the fallback every Metal target has."""
    found = REGISTRY.of_kind(SIMDGROUP_KIND, features)
    if not found:
        raise LookupError("no simdgroup matrix instruction is registered (isa.REGISTRY)")
    return found[0]


def cooperative_instructions(features: Iterable[str]) -> list[MatrixInstruction]:
    """The cooperative-tensor instructions of a target with these features, in preference order."""
    return REGISTRY.of_kind(COOPERATIVE_TENSOR_KIND, features)


def _factor_pairs(n: int) -> list[tuple[int, int]]:
    """Every (a, b) with a * b == n, a ascending."""
    return [(a, n // a) for a in range(1, n + 1) if n % a == 0]


def legal_partitions(M: int, N: int, num_warps: int, frag_m: int, frag_n: int) -> list[Partition]:
    """Every m_warp x n_warp split of `num_warps` whose simdgroup tiles are whole fragments, fewest
    simdgroups along M first. C counts `M / frag_m` fragment rows and `N / frag_n` fragment columns;
    a split is legal when both divide evenly."""
    if M % frag_m or N % frag_n:
        return []
    fragment_rows, fragment_cols = M // frag_m, N // frag_n
    return [Partition(m, n) for m, n in _factor_pairs(num_warps) if fragment_rows % m == 0 and fragment_cols % n == 0]


def choose_partition(policy: int, M: int, N: int, num_warps: int, frag_m: int, frag_n: int) -> Partition | None:
    """The policy's preferred legal partition, or None when the policy cannot split the tile.

    FullRow puts as many simdgroups as possible along M, FullCol along N. Square wants each
    simdgroup's block of fragments as close to square as it gets (its A and B operand loads then
    balance); of equally square blocks it takes the one with more simdgroups along N (wider
    contiguous C stores).
    """
    if num_warps <= 0:
        return None
    parts = legal_partitions(M, N, num_warps, frag_m, frag_n)
    if not parts:
        return None
    policy = WarpPolicy(int(policy))
    if policy is WarpPolicy.FULL_ROW:
        return parts[-1]  # the most simdgroups along M
    if policy is WarpPolicy.FULL_COL:
        return parts[0]  # the most along N

    def lopsidedness(p: Partition) -> int:
        rows, cols = (M // frag_m) // p.m_warp, (N // frag_n) // p.n_warp  # fragments per simdgroup
        return abs(rows - cols)

    squarest = min(lopsidedness(p) for p in parts)
    return [p for p in parts if lopsidedness(p) == squarest][0]  # ascending m_warp: the widest along N


def _largest_divisor(limit: int, fits: Any) -> int | None:
    """The largest divisor d of `limit` with fits(d), or None."""
    return max((d for d in range(1, limit + 1) if limit % d == 0 and fits(d)), default=None)


def row_partition(M: int, N: int, num_warps: int, frag_m: int, frag_n: int, *, split_n: bool) -> Partition | None:
    """As many simdgroups along M as whole `frag_m`-row tiles allow (a divisor of `num_warps`); the
    other simdgroups split N (split_n, as far as whole `frag_n` columns allow) and replicate the rest.

    Every simdgroup of one M block holds the same rows, so a register fragment with this row split
    can be the A operand of a T.gemm (whose rows it must hold whole) whatever the thread count.
    None when M or N are not whole fragments."""
    if num_warps <= 0 or M % frag_m or N % frag_n:
        return None
    m_warp = _largest_divisor(num_warps, lambda d: M % (d * frag_m) == 0)
    rest = num_warps // m_warp
    n_warp = _largest_divisor(rest, lambda d: N % (d * frag_n) == 0) if split_n else 1
    return Partition(m_warp, n_warp, rest // n_warp)


def copy_compatible_square_partition(M: int, N: int, num_warps: int, frag: int | None = None) -> Partition | None:
    """The square split tilelang's own T.copy lowering assumes for `metal.simdgroup` buffers.

    A `metal.simdgroup` accumulator is written back by tilelang's copy op, which partitions the
    tile itself (fragments ordered row-major per simdgroup, simdgroup id = m + n * m_warp, the split
    whose per-simdgroup fragment grid best matches the tile's aspect ratio). GemmMetal must use
    the same split for such accumulators or the copy would read fragments of another simdgroup.
    """
    frag = simdgroup_instruction().m if frag is None else frag
    best, best_balance = None, float("inf")
    for m in range(1, min(num_warps, M // frag) + 1):
        if num_warps % m:
            continue
        n = num_warps // m
        if n > N // frag or M % (m * frag) or N % (n * frag):
            continue
        balance = abs((M / (m * frag)) / (N / (n * frag)) - M / N)
        if balance < best_balance:
            best, best_balance = Partition(m, n), balance
    return best


def _default_cooperative() -> MatrixInstruction:
    found = cooperative_instructions({METAL4_FEATURE})
    if not found:
        raise LookupError("no cooperative-tensor instruction is registered for metal4 (isa.REGISTRY)")
    return found[0]


def cooperative_tensor_blockers(
    policy: int, M: int, N: int, K: int, num_warps: int, inst: MatrixInstruction | None = None
) -> list[str]:
    """Why CanUseCooperativeTensor is false for `inst` (default: metal4's preferred cooperative
    instruction); empty list when it is true."""
    inst = inst or _default_cooperative()
    reasons = []
    if M % inst.m:
        reasons.append(f"M={M} is not a multiple of {inst.m}")
    if N % inst.n:
        reasons.append(f"N={N} is not a multiple of {inst.n}")
    if K % inst.k:
        reasons.append(f"K={K} is not a multiple of {inst.k}")
    if num_warps <= 0:
        reasons.append("fewer than 32 threads: no whole simdgroup")
    elif not reasons and choose_partition(policy, M, N, num_warps, inst.m, inst.n) is None:
        reasons.append(
            f"{WarpPolicy(int(policy)).name} policy cannot split {num_warps} simdgroups over a {M}x{N} tile "
            f"in whole {inst.m}x{inst.n} fragments"
        )
    return reasons


def can_use_cooperative_tensor(policy: int, M: int, N: int, K: int, num_warps: int, inst: MatrixInstruction | None = None) -> bool:
    """The spec's CanUseCooperativeTensor: a pure shape and warp-policy check."""
    return not cooperative_tensor_blockers(policy, M, N, K, num_warps, inst)


def warp_partition(selection: Selection, c_scope: str, policy: int, M: int, N: int, num_warps: int) -> Partition | None:
    """The m_warp x n_warp split GemmMetal lowers a selection with; None when there is no legal one.

    Cooperative tensors use the split the selection chose; a `metal.simdgroup` accumulator the split
    tilelang's copy assumes; any other simdgroup accumulator the policy's split in whole fragments."""
    inst = selection.instruction
    if selection.kind == COOPERATIVE_TENSOR_KIND:
        return selection.partition
    if c_scope in SIMDGROUP_SCOPES:
        return copy_compatible_square_partition(M, N, num_warps, inst.m)
    return choose_partition(policy, M, N, num_warps, inst.m, inst.n)


def select_inst(
    *,
    c_scope: str,
    M: int,
    N: int,
    K: int,
    threads: int,
    policy: int,
    capabilities: TargetCapabilities,
    fragment_ct: bool = False,
) -> Selection:
    """Stage 1 of path selection (spec 2.1), with the reason for the decision. The registry's
    instructions that require only features the target has (`capabilities.features`) are candidates."""
    have = capabilities.features
    fallback = simdgroup_instruction(have)
    if c_scope in SIMDGROUP_SCOPES:
        return Selection(fallback, f"C is in {c_scope}")
    if c_scope in FRAGMENT_SCOPES and not fragment_ct:
        return Selection(fallback, f"C is in {c_scope}")
    candidates = cooperative_instructions(have)
    if not capabilities.metal4 or not candidates:
        return Selection(fallback, "target has no metal4 key (cooperative tensors need Metal 4); simdgroup fallback")
    if threads % SIMD_WIDTH:
        return Selection(fallback, f"threads={threads} is not a multiple of {SIMD_WIDTH}; simdgroup fallback")
    num_warps = threads // SIMD_WIDTH
    failed = []
    for inst in candidates:  # preference order: the first that fits
        blockers = cooperative_tensor_blockers(policy, M, N, K, num_warps, inst)
        if not blockers:
            part = choose_partition(policy, M, N, num_warps, inst.m, inst.n)
            return Selection(inst, f"metal4 target and CanUseCooperativeTensor({M}, {N}, {K}, warps={num_warps})", part)
        failed.append("; ".join(blockers) if len(candidates) == 1 else f"{inst.name}: " + ", ".join(blockers))
    return Selection(fallback, "CanUseCooperativeTensor is false: " + "; ".join(failed) + "; simdgroup fallback")
