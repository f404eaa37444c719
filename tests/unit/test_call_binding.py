"""Binding logic of the calling convention on hand-built TIR (no lowering, no compiler): argument
checks and messages, symbolic sizes, scalars, outputs, host expressions, and launches taken from
host call sites (order, per-kernel buffers, dropped parameters)."""

import pytest
import torch

from tilelang_metal.host import tir, tvm
from tilelang_metal.execution.binding import CallSignature, Device, poisoned
from tilelang_metal.execution.host_expr import UnboundVariable, compile_expr
from tilelang_metal.execution.launch import kernel_launches

CPU = Device("cpu", "emulator")


def prim_func(params, name="f"):
    """A PrimFunc with `params`: ("A", shape, dtype) buffers or tir.Var scalars."""
    handles, buffer_map, buffers = [], {}, {}
    for p in params:
        if isinstance(p, tir.Var):
            handles.append(p)
            continue
        pname, shape, dtype = p
        handle = tir.Var(f"{pname}_handle", "handle")
        buffer = tir.decl_buffer(shape, dtype, pname)
        handles.append(handle)
        buffer_map[handle] = buffer
        buffers[pname] = buffer
    func = tir.PrimFunc(handles, tir.Evaluate(0), buffer_map=buffer_map).with_attr("global_symbol", name)
    return func, buffers


def allocate(shape, dtype):
    return poisoned(shape, dtype, "cpu")


# ----------------------------------------------------------------------------- argument checks


def test_static_shapes_dtype_count_and_device_are_checked():
    func, _ = prim_func([("A", (64, 32), "float32"), ("B", (64, 32), "float16")])
    sig = CallSignature(func, [])
    a, b = torch.zeros(64, 32), torch.zeros(64, 32, dtype=torch.float16)
    bound = sig.bind((a, b), CPU, allocate)
    assert bound.values == [a, b] and bound.results() is None
    cases = [
        ((torch.zeros(64, 33), b), ValueError, "A: expected shape (64, 32), got (64, 33)"),
        ((a, torch.zeros(64, 32)), TypeError, "B: expected dtype float16, got float32"),
        ((a,), TypeError, "kernel f takes 2 arguments (A, B), got 1"),
        ((a, b, a), TypeError, "kernel f takes 2 arguments (A, B), got 3"),
        ((a, torch.zeros(32, 64, dtype=torch.float16).t()), ValueError, "B: expected a contiguous tensor, got strides (1, 64)"),
        ((a, 1.0), TypeError, "B: expected a torch.Tensor of shape (64, 32), got float"),
        ((torch.zeros(64, 32, 1), b), ValueError, "A: expected 2 dims (64, 32), got shape (64, 32, 1)"),
    ]
    for args, error, message in cases:
        with pytest.raises(error) as err:
            sig.bind(args, CPU, allocate)
        assert str(err.value).startswith(message), str(err.value)
    with pytest.raises(ValueError, match=r"^A: expected a tensor on mps \(execution_backend='torch'\), got device cpu$"):
        sig.bind((a, b), Device("mps", "torch"), allocate)


def test_symbolic_dims_bind_from_the_first_tensor_and_must_agree():
    M, N = tir.Var("M", "int32"), tir.Var("N", "int32")
    func, _ = prim_func([("A", (M, N), "float32"), ("B", (N,), "float32"), ("C", (M,), "float32")])
    sig = CallSignature(func, [2])
    bound = sig.bind((torch.zeros(5, 7), torch.zeros(7)), CPU, allocate)
    assert bound.values[2].shape == (5,) and torch.isnan(bound.values[2]).all()
    assert bound.env[sig.slot_of(M)] == 5 and bound.env[sig.slot_of(N)] == 7
    with pytest.raises(ValueError, match=r"^N: A has 7 but B has 8; both are N and must be equal$"):
        sig.bind((torch.zeros(5, 7), torch.zeros(8)), CPU, allocate)


def test_a_size_repeated_in_one_tensor_names_the_axes():
    N = tir.Var("N", "int32")
    func, _ = prim_func([("S", (N, N), "float32")])
    sig = CallSignature(func, [])
    sig.bind((torch.zeros(3, 3),), CPU, allocate)
    with pytest.raises(ValueError, match=r"^N: S.shape\[0\] has 3 but S.shape\[1\] has 4; both are N and must be equal$"):
        sig.bind((torch.zeros(3, 4),), CPU, allocate)


