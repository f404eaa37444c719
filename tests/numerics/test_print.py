"""T.print in the emulator: TileLang's CUDA debug-print lines on stdout, one whole line per printing
thread and value, threadgroups in linear order even with several workers (docs/emulator.md,
"T.print"); refused by the torch and mlx backends, which cannot show Metal shader logs.

The expected lines are built from the inputs with the format of tilelang's CUDA `debug.h`.
"""

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.emulator import racecheck

pytestmark = pytest.mark.plain_schedule  # racecheck under its own test below; the tier's two schedules would print twice
from tilelang_metal.errors import CodegenError

GROUPS, THREADS = 5, 4


def where(block: int, thread: int) -> str:
    return f"BlockIdx=({block}, 0, 0), ThreadIdx=({thread}, 0, 0)"


def var_line(msg: str, block: int, thread: int, dtype: str, value: str) -> str:
    return f"msg='{msg}' {where(block, thread)}: dtype={dtype} value={value}"


def buffer_line(msg: str, block: int, thread: int, name: str, index: int, dtype: str, value: str) -> str:
    return f"msg='{msg}' {where(block, thread)}: buffer={name}, index={index}, dtype={dtype} value={value}"


def printed(capfd) -> list[str]:
    out = capfd.readouterr().out
    assert out.endswith("\n")
    return out.splitlines()


