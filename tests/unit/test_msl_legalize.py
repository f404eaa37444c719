"""The late MSL legalization (tilelang_metal/legalize/) on hand-built TIR: each pass takes one
decision the printer used to take, and the printer spells the result one node at a time."""

from __future__ import annotations

import pytest

from tilelang_metal.core import intrinsics
from tilelang_metal.codegen.printer import print_kernel
from tilelang_metal.config import LoweringOptions, lowering
from tilelang_metal.errors import CodegenError
from tilelang_metal.host import tir, tvm
from tilelang_metal.core.ir_attrs import THREAD_ARRAY_ALIGN_ATTR
from tilelang_metal.legalize.vector_split import split_wide_vectors
from tilelang_metal.legalize.wide_copies import use_wide_copies
from tilelang_metal.transform.integer_bits import fold_constant_bits

THREADS = 64


def pointer(name: str, dtype: str):
    return tir.Var(name, tvm.ir.PointerType(tvm.ir.PrimType(dtype)))


def kernel(make_body, dtype: str = "float16"):
    """A one-dimensional kernel over device buffers A (read) and B (written) of `dtype`."""
    a_ptr, b_ptr = pointer("A", dtype), pointer("B", dtype)
    a = tir.decl_buffer((4096,), dtype, "A", data=a_ptr)
    b = tir.decl_buffer((4096,), dtype, "B", data=b_ptr)
    tx = tir.Var("tx", "int32")
    launch = tir.IterVar(tvm.ir.Range(0, THREADS), tx, tir.IterVar.ThreadIndex, "threadIdx.x")
    return tir.PrimFunc([a_ptr, b_ptr], tir.AttrStmt(launch, "thread_extent", THREADS, make_body(a, b, tx)))


def copy(dst, src, dst_base, src_base, lanes):
    return tir.BufferStore(dst, tir.BufferLoad(src, [tir.Ramp(src_base, 1, lanes)]), [tir.Ramp(dst_base, 1, lanes)])


def calls(func) -> list:
    found = []
    tvm.tirx.stmt_functor.post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, tir.Call) else None)
    return [intrinsics.match_copy16(c) for c in found if intrinsics.match_copy16(c) is not None]


def stores(func) -> list:
    found = []
    tvm.tirx.stmt_functor.post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, tir.BufferStore) else None)
    return found


def msl(func) -> str:
    with lowering(LoweringOptions()):  # the printer reads the lowering's options (default settings here)
        return print_kernel(func, "k")[0]


def test_aligned_16_byte_copy_becomes_one_uint4_move():
    func = use_wide_copies(kernel(lambda a, b, tx: copy(b, a, tx * 8, tx * 8, 8)))
    (moved,) = calls(func)
    assert moved.dst.name == "B" and moved.src.name == "A" and not stores(func)
    line = "*(device uint4*)(B + ((((int)threadIdx.x) * 8))) = *(device uint4*)(A + ((((int)threadIdx.x) * 8)));"
    assert line in msl(func)


@pytest.mark.parametrize("offset", [1, 3, 4, 7])
def test_unprovable_alignment_keeps_the_store_and_splits_it(offset):
    """An offset that is not a multiple of 8 halves: no uint4 move; two half4 stores of the right lanes."""
    func = use_wide_copies(kernel(lambda a, b, tx: copy(b, a, tx * 8 + offset, tx * 8, 8)))
    assert calls(func) == []
    parts = stores(split_wide_vectors(func))
    assert len(parts) == 2
    analyzer = tvm.arith.Analyzer()
    for start, part in zip((0, 4), parts):
        assert str(part.value.dtype) == "float16x4"
        assert analyzer.can_prove(part.indices[0].base - part.value.indices[0].base == offset)
        assert analyzer.can_prove(part.value.indices[0].base % 8 == start)
    assert "uint4" not in msl(split_wide_vectors(func))


