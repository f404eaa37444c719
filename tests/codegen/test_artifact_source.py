"""The artifact the printer writes agrees with the MSL it prints, for kernels of every kind: the
front door's reading of the hand-written printer shape (emulator/handwritten.py), run on the same
text without the artifact, gives the same records (but for what the text cannot say; the access
marks the printer recorded equal what the front door's text scan finds) and the emulator's rewrite
the same signature and the same C++ in every flavour. The records also say
what the IR said (roles, instructions, limits), and the emulator refuses text that does not match
its records."""

from __future__ import annotations

import dataclasses
import re

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal import kernels as E
from tilelang_metal.codegen import artifact as A
from tilelang_metal.emulator import EmulatorCompileError, compile_kernel, split_kernels
from tilelang_metal.emulator.handwritten import with_artifact
from tilelang_metal.emulator.signature import rewrite


def lower(func, target) -> str:
    return tilelang.lower(func, target=target).kernel_source


def _atomics():
    @T.prim_func
    def main(I: T.Tensor((64,), "int32"), F: T.Tensor((96,), "float32"), H: T.Tensor((64,), "float16")):
        with T.Kernel(2, threads=32):
            tx = T.get_thread_binding()
            S = T.alloc_shared((64,), "float32")
            S[tx] = T.float32(0)
            T.atomic_add(I[tx], 1)
            T.atomic_max(F[tx + 1], 2.0)
            T.atomic_min(S[tx], 1.0)
            T.atomic_add(H[tx], T.float16(1))
            F[tx + 32] = S[tx]

    return main


def _tickets():
    @T.prim_func
    def main(Counter: T.Tensor((1,), "int32"), Tickets: T.Tensor((64,), "int32")):
        with T.Kernel(2, threads=32) as bx:
            tx = T.get_thread_binding()
            Tickets[bx * 32 + tx] = T.atomic_add(Counter[0], 1, return_prev=True)

    return main


def _shuffles():
    @T.prim_func
    def main(A: T.Tensor((64,), "float32"), B: T.Tensor((64,), "float32")):
        with T.Kernel(2, threads=32) as bx:
            tx = T.get_thread_binding()
            v = T.alloc_local((1,), "float32")
            v[0] = A[bx * 32 + tx]
            B[bx * 32 + tx] = T.shfl_xor(v[0], 3) + T.shfl_down(A[bx * 32 + tx], 2, width=8)

    return main


def _two_kernels_with_scalars():
    M = T.dynamic("M")

    @T.prim_func
    def main(A_: T.Tensor((M, 16), "float32"), B: T.Tensor((M, 16), "float32"), alpha: T.float32, shift: T.int32):
        with T.Kernel(T.ceildiv(M, 4), threads=64) as bx:
            for i, j in T.Parallel(4, 16):
                if bx * 4 + i < M:
                    B[bx * 4 + i, j] = A_[bx * 4 + i, j] * alpha
        with T.Kernel(T.ceildiv(M, 8), threads=(16, 8)) as bx:
            tx, ty = T.get_thread_binding(0), T.get_thread_binding(1)
            if bx * 8 + ty < M:
                B[bx * 8 + ty, tx] = B[bx * 8 + ty, tx] + T.cast(shift, "float32")

    return main


def _kernels():
    return {
        "gemm_metal4": lambda: lower(E.gemm_direct_global(128, 128, 64), E.metal4_target()),
        "gemm_shared_metal4": lambda: lower(E.gemm_shared(128, 128, 128), E.metal4_target()),
        "gemm_metal_ragged": lambda: lower(E.gemm_shared(100, 72, 40), E.plain_metal_target()),
        "row_sum": lambda: lower(E.reduce_rows(37, 100, "sum"), E.plain_metal_target()),
        "atomics": lambda: lower(_atomics(), E.plain_metal_target()),
        "tickets": lambda: lower(_tickets(), E.plain_metal_target()),
        "two_kernels_dynamic_scalars": lambda: lower(_two_kernels_with_scalars(), E.plain_metal_target()),
        "softmax_ragged": lambda: lower(E.softmax(5, 37), E.plain_metal_target()),
        "shuffles": lambda: lower(_shuffles(), E.plain_metal_target()),
    }


