"""register_budget.kernel_registers: the register estimate of a printed kernel from its artifact record
(thread arrays with their live lines, cooperative tensors), agreeing with the GEMM plan estimate where
both apply, and threadgroups_per_core limited by threads, registers and threadgroup memory in turn.
Lowering only: no emulator build."""

from __future__ import annotations

import pytest
import tilelang
import tilelang.language as T

from tilelang_metal.tuning import autotune
from tilelang_metal import kernels as E
from tilelang_metal.tuning.autotune import DIRECT_GLOBAL, SHARED, GemmConfig
from tilelang_metal.codegen import artifact as A
from tilelang_metal.codegen.liveness import live_ranges
from tilelang_metal.gemm import GemmPlan, recorded_plans
from tilelang_metal.host import resolve_target
from tilelang_metal.host.passes import pass_context
from tilelang_metal.kernels.matmul import choice_target, matmul_config, matmul_program
from tilelang_metal.performance.register_budget import (MAX_THREADS_PER_CORE, THREADGROUP_MEMORY_PER_CORE, estimate_registers,
                                            kernel_occupancy, kernel_registers, msl_registers, threadgroups_per_core)


@T.prim_func
def _known(A_: T.Tensor((512,), "float32"), B: T.Tensor((512,), "float32")):
    with T.Kernel(1, threads=128):
        tx = T.get_thread_binding()
        frag = T.alloc_fragment((512,), "float32")  # 512 over 128 threads: 4 floats each
        acc = T.alloc_local((8,), "float32")  # 8 floats
        h = T.alloc_local((16,), "float16")  # 16 halves: 8 registers
        for i in T.Parallel(512):
            frag[i] = A_[i] * 2.0
        for i in T.serial(8):
            acc[i] = A_[tx * 4 + i % 4]
        for i in T.serial(16):
            h[i] = T.cast(acc[i % 8], "float16")
        for i in T.Parallel(512):  # acc is dead here: the epilogue's cast array does not add to the peak
            B[i] = frag[i] + T.cast(h[15], "float32")