def test_one_unaligned_end_is_enough_to_refuse():
    func = use_wide_copies(kernel(lambda a, b, tx: copy(b, a, tx * 8, tx * 8 + 2, 8)))
    assert calls(func) == [] and len(stores(func)) == 1


def test_alignment_through_binds_and_shifts():
    """A Bind printed before the store (a prelude offset) and LowerIntrin's `x << 3` both count."""

    def body(a, b, tx):
        off = tir.Var("__off0", "int32")
        return tir.SeqStmt([tir.Bind(off, tir.shift_left(tx, 3)), copy(b, a, off + 64, off, 8)])

    assert len(calls(use_wide_copies(kernel(body)))) == 1


def test_runtime_offset_is_not_provable():
    n = tir.Var("n", "int32")

    def body(a, b, tx):
        return copy(b, a, tx * 8 + n, tx * 8, 8)

    func = kernel(body)
    func = tir.PrimFunc([*func.params, n], func.body)
    assert calls(use_wide_copies(func)) == []


def test_sixteen_byte_lanes_and_narrow_vectors():
    """int8x16 is a 16-byte copy too; a float32x4 is a Metal vector already and stays a store."""
    assert len(calls(use_wide_copies(kernel(lambda a, b, tx: copy(b, a, tx * 16, tx * 16, 16), "int8")))) == 1
    assert calls(use_wide_copies(kernel(lambda a, b, tx: copy(b, a, tx * 4, tx * 4, 4), "float32"))) == []


def test_thread_arrays_need_their_alignas_record():
    def body_with(annotations):
        def body(a, b, tx):
            local = tir.decl_buffer((8,), "float16", "R", scope="local")
            return tir.SeqStmt([tir.AllocBuffer(local, annotations), copy(local, a, 0, tx * 8, 8), copy(b, local, tx * 8, 0, 8)])

        return body

    assert len(calls(use_wide_copies(kernel(body_with({THREAD_ARRAY_ALIGN_ATTR: 16}))))) == 2
    plain = use_wide_copies(kernel(body_with(None)))
    assert calls(plain) == [] and len(stores(plain)) == 2


def run_loop(dst, src, dst_base, src_base, count, kind=None):
    """for v in [0, count): dst[dst_base + v] = src[src_base + v], element by element."""
    v = tir.Var("v", "int32")
    body = tir.BufferStore(dst, tir.BufferLoad(src, [src_base + v]), [dst_base + v])
    return tir.For(v, 0, count, kind or tir.ForKind.UNROLLED, body)


def test_a_16_byte_run_loop_becomes_one_move():
    """An element loop over 16 bytes (what tilelang leaves when it cannot prove a vector alignment):
    one uint4 move where both ends are 16-byte aligned, one packed struct copy otherwise."""
    aligned = use_wide_copies(kernel(lambda a, b, tx: run_loop(b, a, tx * 8, tx * 8, 8)))
    (moved,) = calls(aligned)
    assert moved.aligned and not stores(aligned)
    packed = use_wide_copies(kernel(lambda a, b, tx: run_loop(b, a, tx * 8 + 1, tx * 4097, 8, tir.ForKind.SERIAL)))
    (moved,) = calls(packed)
    assert not moved.aligned and (moved.dst.name, moved.src.name, moved.dtype) == ("B", "A", "float16")
    with lowering(LoweringOptions()):
        text, _, _, support, _ = print_kernel(packed, "k")
    assert support == {"tlm_run16": "template <typename T> struct tlm_run16 { T elements[16 / sizeof(T)]; };\n"}
    assert "*(device tlm_run16<half>*)(B + ((((int)threadIdx.x) * 8) + 1)) = *(device tlm_run16<half>*)(A + ((((int)threadIdx.x) * 4097)));" in text, text
    floats = use_wide_copies(kernel(lambda a, b, tx: run_loop(b, a, tx * 4 + 3, tx * 4, 4), "float32"))
    assert [c.aligned for c in calls(floats)] == [False]