@pytest.fixture(scope="module")
def sources():
    return {name: make() for name, make in _kernels().items()}


def _without_artifact(text: str) -> str:
    """The same text with the artifact line blanked (line numbers kept): what a hand-written copy is."""
    out, n = re.subn(r"^// tilelang_metal\.artifact .*$", "// (no artifact)", text, flags=re.M)
    assert n == 1
    return out


def _readable(record: A.KernelRecord) -> A.KernelRecord:
    """`record` without what the text cannot say: the static block, the matrix instructions, the
    argument struct's member dtypes, the live ranges and the cooperative tensors (register_budget's)."""
    params = tuple(dataclasses.replace(p, members=()) if isinstance(p, A.ArgStructParam) else p for p in record.params)
    arrays = tuple(dataclasses.replace(t, live=None) for t in record.thread_arrays)
    return dataclasses.replace(record, block=None, instructions=(), params=params, thread_arrays=arrays, cooperative_tensors=())


@pytest.mark.parametrize("name", list(_kernels()))
def test_records_agree_with_the_printed_text(sources, name):
    source = sources[name]
    art = A.artifact_of(source)
    per_kernel = split_kernels(source)
    assert list(per_kernel) == list(art.names)  # one record per kernel, in the printed order
    for kernel_name, text in per_kernel.items():
        record = art.kernel(kernel_name)
        for checked, instrument in ((True, None), (False, None), (True, "counters"), (True, "racecheck")):
            by_record = rewrite(text, checked=checked, instrument=instrument)
            by_text = rewrite(with_artifact(_without_artifact(text)), checked=checked, instrument=instrument)
            assert by_record.record == record and by_text.record == _readable(record), kernel_name
            assert by_record.signature == by_text.signature, kernel_name
            # the same C++ on every line of the kernel (the printer's artifact line is the last; in the
            # hand-written copy its blanked line stays and the front door's record follows it)
            assert by_record.text.splitlines()[:-1] == by_text.text.splitlines()[:-2], kernel_name
        # the records the text parser cannot see: const-ness per the IR, block, instructions
        assert record.max_total_threads is None or record.block is None or record.block[0] * record.block[1] * record.block[2] == record.max_total_threads


def test_records_say_what_the_ir_said(sources):
    def kernel_of(name, kernel=None):
        art = A.artifact_of(sources[name])
        return art.kernel(kernel or art.names[0])

    gemm = kernel_of("gemm_metal4")
    assert [(p.name, p.elem_type, p.is_const) for p in gemm.buffers] == [("A", "half", True), ("B", "half", True), ("C", "half", False)]
    assert gemm.instructions == ("matmul2d_16x32x16",) and gemm.block == (128, 1, 1) and not gemm.threadgroup_arrays
    shared = kernel_of("gemm_shared_metal4")
    assert shared.instructions == ("matmul2d_16x32x16",)
    simd = kernel_of("gemm_metal_ragged")
    assert simd.instructions == ("simdgroup_multiply_accumulate_8x8x8",)
    pool = simd.threadgroup_arrays[0]
    assert len(simd.threadgroup_arrays) == 1 and {v.pool for v in simd.threadgroup_views} == {pool.name}
    assert all(v.elements is not None for v in simd.threadgroup_views)  # each view's own extent
    assert any(t.elem_type == "simdgroup_float8x8" for t in simd.thread_arrays)
    assert kernel_of("row_sum").instructions == ()
    atomics = kernel_of("atomics")
    assert [(a.name, a.elem_type, a.count) for a in atomics.threadgroup_arrays] == [("S", "float", 64)]
    assert all(not p.is_const for p in atomics.buffers)
    assert atomics.atomic_targets == ("F", "H", "I", "S") and atomics.float_atomics and not atomics.atomic_results_used
    tickets = kernel_of("tickets")
    assert tickets.atomic_targets == ("Counter",) and tickets.atomic_results_used and not tickets.float_atomics
    assert kernel_of("row_sum").atomic_targets == () and not kernel_of("row_sum").float_atomics
    two = A.artifact_of(sources["two_kernels_dynamic_scalars"])
    first, second = (two.kernel(n) for n in two.names)
    assert len(two.kernels) == 2 and first.block == (64, 1, 1) and second.block == (16, 8, 1)
    scalars = [(p.name, p.elem_type) for p in first.bound if isinstance(p, A.ScalarParam)]
    assert ("alpha", "float") in scalars and ("M", "int") in scalars
    assert ("shift", "int") in [(p.name, p.elem_type) for p in second.bound if isinstance(p, A.ScalarParam)]