def test_derived_dims_are_evaluated_and_checked():
    M = tir.Var("M", "int32")
    func, _ = prim_func([("A", (M, 4), "float32"), ("B", (M * 2, tir.floordiv(M + 3, 4)), "float32")])
    sig = CallSignature(func, [])
    sig.bind((torch.zeros(9, 4), torch.zeros(18, 3)), CPU, allocate)
    with pytest.raises(ValueError, match=r"^B: expected shape \(18, 3\) \(\(M \* 2, \(M \+ 3\) // 4\) with M=9\), got \(18, 4\)$"):
        sig.bind((torch.zeros(9, 4), torch.zeros(18, 4)), CPU, allocate)


def test_a_size_no_input_gives_is_refused_at_construction():
    M, N = tir.Var("M", "int32"), tir.Var("N", "int32")
    func, _ = prim_func([("A", (M,), "float32"), ("C", (M, N), "float32")])
    with pytest.raises(ValueError, match=r"^output C of shape \(M, N\): no input gives N"):
        CallSignature(func, [1])
    func, _ = prim_func([("A", (M * 2,), "float32")])
    with pytest.raises(ValueError, match=r"^input A of shape \(M \* 2,\): no input gives M"):
        CallSignature(func, [])


def test_scalars_are_checked_for_their_dtype():
    alpha, n, flag, big = tir.Var("alpha", "float32"), tir.Var("n", "int32"), tir.Var("flag", "bool"), tir.Var("big", "uint32")
    func, _ = prim_func([alpha, n, flag, big])
    sig = CallSignature(func, [])
    assert sig.bind((2, -3, True, 2**32 - 1), CPU, allocate).values == [2.0, -3, True, 2**32 - 1]
    assert sig.bind((torch.tensor(0.5), torch.tensor(4), 0, 0), CPU, allocate).values == [0.5, 4, False, 0]
    cases = [
        ((1.0, 2.5, True, 0), "n: expected an integer for int32, got float 2.5"),
        ((1.0, True, True, 0), "n: expected an integer for int32, got bool True"),
        ((1.0, 2**31, True, 0), "n: 2147483648 does not fit in int32"),
        ((1.0, 0, True, -1), "big: -1 does not fit in uint32"),
        ((1.0, 0, 2, 0), "flag: expected a bool, got 2"),
        (("1.0", 0, True, 0), "alpha: expected a number for float32, got str '1.0'"),
        ((torch.ones(2), 0, True, 0), "alpha: expected a float32 scalar, got a tensor of shape (2,)"),
    ]
    for args, message in cases:
        with pytest.raises((TypeError, ValueError)) as err:
            sig.bind(args, CPU, allocate)
        assert str(err.value).startswith(message), str(err.value)


def test_a_scalar_that_is_also_a_size_must_agree_with_the_tensors():
    n = tir.Var("n", "int32")
    func, _ = prim_func([n, ("A", (n,), "float32")])
    sig = CallSignature(func, [])
    sig.bind((4, torch.zeros(4)), CPU, allocate)
    with pytest.raises(ValueError, match=r"^n: argument n is 4 but A has 5; both are n and must be equal$"):
        sig.bind((4, torch.zeros(5)), CPU, allocate)


def test_outputs_come_back_in_out_idx_order():
    func, _ = prim_func([("A", (2,), "float32"), ("B", (3,), "int32"), ("C", (4,), "float16")])
    bound = CallSignature(func, [2, 1]).bind((torch.zeros(2),), CPU, allocate)
    c, b = bound.results()
    assert c.shape == (4,) and c.dtype == torch.float16 and b.shape == (3,) and b.dtype == torch.int32


def test_out_idx_must_name_tensors():
    func, _ = prim_func([("A", (4,), "float32"), tir.Var("alpha", "float32")])
    with pytest.raises(ValueError, match=r"^out_idx names alpha, a scalar parameter; outputs must be tensors$"):
        CallSignature(func, [1])


def test_outputs_are_poisoned_per_dtype():
    assert torch.isnan(poisoned([3], torch.float16, "cpu")).all()
    assert (poisoned([3], torch.int32, "cpu") == -1).all()
    assert (poisoned([3], torch.uint8, "cpu") == 255).all()
    assert (poisoned([3], torch.uint32, "cpu").to(torch.int64) == 2**32 - 1).all()
    assert poisoned([3], torch.bool, "cpu").all()