def test_run_loops_that_are_no_plain_16_byte_copy_stay_loops():
    """8 bytes, a stride of 2, a copy within one buffer (it may overlap: element order matters)."""
    v = tir.Var("v", "int32")

    def strided(a, b, tx):
        return tir.For(v, 0, 8, tir.ForKind.UNROLLED, tir.BufferStore(b, tir.BufferLoad(a, [tx * 16 + v * 2]), [tx * 8 + v]))

    for body in (lambda a, b, tx: run_loop(b, a, tx * 4, tx * 4, 4), strided, lambda a, b, tx: run_loop(b, b, tx * 8 + 1, tx * 8, 8)):
        func = use_wide_copies(kernel(body))
        assert calls(func) == [] and len(stores(func)) == 1


def test_split_keeps_expression_lanes():
    """8-lane arithmetic (a load times a broadcast, cast) splits into lanes 0-3 and 4-7 of each operand."""

    def body(a, b, tx):
        value = tir.Cast("float16x8", tir.Cast("float32x8", tir.BufferLoad(a, [tir.Ramp(tx * 8, 1, 8)])) * tir.Broadcast(tir.const(2.0, "float32"), 8))
        return tir.BufferStore(b, value, [tir.Ramp(tx * 8 + 1, 1, 8)])

    parts = stores(split_wide_vectors(kernel(body)))
    assert [str(p.value.dtype) for p in parts] == ["float16x4", "float16x4"]
    text = msl(split_wide_vectors(kernel(body)))
    assert text.count("half4") >= 2 and "half8" not in text


def test_split_refuses_lane_counts_metal_cannot_spell():
    func = kernel(lambda a, b, tx: copy(b, a, tx * 6, tx * 6, 6))
    with pytest.raises(CodegenError, match="cannot split a 6-lane store to B"):
        split_wide_vectors(func)


def test_printer_refuses_an_unsplit_wide_store():
    with pytest.raises(CodegenError, match="reached the printer unsplit"):
        msl(kernel(lambda a, b, tx: copy(b, a, tx * 8 + 1, tx * 8, 8)))


# ---------------------------------------------------------------- shuffle widths
def shuffle_kernel(make_value):
    """O[tx] = make_value(A[tx], tx) on float32 buffers."""

    def body(a, b, tx):
        return tir.BufferStore(b, make_value(tir.BufferLoad(a, [tx]), tx), [tx])

    return kernel(body, "float32")


def shfl(op: str, value, operand, width):
    return tir.Call("float32", tvm.ir.Op.get(op), [tir.const(0xFFFFFFFF, "uint32"), value, operand, width])


def externs(func) -> list:
    found = []
    tvm.tirx.stmt_functor.post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, tir.Call) else None)
    return found


def test_full_width_shuffles_become_plain_metal_shuffles():
    from tilelang_metal.legalize.segmented_shuffles import lower_shuffle_widths

    func = lower_shuffle_widths(shuffle_kernel(lambda v, tx: shfl("tl.shfl_xor_sync", v, 1, 32)))
    found = [intrinsics.match_simd_shuffle(c) for c in externs(func)]
    assert [f[0] for f in found if f] == ["xor"]
    assert not any(intrinsics.match_select(c) for c in externs(func))
    assert "lane_id" not in str(func.attrs or {})  # a whole-simdgroup shuffle reads no lane id
    assert "simd_shuffle_xor(" in msl(func) and "select(" not in msl(func)


@pytest.mark.parametrize("op,kind", [("tl.shfl_xor_sync", "xor"), ("tl.shfl_down_sync", "down"), ("tl.shfl_up_sync", "up")])
def test_narrow_shuffles_run_on_every_lane_and_select_the_result(op, kind):
    """The shuffle sits inside `select` (both operands evaluated), never under a branch or `?:`."""
    from tilelang_metal.core.ir_attrs import LANE_ID_ATTR
    from tilelang_metal.legalize.segmented_shuffles import lower_shuffle_widths

    func = lower_shuffle_widths(shuffle_kernel(lambda v, tx: shfl(op, v, 2, 8)))
    (select,) = [s for s in map(intrinsics.match_select, externs(func)) if s]
    condition, if_true, if_false = select
    assert intrinsics.match_simd_shuffle(if_true)[0] == kind and isinstance(if_false, tir.BufferLoad)
    assert LANE_ID_ATTR in func.attrs  # the segment arithmetic reads the lane id the printer binds
    text = msl(func)
    assert "select(" in text and "?" not in text and "__metal_get_thread_index_in_simdgroup" in text


