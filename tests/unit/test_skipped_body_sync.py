"""SyncSkippedBodies on hand-built TIR: a barrier on each path that skips a loop or branch holding one,
nothing where the loop provably runs or the control flow differs per thread. (tilelang's IfStmtBinding
splits a frontend `if` per statement, so a uniform `if` around a barrier is built here directly.)"""

from tilelang_metal.host import tir, tvm
from tilelang_metal.transform.barriers import storage_sync, sync_scope
from tilelang_metal.transform.skipped_body_sync import sync_function


def _func(body, *params):
    return tir.PrimFunc(list(params), body)


def _syncs(stmt):
    found = []
    tvm.tirx.stmt_functor.post_order_visit(stmt, lambda n: found.append(sync_scope(n)) if isinstance(n, tir.Evaluate) else None)
    return [s for s in found if s is not None]


def _work(name="w"):
    return tir.Evaluate(tir.call_extern("int32", name))


def test_dynamic_for_gets_a_barrier_for_zero_trips():
    n = tir.Var("n", "int32")
    k = tir.Var("k", "int32")
    loop = tir.For(k, 0, n - 1, tir.ForKind.SERIAL, tir.SeqStmt([storage_sync("shared"), _work()]))
    out = sync_function(_func(tir.SeqStmt([_work("prologue"), loop, _work("epilogue")]), n)).body
    guard = out.seq[1]  # SeqStmt flattens the inserted pair into the sequence
    assert isinstance(guard, tir.IfThenElse) and sync_scope(guard.then_case) == "shared"
    assert tvm.arith.Analyzer().can_prove(guard.condition == (n - 1 <= 0))


def test_constant_for_and_loops_without_barriers_are_unchanged():
    k = tir.Var("k", "int32")
    n = tir.Var("n", "int32")
    constant = tir.For(k, 0, 4, tir.ForKind.SERIAL, tir.SeqStmt([storage_sync("shared"), _work()]))
    plain = tir.For(tir.Var("j", "int32"), 0, n, tir.ForKind.SERIAL, _work())
    body = tir.SeqStmt([constant, plain, storage_sync("shared")])
    assert _syncs(sync_function(_func(body, n)).body) == ["shared", "shared"]


def test_while_gets_a_barrier_when_it_exits_at_once_with_the_widest_scope():
    n = tir.Var("n", "int32")
    loop = tir.While(n > 0, tir.SeqStmt([storage_sync("shared"), _work(), storage_sync("global")]))
    out = sync_function(_func(loop, n)).body
    guard = out.seq[0]
    assert isinstance(guard, tir.IfThenElse) and sync_scope(guard.then_case) == "global"


def test_uniform_if_gets_the_barrier_in_its_other_branch():
    n = tir.Var("n", "int32")
    branch = tir.IfThenElse(n > 0, tir.SeqStmt([storage_sync("shared"), _work()]), None)
    out = sync_function(_func(tir.SeqStmt([_work(), branch, _work()]), n)).body
    assert sync_scope(out.seq[1].else_case) == "shared"


def test_thread_dependent_control_flow_gets_no_barrier():
    tx = tir.Var("tx", "int32")
    n = tir.Var("n", "int32")
    thread = tir.IterVar(tvm.ir.Range(0, 64), tx, 1, "threadIdx.x")  # kThreadIndex
    branch = tir.IfThenElse(tx < 32, tir.SeqStmt([storage_sync("shared"), _work()]), None)
    loop = tir.For(tir.Var("k", "int32"), 0, tx, tir.ForKind.SERIAL, tir.SeqStmt([storage_sync("shared"), _work()]))
    body = tir.AttrStmt(thread, "thread_extent", 64, tir.SeqStmt([branch, loop]))
    assert _syncs(sync_function(_func(body, n)).body) == ["shared", "shared"]