def test_the_emulator_reads_the_records_not_the_text(sources):
    """A record that no longer matches the text (C recorded read-only) is refused, not re-parsed."""
    text = split_kernels(sources["gemm_metal4"])["main_kernel"]
    line = next(ln for ln in text.splitlines() if ln.startswith(A.MARK))
    art = A.decode(line)
    record = art.kernel("main_kernel")
    params = tuple(p if p.name != "C" else A.BufferParam(p.index, p.name, p.elem_type, True) for p in record.params)
    edited = A.KernelArtifact(art.convention, (A.KernelRecord(**{**record.__dict__, "params": params}),))
    with pytest.raises(EmulatorCompileError, match=r"kernel main_kernel: its artifact records parameter C, but the MSL has no `const device half\* __restrict C"):
        rewrite(text.replace(line, edited.line()), checked=True)
    wrong_count = tuple(A.ThreadArrayDecl(t.name, t.elem_type, t.count + 1) for t in record.thread_arrays)
    edited = A.KernelArtifact(art.convention, (A.KernelRecord(**{**record.__dict__, "thread_arrays": wrong_count}),))
    with pytest.raises(EmulatorCompileError, match=r"its artifact records thread array A_frag.*compile_msl"):
        rewrite(text.replace(line, edited.line()), checked=True)