def test_indexed_shuffles_wrap_the_source_lane():
    from tilelang_metal.legalize.segmented_shuffles import lower_shuffle_widths

    whole = lower_shuffle_widths(shuffle_kernel(lambda v, tx: shfl("tl.shfl_sync", v, tx * 7, 32)))
    assert "simd_shuffle(" in msl(whole) and "& 31" in msl(whole)
    narrow = lower_shuffle_widths(shuffle_kernel(lambda v, tx: shfl("tl.shfl_sync", v, 13, 8)))
    # lane 13 % 8 of the caller's own segment; an indexed read is always in its segment (no select)
    assert "(((int)__lane) & (~7)) + 5)" in msl(narrow) and "select(" not in msl(narrow)


@pytest.mark.parametrize("width", [0, 12, 64])
def test_bad_shuffle_widths_are_refused(width):
    from tilelang_metal.legalize.segmented_shuffles import lower_shuffle_widths

    with pytest.raises(CodegenError, match=f"tl.shfl_xor_sync: shuffle width {width} is not a power of two"):
        lower_shuffle_widths(shuffle_kernel(lambda v, tx: shfl("tl.shfl_xor_sync", v, 1, width)))


def test_64_bit_shuffles_are_refused():
    from tilelang_metal.legalize.segmented_shuffles import lower_shuffle_widths

    def body(a, b, tx):
        return tir.Evaluate(shfl("tl.shfl_xor_sync", tir.Cast("float64", tir.BufferLoad(a, [tx])), 1, 32))

    with pytest.raises(CodegenError, match="float64: Metal simd shuffles take 8- to 32-bit values"):
        lower_shuffle_widths(kernel(body, "float32"))


# ---------------------------------------------------------------- atomics
def atomic_call(op: str, dst, index, *rest, dtype="handle"):
    return tir.Call(dtype, tvm.ir.Op.get(op), [tir.address_of(tir.BufferLoad(dst, [index])), *rest])


RELAXED = tir.const(0, "int32")


def lowered_atomics(dtype: str, make_call, readonly=False):
    from tilelang_metal.legalize.element_atomics import lower_atomics

    func = kernel(lambda a, b, tx: tir.Evaluate(make_call(a, b, tx)), dtype)
    if readonly:
        func = func.with_attr("tl.readonly_param_indices", [1])
    func = lower_atomics(func)
    return func, [a for a in map(intrinsics.match_atomic, externs(func)) if a is not None]


@pytest.mark.parametrize(
    "dtype,op,form",
    [
        ("int32", "tl.atomic_max_elem_op", intrinsics.NATIVE),
        ("float32", "tl.atomic_add_elem_op", intrinsics.NATIVE),
        ("float32", "tl.atomic_max_elem_op", intrinsics.CAS_FLOAT),
        ("float32", "tl.atomic_min_ret_elem_op", intrinsics.CAS_FLOAT),
        ("float16", "tl.atomic_add_elem_op", intrinsics.CAS_HALF),
        ("bfloat16", "tl.atomic_max_elem_op", intrinsics.CAS_HALF),
    ],
)
def test_each_element_atomic_gets_its_metal_form(dtype, op, form):
    func, (atomic,) = lowered_atomics(dtype, lambda a, b, tx: atomic_call(op, b, tx * 3 + 1, tir.BufferLoad(a, [tx]), RELAXED))
    assert atomic.form == form and atomic.var.same_as(func.params[1])
    analyzer = tvm.arith.Analyzer()
    if form == intrinsics.CAS_HALF:  # the word starts at the even element; the element sits 16 bits up when odd
        tx = func.body.node.var
        for lane in range(4):
            i = lane * 3 + 1

            def at(e):
                return analyzer.simplify(fold_constant_bits(analyzer.simplify(tvm.tirx.stmt_functor.substitute(e, {tx: lane})))).value

            assert at(atomic.index) == i - (i & 1) and at(atomic.select) == (i & 1) * 16
    text = msl(func)
    assert ("__tlm_atomic_" in text) == (form != intrinsics.NATIVE)
    assert ("memory_order_relaxed" in text) == (form == intrinsics.NATIVE)  # the helpers carry their own