@pytest.fixture(autouse=True)
def parallel_workers(monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_WORKERS", "3")  # threadgroups finish out of order


def compile_emulated(func):
    return tilelang.compile(func, out_idx=[-1], target="metal", execution_backend="emulator")


@functools.lru_cache(maxsize=None)
def scalar_prints(dtype: str):
    """Every thread prints its element, thread 0 its block index; msg-only line per thread."""

    @T.prim_func
    def show(A: T.Tensor((GROUPS * THREADS,), dtype), B: T.Tensor((GROUPS * THREADS,), dtype)):
        with T.Kernel(GROUPS, threads=THREADS) as bx:
            tx = T.get_thread_binding()
            T.print(A[bx * THREADS + tx], msg="a")
            if tx == 0:
                T.print(bx, msg='block "q"')
            B[bx * THREADS + tx] = A[bx * THREADS + tx]

    return compile_emulated(show)


def expected_scalar_lines(a: torch.Tensor, dtype_name: str, fmt) -> list[str]:
    lines = []
    for b in range(GROUPS):
        for t in range(THREADS):
            lines.append(var_line("a", b, t, dtype_name, fmt(a[b * THREADS + t].item())))
            if t == 0:
                lines.append(var_line('block "q"', b, 0, "int", str(b)))
    return lines


def test_scalar_print_of_every_thread_in_threadgroup_order(capfd):
    kernel = scalar_prints("float32")
    a = torch.tensor([1.5, -2.25, 1e-7, 3e9, float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 7.0]
                     + [i / 3 for i in range(10)])
    capfd.readouterr()
    assert torch.equal(kernel(a).nan_to_num(), a.nan_to_num())
    # fibers run until they block: thread 0 prints both of its lines before thread 1 starts
    assert printed(capfd) == expected_scalar_lines(a, "float", lambda v: "%f" % v)


@pytest.mark.parametrize("dtype, name", [("int32", "int"), ("float16", "half"), ("bfloat16", "bfloat"), ("uint8", "uchar")])
def test_scalar_print_names_the_msl_type(capfd, dtype, name):
    kernel = scalar_prints(dtype)
    a = (torch.arange(GROUPS * THREADS) * 37 - 100).to(getattr(torch, dtype))
    capfd.readouterr()
    kernel(a)
    fmt = (lambda v: str(int(v))) if not a.is_floating_point() else (lambda v: "%f" % v)
    assert printed(capfd) == expected_scalar_lines(a, name, fmt)


def test_printing_kernel_passes_racecheck_and_prints_once_per_schedule(capfd):
    kernel = scalar_prints("int32")
    a = torch.arange(GROUPS * THREADS, dtype=torch.int32)
    capfd.readouterr()
    assert torch.equal(racecheck(kernel, a, seeds=(0, 1)), a)
    lines = printed(capfd)
    one_run = expected_scalar_lines(a, "int", lambda v: str(int(v)))
    # racecheck runs each schedule on its own copies and shuffles threadgroups and threads: every
    # schedule prints the same lines, whole, in some order
    assert len(lines) == 2 * len(one_run) and sorted(lines) == sorted(one_run * 2)


@functools.lru_cache(maxsize=None)
def fragment_prints():
    @T.prim_func
    def frag(A: T.Tensor((2, 16), "float32"), B: T.Tensor((2, 16), "float32")):
        with T.Kernel(2, threads=8) as bx:
            acc = T.alloc_fragment((16,), "float32")
            for i in T.Parallel(16):
                acc[i] = A[bx, i] * 2.0
            for i in T.Parallel(16):
                T.print(acc[i], msg="acc")
            T.print(acc)
            for i in T.Parallel(16):
                B[bx, i] = acc[i]

    return compile_emulated(frag)


def test_fragment_elements_and_the_whole_fragment(capfd):
    kernel = fragment_prints()
    a = torch.randn(2, 16)
    capfd.readouterr()
    torch.testing.assert_close(kernel(a), a * 2.0, rtol=0, atol=0)
    lines = printed(capfd)
    expected = []
    for b in range(2):
        # each thread prints the elements the fragment layout gave it, in the layout's order
        expected += [var_line("acc", b, t, "float", "%f" % (a[b, i].item() * 2.0)) for t in range(8) for i in (2 * t, 2 * t + 1)]
        # T.print(fragment) copies it to threadgroup memory; thread 0 prints every element
        expected += [buffer_line("buffer<acc, float32>", b, 0, "acc", i, "float", "%f" % (a[b, i].item() * 2.0)) for i in range(16)]
    assert lines == expected


@functools.lru_cache(maxsize=None)
def buffer_prints():
    @T.prim_func
    def bufs(A: T.Tensor((3, 2, 3), "float16"), B: T.Tensor((3, 6), "float16")):
        with T.Kernel(3, threads=6) as bx:
            tx = T.get_thread_binding()
            S = T.alloc_shared((2, 3), "float16")
            L = T.alloc_local((2,), "int32")
            S[tx // 3, tx % 3] = A[bx, tx // 3, tx % 3] + 1.0
            L[0] = tx
            L[1] = tx * bx
            T.print(S, msg="tile")
            if tx == 5:
                T.print(L)
            T.print(msg="done")
            B[bx, tx] = S[tx // 3, tx % 3]

    return compile_emulated(bufs)


def test_threadgroup_and_thread_buffers_and_messages(capfd):
    kernel = buffer_prints()
    a = torch.randn(3, 2, 3).half()
    capfd.readouterr()
    assert torch.equal(racecheck(kernel, a, seeds=(0,)), (a + 1).reshape(3, 6))
    capfd.readouterr()  # the racecheck run's lines are checked above; this run keeps the normal schedule
    kernel(a)
    lines = printed(capfd)
    expected = []
    for b in range(3):
        flat = (a[b] + 1).flatten()
        # every thread runs to the barrier before T.print(S); the last to arrive (5) goes on first,
        # then the others in arrival order, and thread 0 prints the tile
        expected += [buffer_line("buffer<L, int32>", b, 5, "L", i, "int", str(v)) for i, v in enumerate((5, 5 * b))]
        expected += [f"msg='done' {where(b, 5)}"]
        expected += [buffer_line("tile", b, 0, "S", i, "half", "%f" % flat[i].item()) for i in range(6)]
        expected += [f"msg='done' {where(b, t)}" for t in range(5)]
    assert lines == expected


def test_long_messages_and_control_characters_stay_one_line(capfd):
    msg = "x" * 700 + "\t\\n"

    @T.prim_func
    def long_msg(A: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=1):
            T.print(msg=msg)
            A[0] = 1.0

    kernel = compile_emulated(long_msg)
    capfd.readouterr()
    kernel()
    assert printed(capfd) == [f"msg='{msg}' {where(0, 0)}"]


def test_a_vector_value_is_refused_with_one_line():
    @T.prim_func
    def vec(A: T.Tensor((4,), "float32"), B: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=1):
            T.print(A[T.Ramp(0, 1, 4)])
            B[0] = 0.0

    with pytest.raises(CodegenError) as info:
        compile_emulated(vec)
    message = str(info.value)
    assert "\n" not in message.strip() and "float32x4" in message and "print each lane" in message


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_mac_backends_refuse_print_instead_of_dropping_it(monkeypatch, backend):
    from tilelang_metal.execution import backends

    monkeypatch.setattr(backends, "mps_available", lambda: True)
    monkeypatch.setattr(backends, "mlx_available", lambda: True)

    @T.prim_func
    def show(A: T.Tensor((4,), "float32"), B: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=4) as bx:
            tx = T.get_thread_binding()
            T.print(A[tx])
            B[tx] = A[tx]

    with pytest.raises(ValueError) as info:
        tilelang.compile(show, out_idx=[-1], target="metal", execution_backend=backend)
    message = str(info.value)
    assert "\n" not in message and f'execution_backend="{backend}"' in message and 'execution_backend="emulator"' in message


def test_the_emulator_knows_the_names_tilelang_prints_with():
    from tilelang_metal.host import DEBUG_PRINT_EXTERNS
    from tilelang_metal.emulator.driver import PRINT_FUNCTIONS

    assert PRINT_FUNCTIONS == DEBUG_PRINT_EXTERNS