def test_constant_declared_strides_take_exactly_that_layout():
    handle = tir.Var("A_handle", "handle")
    buffer = tir.decl_buffer((4, 4), "float32", "A", strides=(1, 4))
    func = tir.PrimFunc([handle], tir.Evaluate(0), buffer_map={handle: buffer})
    sig = CallSignature(func, [])
    transposed = torch.zeros(4, 4).t()
    assert sig.bind((transposed,), CPU, allocate).values == [transposed]  # taken as it is, never copied
    with pytest.raises(ValueError, match=r"^A: expected strides \(1, 4\), got \(4, 1\) for shape \(4, 4\)$"):
        sig.bind((torch.zeros(4, 4),), CPU, allocate)


def test_symbolic_strides_bind_from_the_tensor_and_must_agree():
    ld = tir.Var("ld", "int32")
    buffers, handles = {}, []
    for name in ("A", "B"):
        handles.append(tir.Var(f"{name}_handle", "handle"))
        buffers[handles[-1]] = tir.decl_buffer((3, 5), "float32", name, strides=(ld, 1))
    sig = CallSignature(tir.PrimFunc(handles, tir.Evaluate(0), buffer_map=buffers), [])
    a = torch.zeros(3, 12)[:, 4:9]  # row pitch 12, data 16 bytes in (aligned)
    bound = sig.bind((a, torch.zeros(3, 12)[:, :5]), CPU, allocate)
    assert bound.env[sig.slot_of(ld)] == 12 and bound.values[0] is a
    with pytest.raises(ValueError, match=r"^ld: A.stride\(0\) is 12 but B.stride\(0\) is 5; both are ld and must be equal$"):
        sig.bind((a, torch.zeros(3, 5)), CPU, allocate)
    # A written parameter (no launches recorded: all count as written) is never copied or realigned.
    with pytest.raises(ValueError, match=r"^A: data starts 4 bytes past a 16-byte boundary \(storage offset 1\);"):
        sig.bind((torch.zeros(3, 12)[:, 1:6], a), CPU, allocate)
    with pytest.raises(ValueError, match=r"^A: elements share memory \(strides \(0, 1\) for shape \(3, 5\)\)"):
        sig.bind((torch.zeros(5).expand(3, 5), a), CPU, allocate)


# -------------------------------------------------------------------------- host expressions


def test_host_expressions_follow_tir_integer_semantics():
    x = tir.Var("x", "int32")
    slots = {"x": 0}

    def ev(expr, value):
        return compile_expr(expr, lambda v: slots.get(str(v.name)))([value])

    for value in (-7, -1, 0, 5, 37):
        assert ev(tir.floordiv(x + 3, 4), value) == (value + 3) // 4
        assert ev(tir.floormod(x, 4), value) == value % 4
        assert ev(tir.truncdiv(x, 4), value) == int(value / 4)
        assert ev(tir.truncmod(x, 4), value) == value - 4 * int(value / 4)
        assert ev(tir.Select(x < 3, x * 2, tir.max(x, 10)), value) == (value * 2 if value < 3 else max(value, 10))
        assert ev(tir.min(x, 8) - 1, value) == min(value, 8) - 1
    assert ev(tir.Cast("int8", x), 200) == -56  # wraps like the device type
    assert ev(tir.Cast("float32", x) * tir.FloatImm("float32", 0.5), 3) == 1.5
    with pytest.raises(UnboundVariable):
        compile_expr(tir.Var("y", "int32") + 1, lambda v: None)


# --------------------------------------------------------------------- launches from call sites


def _device_func(name, params, extents):
    launch_tags = list(extents)
    func = tir.PrimFunc(params, tir.Evaluate(0))
    return func.with_attr({"global_symbol": name, "tirx.kernel_launch_params": launch_tags})


def _module(funcs: dict):
    return tvm.IRModule({name: f for name, f in funcs.items()})