def test_printed_kernel_runs_from_its_artifact(sources):
    """The adapters' route: one kernel of the module, compiled from its records, numerically right."""
    text = split_kernels(sources["row_sum"])["main_kernel"]
    kernel = compile_kernel(text)
    record = A.artifact_of(text).kernel("main_kernel")
    assert kernel.signature.bound == record.bound
    x = torch.randn(37, 100)
    out = torch.full((37,), float("nan"))
    from tilelang_metal.kernels.reduce_rows import row_blocking

    block_rows, _ = row_blocking(37, 100, 128)
    by_name = {"X": x, "Out": out}
    kernel.launch([by_name[p.name] for p in record.bound], (-(-37 // block_rows), 1, 1), record.block)
    torch.testing.assert_close(out, x.sum(-1), rtol=1e-5, atol=1e-4)


def test_launch_is_checked_against_the_records():
    """The adapters hold each kernel's record: a host threadgroup size other than the printed one is
    refused before the launch."""
    import dataclasses

    kernel = tilelang.compile(E.reduce_rows(37, 100, "sum"), out_idx=[-1], target=E.plain_metal_target(), execution_backend="emulator")
    x = torch.randn(37, 100)
    torch.testing.assert_close(kernel(x), x.sum(-1), rtol=1e-5, atol=1e-4)
    call = kernel.adapter.call
    record = call.records["main_kernel"]
    assert record == A.artifact_of(kernel.get_kernel_source()).kernel("main_kernel")
    call.records["main_kernel"] = dataclasses.replace(record, block=(64, 1, 1))
    with pytest.raises(ValueError, match=r"kernel main_kernel: the host launches threadgroups of \(128, 1, 1\) threads, the MSL was printed for \(64, 1, 1\)"):
        kernel(x)


def test_access_marks_say_what_the_printer_printed(sources):
    """The printer's marks (codegen/access_marks.py): each spells an instrumented name at its
    position, the kinds are where the kernels put them, and no sentinel reaches the MSL."""
    from tilelang_metal.codegen.access_marks import SENTINELS

    kinds = {}
    for name, source in sources.items():
        assert not SENTINELS & set(source), name
        for kernel_name, text in split_kernels(source).items():
            record = A.artifact_of(text).kernel(kernel_name)
            lines = text.split("\n")
            opening = next(i for i, ln in enumerate(lines) if ln.startswith(record.opening()))
            names = {p.name for p in record.buffers} | {a.name for a in record.threadgroup_arrays} | {
                v.name for v in record.threadgroup_views} | {t.name for t in record.thread_arrays}
            for line, col, length, kind in record.access_marks:
                assert lines[opening + line][col : col + length] in names, (name, line, col)
            for line, col in record.predicated_blocks:
                assert lines[opening + line][col] == "{" and "threadgroup-uniform" not in lines[opening + line], (name, line)
            kinds[name] = {kind for *_, kind in record.access_marks} | ({"block"} if record.predicated_blocks else set())
    assert {"w", "p", "block"} <= kinds["gemm_metal_ragged"]  # staged edges: masked loads, guarded stores
    assert "s" in kinds["shuffles"]  # a lane's operand of simd_shuffle_*
    assert "w" in kinds["atomics"] and "w" in kinds["tickets"]
    uniform = split_kernels(sources["gemm_metal_ragged"])["main_kernel"]
    assert "// threadgroup-uniform" in uniform  # its interior/edge choice masks nothing: no block recorded there


def _with_record(text: str, **changes) -> str:
    line = next(ln for ln in text.splitlines() if ln.startswith(A.MARK))
    art = A.decode(line)
    (record,) = art.kernels
    return text.replace(line, A.KernelArtifact(art.convention, (dataclasses.replace(record, **changes),)).line())


@pytest.mark.parametrize("shift", [-1, 1])
def test_a_moved_access_mark_is_refused(sources, shift):
    """A mark one column off does not name the access it marks: the instrumented build refuses it."""
    text = split_kernels(sources["gemm_metal_ragged"])["main_kernel"]
    record = A.artifact_of(text).kernel("main_kernel")
    for kind in ("w", "p"):
        i = next(k for k, m in enumerate(record.access_marks) if m[3] == kind)
        marks = list(record.access_marks)
        line, col, length, _ = marks[i]
        marks[i] = (line, col + shift, length, kind)
        for instrument in ("counters", "racecheck"):
            with pytest.raises(EmulatorCompileError, match=r"kernel main_kernel: its artifact marks an access .* the MSL was edited"):
                rewrite(_with_record(text, access_marks=tuple(marks)), checked=True, instrument=instrument)
    line, col = record.predicated_blocks[0]
    moved = ((line, col + shift), *record.predicated_blocks[1:])
    with pytest.raises(EmulatorCompileError, match=r"its artifact marks a predicated block's `\{`"):
        rewrite(_with_record(text, predicated_blocks=moved), checked=True, instrument="counters")
    rewrite(_with_record(text, predicated_blocks=moved), checked=True, instrument="racecheck")  # racecheck opens no scopes


@pytest.mark.slow
def test_the_counts_follow_the_recorded_marks():
    """The counters come from the marks: without them the element stores count as loads and the
    masked loads as unpredicated (two counting builds: slow tier)."""
    from tilelang_metal.emulator import launch_counters

    kernel = tilelang.compile(E.gemm_shared(100, 72, 40), target=E.plain_metal_target(), execution_backend="emulator")
    text = split_kernels(kernel.get_kernel_source())["main_kernel"]
    call = kernel.adapter.call
    args = (torch.randn(100, 40).half(), torch.randn(40, 72).half(), torch.zeros(72), torch.zeros(100, 72))  # A, B, Bias, C
    bound = call.bind(args, kernel.adapter.device, poison=True)
    (launch,) = call.launches
    shape = launch.shape(bound)
    with_marks = launch_counters(text, launch.values(bound), shape.grid, shape.block).total
    unmarked = _with_record(text, access_marks=(), predicated_blocks=())
    without = launch_counters(unmarked, launch.values(bound), shape.grid, shape.block).total
    assert with_marks["predicated_device_loads"] > 0 and without["predicated_device_loads"] == 0
    # the marked element stores count as stores (simdgroup_store counts itself, marks or not)
    assert with_marks["device_store_instructions"] > without["device_store_instructions"]
    assert with_marks != without