def test_a_kernel_with_known_arrays():
    record = A.artifact_of(tilelang.lower(_known, target=E.plain_metal_target()).kernel_source).kernels[0]
    arrays = {t.name: t for t in record.thread_arrays}
    assert (arrays["frag"].count, arrays["acc"].count, arrays["h"].count) == (4, 8, 16)
    regs = kernel_registers(record)
    assert regs.arrays == 4 + 8 + 8 and set(regs.peak) == {"frag", "acc", "h"}
    assert sum(msl_registers(t.elem_type, t.count) for t in record.thread_arrays) > regs.arrays  # not all live at once
    assert regs.addresses == 5 + 2 and regs.total == 20 + 7 + 2 and regs.fits
    occupancy = kernel_occupancy(record)[1]  # 29 registers: 1024 threads per core, 8 threadgroups of 128
    assert (occupancy.threadgroups, occupancy.limited_by) == (MAX_THREADS_PER_CORE // 128, "threads")
    # hand-written MSL has no live ranges: every array counts as live everywhere
    unranged = A.KernelRecord(**{**record.__dict__, "thread_arrays": tuple(A.ThreadArrayDecl(t.name, t.elem_type, t.count)
                                                                             for t in record.thread_arrays)})
    assert kernel_registers(unranged).arrays == sum(msl_registers(t.elem_type, t.count) for t in record.thread_arrays)


@pytest.mark.parametrize("target_name", ["metal4", "metal"])
@pytest.mark.parametrize("path", [DIRECT_GLOBAL, SHARED])
def test_a_gemm_record_agrees_with_the_plan_estimate(target_name, path):
    """K = 64 with block_k 32: the pipelined loop has no steady state, so no staging array either way;
    metal4's accumulator lives in cooperative tensors (the record's cooperative_tensors)."""
    cfg = GemmConfig(path, 64, 128, 128, 32, 2) if path == SHARED else GemmConfig(path, 64, 128, 128)
    target = resolve_target(E.metal4_target() if target_name == "metal4" else E.plain_metal_target())
    with recorded_plans() as plans, pass_context(), target:
        source = tilelang.lower(autotune.build(cfg, 64, 128, 64), target=target).kernel_source
    record = A.artifact_of(source).kernels[0]
    plan_estimate = estimate_registers(next(p for p in plans if isinstance(p, GemmPlan)))
    regs = kernel_registers(record)
    assert regs.arrays == plan_estimate.accumulator + plan_estimate.operands, regs
    assert (regs.addresses, regs.total) == (plan_estimate.addresses, plan_estimate.total), regs
    if target_name == "metal4":
        (ct,) = record.cooperative_tensors
        assert ct.count * ct.elements == 64 and ct.live is not None  # 64x128 over 2x2 simdgroups of 32 lanes: 64 floats each


def test_threadgroups_per_core_is_limited_by_each_resource_in_turn():
    few = threadgroups_per_core(256, 0, 40)  # 80 half-registers: the table's 1024 threads
    assert (few.threadgroups, few.limited_by) == (MAX_THREADS_PER_CORE // 256, "threads")
    many = threadgroups_per_core(256, 0, 100)  # 200 half-registers: 512 threads per core
    assert (many.threadgroups, many.limited_by) == (2, "registers")
    memory = threadgroups_per_core(64, 24 * 1024, 40)  # 16 by threads, 2 by ~60 KB of threadgroup memory
    assert (memory.threadgroups, memory.limited_by) == (THREADGROUP_MEMORY_PER_CORE // (24 * 1024), "threadgroup memory")
    alone = threadgroups_per_core(1024, 40 * 1024, 200)  # fits nothing: still one threadgroup, spilling
    assert alone.threadgroups == 1 and "limited by" in alone.describe()


def test_the_performance_doc_example_runs(capsys):
    """docs/performance.md, "Registers and occupancy": its python block runs as written."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "performance.md").read_text()
    section = text.split("## Registers and occupancy", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    exec(compile(block, "performance.md", "exec"), {})
    assert "registers per thread" in capsys.readouterr().out


def test_if_else_arms_do_not_add_up():
    """The arms of an if / else run one or the other: an array not needed after it is live only
    where its arm uses it (from the arm's start when it held a value before the if); one read after
    the if stays live through both arms."""
    lines = ["kernel {",
             "  float a[4];", "  float b[4];", "  float c[4];", "  float d[4];",
             "  a[0] = 0;", "  d[0] = 0;",
             "  if (x) {  // threadgroup-uniform",
             "    b[0] = a[0];", "    b[1] = b[0];",
             "  } else {  // threadgroup-uniform",
             "    c[0] = 1;", "    c[1] = c[0] + a[1];",
             "  }",
             "  out = d[0];",
             "}"]
    ranges = live_ranges(lines, {name: name for name in "abcd"})
    assert ranges == {"a": ((5, 7), (8, 8), (11, 12)), "b": ((8, 9),), "c": ((11, 12),), "d": ((6, 14),)}, ranges


def test_an_array_written_first_in_each_step_is_not_carried_around_the_loop():
    """copy_runs' run registers: filled in both arms of an if / else, stored after it, in each K step;
    they hold a value only there (before: to the end of the loop, 8 more registers for a GEMM that
    copies A and B in runs). An array read in the loop before it is written there (q), or written in
    an if without else (c), stays live to the end of the loop."""
    lines = ["kernel {",
             "  half r[8];", "  half q[8];", "  half c[8];",
             "  q[0] = 1;",
             "  for (int ko = 0; ko < 4; ++ko) {",
             "    if (x) {",
             "      *(thread tlm_run16<half>*)(r + (0)) = *(const device tlm_run16<half>*)(A + (ko * 8));",
             "    } else {",
             "      for (int v = 0; v < 8; ++v) {",
             "        r[v] = (v < ko) ? A[v] : half(0.0f);",
             "      }",
             "    }",
             "    *(threadgroup tlm_run16<half>*)(S + (0)) = *(thread tlm_run16<half>*)(r + (0));",
             "    if (y) {",
             "      c[0] = 2;",
             "    }",
             "    out[ko] = q[0] + c[0];",
             "    mma();",
             "  }",
             "}"]
    ranges = live_ranges(lines, {name: name for name in "rqc"})
    assert ranges == {"r": ((7, 13),), "q": ((4, 19),), "c": ((15, 19),)}, ranges


def test_ragged_gemm_estimate_is_the_aligned_one():
    """4000^3 runs the interior / edge split: both arms declare the K-step operands and the
    epilogue's cast array. With one live range per array spanning both arms the estimate was
    102 registers against 89 at 4096^3 (the same 64x64x16 tile on an M2)."""
    def estimate(n):
        choice = matmul_config(n, n, n, "float16", target=E.plain_metal_target(), chip="M2")
        with pass_context():
            source = tilelang.lower(matmul_program(choice), target=choice_target(choice)).kernel_source
        (record,) = A.artifact_of(source).kernels
        return kernel_registers(record)

    aligned, ragged = estimate(4096), estimate(4000)
    assert ragged.total == aligned.total, (ragged.describe(), aligned.describe())