def test_launches_follow_host_order_and_each_call_sites_arguments():
    M = tir.Var("M", "int32")
    scale = tir.Var("scale", "float32")
    func, buf = prim_func([scale, ("X", (M, 8), "float32"), ("Unused", (M,), "float32"), ("Out", (M,), "float32"), ("Part", (2, M), "float32")])
    sig = CallSignature(func, [3, 4])

    def ptr(dtype, pname):
        return tir.Var(pname, tvm.ir.PointerType(tvm.ir.PrimType(dtype), "global"))

    # Device kernels named so that name order != launch order; each takes its buffers in its own order.
    combine = _device_func("a_combine", [ptr("float32", "Part"), ptr("float32", "Out"), tir.Var("M", "int32"), tir.Var("scale", "float32")], ["blockIdx.x", "threadIdx.x"])
    partial = _device_func("z_partial", [ptr("float32", "Part"), ptr("float32", "X"), tir.Var("M", "int32")], ["blockIdx.x", "blockIdx.y", "threadIdx.x"])
    device_mod = _module({"a_combine": combine, "z_partial": partial})
    host_body = tir.SeqStmt(
        [
            tir.Evaluate(tir.call_packed("z_partial", buf["Part"].data, buf["X"].data, M, 2, tir.floordiv(M + 31, 32), 32)),
            tir.Evaluate(tir.call_packed("a_combine", buf["Part"].data, buf["Out"].data, M, scale, tir.floordiv(M + 15, 16), 16)),
        ]
    )
    host_mod = _module({"f": tir.PrimFunc([], host_body)})
    first, second = kernel_launches(sig, host_mod, device_mod)
    assert (first.kernel_name, second.kernel_name) == ("z_partial", "a_combine")
    assert [a.position for a in first.arguments] == [4, 1, None]
    assert [a.position for a in second.arguments] == [4, 3, None, None]
    x = torch.randn(40, 8)
    bound = sig.bind((0.5, x, torch.zeros(40)), CPU, allocate)
    assert first.shape(bound).grid == (2, 2, 1) and first.shape(bound).block == (32, 1, 1)
    assert second.shape(bound).grid == (3, 1, 1)
    values = second.values(bound)
    assert values[0] is bound.values[4] and values[1] is bound.values[3] and values[2:] == [40, 0.5]
    empty = sig.bind((0.5, torch.zeros(0, 8), torch.zeros(0)), CPU, allocate)
    assert first.shape(empty).empty and second.shape(empty).empty


def test_the_device_functions_thread_extent_wins_over_the_call_site():
    """Plugin passes (BlockSwizzle) rewrite the kernel's `thread_extent` after the host/device
    split; its expressions use the kernel's own parameters, mapped back to the call's values."""
    M = tir.Var("M", "int32")
    func, buf = prim_func([("A", (M,), "float32")])
    sig = CallSignature(func, [])
    a_ptr = tir.Var("A", tvm.ir.PointerType(tvm.ir.PrimType("float32"), "global"))
    m_param = tir.Var("m_in_kernel", "int32")  # a different var than the host's M
    kernel = _device_func("k", [a_ptr, m_param], ["blockIdx.x", "threadIdx.x"])
    kernel = kernel.with_attr("thread_extent", {"blockIdx.x": tir.floordiv(m_param + 7, 8) * 2, "threadIdx.x": tir.IntImm("int32", 64)})
    host = tir.Evaluate(tir.call_packed("k", buf["A"].data, M, tir.floordiv(M + 7, 8), 64))
    (launch,) = kernel_launches(sig, _module({"f": tir.PrimFunc([], host)}), _module({"k": kernel}))
    shape = launch.shape(sig.bind((torch.zeros(17),), CPU, allocate))
    assert shape.grid == (6, 1, 1) and shape.block == (64, 1, 1)


def test_a_negative_grid_is_an_error_and_an_empty_one_is_skipped():
    n = tir.Var("n", "int32")
    func, buf = prim_func([("A", (64,), "float32"), n])
    sig = CallSignature(func, [])
    a_ptr = tir.Var("A", tvm.ir.PointerType(tvm.ir.PrimType("float32"), "global"))
    kernel = _device_func("k", [a_ptr, tir.Var("n", "int32")], ["blockIdx.x", "threadIdx.x"])
    host = tir.Evaluate(tir.call_packed("k", buf["A"].data, n, tir.floordiv(n + 31, 32), 32))
    (launch,) = kernel_launches(sig, _module({"f": tir.PrimFunc([], host)}), _module({"k": kernel}))
    a = torch.zeros(64)
    assert launch.shape(sig.bind((a, 33), CPU, allocate)).grid == (2, 1, 1)
    assert launch.shape(sig.bind((a, 0), CPU, allocate)).empty
    with pytest.raises(ValueError, match=r"^kernel k: launch grid \(-1, 1, 1\) x threadgroup \(32, 1, 1\) has a negative extent"):
        launch.shape(sig.bind((a, -40), CPU, allocate))


