"""Unroll the loops that index matrix accumulators, so every index becomes a constant.

A destination cooperative tensor is an object, not an array: the printer can keep an accumulator
in destination tensors for the whole K loop (storage elision) only when each access names a fixed
tensor and element. Clears, epilogues and stores of a register accumulator come out of tilelang as
short loops over its elements; unrolling them here (bounded, so code size stays sane) turns their
indices into constants. Loops that stay too large leave the accumulator as a thread array, which
the printer handles with copies around each MPP run. Simdgroup-matrix accumulators get the same
treatment: constant indices into a `simdgroup_matrix` array keep it in registers.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from ..core import intrinsics
from .function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from ..host import vocab

MAX_UNROLLED_ITERATIONS = 256


def _matrix_accumulators(body: Any) -> set:
    found = (intrinsics.mma_accumulator(node) for node in find_nodes(body, [vocab.TIRX_CALL]))
    return {var for var in found if var is not None}


def _touches(stmt: Any, targets: set) -> bool:
    return any(node.buffer.data in targets for node in find_nodes(stmt, [vocab.TIRX_BUFFERLOAD, vocab.TIRX_BUFFERSTORE]))


def _unroll(loop: Any, analyzer: Any) -> Any:
    body = []
    for i in range(int(loop.extent.value)):
        value = tir.const(int(loop.min.value) + i, loop.loop_var.dtype)
        copy = tvm.tirx.stmt_functor.substitute(loop.body, {loop.loop_var: value})
        body.append(tvm.tirx.stmt_functor.ir_transform(copy, None, analyzer.simplify, [vocab.TIRX_RAMP, vocab.TIRX_ADD, vocab.TIRX_MUL, vocab.TIRX_FLOORDIV, vocab.TIRX_FLOORMOD, vocab.TIRX_CALL]))
    return tir.SeqStmt(body) if len(body) > 1 else body[0]


def unroll_function(func: Any) -> Any:
    targets = _matrix_accumulators(func.body)
    if not targets:
        return func
    analyzer = tvm.arith.Analyzer()

    def postorder(node: Any) -> Any:
        if not isinstance(node, tir.For):
            return None
        if not (isinstance(node.min, tir.IntImm) and isinstance(node.extent, tir.IntImm)):
            return None
        if int(node.extent.value) > MAX_UNROLLED_ITERATIONS or node.kind == tir.ForKind.THREAD_BINDING:
            return None
        if not _touches(node.body, targets):
            return None
        if _matrix_accumulators(node.body):  # a loop that runs MMAs (the K loop) stays a loop
            return None
        return _unroll(node, analyzer)

    return func.with_body(tvm.tirx.stmt_functor.ir_transform(func.body, None, postorder, [vocab.TIRX_FOR]))


UnrollAccumulatorLoops = per_function_pass("tilelang_metal.UnrollAccumulatorLoops", unroll_function)