def test_vector_atomics_are_one_per_lane_or_one_word_update():
    add2 = "tl.atomic_addx2_elem_op"
    # float32: no vector atomics in Metal; a statement becomes one atomic statement per lane, in order
    func, atomics = lowered_atomics("float32", lambda a, b, tx: atomic_call(add2, b, tx * 2, tir.BufferLoad(a, [tir.Ramp(tx * 2, 1, 2)])))
    assert [x.form for x in atomics] == [intrinsics.NATIVE] * 2
    assert tvm.arith.Analyzer().can_prove(atomics[1].index - atomics[0].index == 1)
    # float16: both lanes in one compare-and-swap on their word(s); `select` is 1 at an odd first element
    func, (atomic,) = lowered_atomics("float16", lambda a, b, tx: atomic_call(add2, b, tx * 2 + 1, tir.BufferLoad(a, [tir.Ramp(tx * 2, 1, 2)])))
    assert atomic.form == intrinsics.CAS_HALF_VECTOR and str(atomic.value.dtype) == "float16x2"
    assert "__tlm_atomic_add_half2(" in msl(func)


def test_returned_vector_atomics_keep_their_lanes_together():
    def make(a, b, tx):
        return atomic_call("tl.atomic_addx2_ret_elem_op", b, tx * 2, tir.BufferLoad(a, [tir.Ramp(tx * 2, 1, 2)]), dtype="float32x2")

    func, atomics = lowered_atomics("float32", make)
    assert len(atomics) == 2 and "float2(atomic_fetch_add_explicit(" in msl(func)


@pytest.mark.parametrize(
    "dtype,make,readonly,message",
    [
        ("float32", lambda a, b, tx: atomic_call("tl.atomic_add_elem_op", b, tx, tir.BufferLoad(a, [tx]), tir.const(5, "int32")), False, "memory_order='seq_cst'"),
        ("float32", lambda a, b, tx: atomic_call("tl.atomic_add_elem_op", b, tx, tir.BufferLoad(a, [tx]), RELAXED), True, "B is read-only in this kernel"),
        ("int8", lambda a, b, tx: atomic_call("tl.atomic_add_elem_op", b, tx, tir.BufferLoad(a, [tx]), RELAXED), False, "on int8 \\(B\\): Metal atomics take int32"),
        ("float16", lambda a, b, tx: atomic_call("tl.atomic_load_elem_op", b, tx, RELAXED, dtype="float16"), False, "atomic loads / stores take int32, uint32 or float32"),
    ],
)
def test_atomics_metal_lacks_are_refused_in_one_line(dtype, make, readonly, message):
    with pytest.raises(CodegenError, match=message):
        lowered_atomics(dtype, make, readonly)


def test_atomics_on_thread_memory_are_refused():
    from tilelang_metal.legalize.element_atomics import lower_atomics

    def body(a, b, tx):
        local = tir.decl_buffer((4,), "float32", "R", scope="local")
        return tir.SeqStmt([tir.AllocBuffer(local), tir.Evaluate(atomic_call("tl.atomic_add_elem_op", local, 0, tir.const(1.0, "float32"), RELAXED))])

    with pytest.raises(CodegenError, match="Metal atomics need device or threadgroup memory"):
        lower_atomics(kernel(body, "float32"))