def test_a_kernel_buffer_that_is_no_parameter_is_refused():
    func, buf = prim_func([("A", (4,), "float32")])
    sig = CallSignature(func, [])
    stray = tir.Var("stray", tvm.ir.PointerType(tvm.ir.PrimType("float32"), "global"))
    device_mod = _module({"k": _device_func("k", [stray], ["threadIdx.x"])})
    host_mod = _module({"f": tir.PrimFunc([], tir.Evaluate(tir.call_packed("k", stray, 4)))})
    with pytest.raises(ValueError, match=r"^kernel k: buffer argument stray \(`stray`\) is not the data of a parameter of f"):
        kernel_launches(sig, host_mod, device_mod)


def test_memory_overlap_agrees_with_enumerating_every_byte():
    """The aliasing check (`__restrict`) against brute force on random views of one storage, of three
    element sizes: strides 0 (broadcast), interleaved, overlapping windows."""
    import itertools
    import random

    from tilelang_metal.execution.binding import _overlap, _overlaps_itself

    def addresses(t):
        size = t.element_size()
        out = set()
        for index in itertools.product(*[range(n) for n in t.shape]):
            start = (t.storage_offset() + sum(i * st for i, st in zip(index, t.stride()))) * size
            out.update(range(start, start + size))
        return out

    storage = torch.zeros(200)
    sources = [storage, storage.view(torch.float16), storage.view(torch.uint8)]
    rng = random.Random(7)

    def view():
        src = rng.choice(sources)
        shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
        strides = [rng.choice([0, 1, 2, 3, 4, 6, 8, 9]) for _ in shape]
        reach = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
        return src.as_strided(shape, strides, rng.randint(0, src.numel() - reach))

    for _ in range(1500):
        a, b = view(), view()
        assert _overlap(a, b) == bool(addresses(a) & addresses(b)), (a.shape, a.stride(), b.shape, b.stride())
        assert _overlaps_itself(a) == (len(addresses(a)) != a.numel() * a.element_size())
    assert not _overlap(torch.zeros(4), torch.zeros(4))  # separate storages


def test_a_host_allocated_buffer_is_a_workspace_sized_from_the_symbolic_sizes():
    from tilelang_metal.execution.launch import workspace_plan

    M = tir.Var("M", "int32")
    func, buf = prim_func([("A", (M,), "float32")])
    sig = CallSignature(func, [])
    work = tir.decl_buffer((M * 3,), "int32", "Work")
    a_ptr = tir.Var("A", tvm.ir.PointerType(tvm.ir.PrimType("float32"), "global"))
    w_ptr = tir.Var("Work", tvm.ir.PointerType(tvm.ir.PrimType("int32"), "global"))
    device_mod = _module({"k": _device_func("k", [w_ptr, a_ptr], ["threadIdx.x"])})
    host = tir.SeqStmt([tir.AllocBuffer(work), tir.Evaluate(tir.call_packed("k", work.data, buf["A"].data, 4))])
    host_mod = _module({"f": tir.PrimFunc([], host)})
    (plan,) = workspace_plan(sig, host_mod)
    (launch,) = kernel_launches(sig, host_mod, device_mod)
    assert [(a.position, a.workspace, a.dtype) for a in launch.arguments] == [(None, 0, "int32"), (0, None, "float32")]
    bound = sig.bind((torch.zeros(5),), CPU, allocate)
    assert plan.name == "Work" and plan.shape(bound.env) == [15]
    bound.workspaces = [torch.zeros(15, dtype=torch.int32)]
    assert launch.values(bound)[0] is bound.workspaces[0]

    n = tir.Var("n", "int32")  # a size no parameter gives
    stray = tir.decl_buffer((n,), "float32", "Stray")
    loose = _module({"f": tir.PrimFunc([], tir.SeqStmt([tir.AllocBuffer(stray), tir.Evaluate(0)]))})
    with pytest.raises(ValueError, match=r"^workspace Stray \(T.alloc_global\) of shape \(n,\) uses n, which is neither"):
        workspace_plan(sig, loose)
