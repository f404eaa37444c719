"""Each T.gemm is planned in one place (tilelang_metal/planning.py): no other module selects an
instruction itself, so GemmMetal, the analyses before layout inference, the register budget, the
autotuner and the cost model cannot disagree on a tiling."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tilelang_metal"


def _calls_of(name: str) -> list[str]:
    """file:line of every call of a function named `name` (plain or as an attribute) in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if called == name:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_select_inst_has_one_caller():
    callers = _calls_of("select_inst")
    outside = [c for c in callers if not c.startswith("planning.py:")]
    assert callers and not outside, "select_inst is called outside planning.plan_gemm (ask the plan instead):\n" + "\n".join(outside)


def _package_imports() -> dict[str, set[str]]:
    """Folder below tilelang_metal -> the other folders its modules import (inside functions too)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).parts
        if len(rel) < 2:
            continue  # root modules are not a folder
        here = rel[:-1]
        targets = graph.setdefault(rel[0], set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                module = base + (tuple(node.module.split(".")) if node.module else ())
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tilelang_metal."):
                module = tuple(node.module.split(".")[1:])
            else:
                continue
            if module and module[0] != rel[0] and (PACKAGE / module[0]).is_dir():
                targets.add(module[0])
    return graph


def test_folders_import_each_other_in_one_direction():
    """The transforms read GemmMetal's records (its guard marks, the edge split's branch); GemmMetal
    reads nothing of the transforms: the decisions that need the whole kernel reach it through the
    plan. No folder reaches back to one that imports it, around any loop."""
    graph = _package_imports()
    assert "gemm" in graph.get("transform", set()), "the check lost its subject: transform no longer imports gemm"

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            folder = todo.pop()
            if folder == goal:
                return True
            if folder not in seen:
                seen.add(folder)
                todo.extend(graph.get(folder, ()))
        return False

    back = [f"{a} imports {b}, and {b} reaches {a}" for a, targets in sorted(graph.items()) for b in sorted(targets) if reaches(b, a)]
    assert not back, "folders that import each other (move what both need to the lower one):\n" + "\n".join(back)


# Context held beside the IR, by module, with why it may stay: nothing of the plugin's passes
# passes decisions to another pass this way (they go on the IR: the plans on the T.gemm calls,
# the decisions and options on the function).
CONTEXT_ALLOWED = {
    "config.py": "current_options(): the lowering's options for tilelang's C++ callbacks (GEMM hooks) and the "
    "codegen hook's printer, set around the pipeline and the codegen only",
    "autoload.py": "the import hook's re-entrancy guard (no lowering)",
}


def test_no_thread_local_or_context_variable_between_passes():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
                if name == "ContextVar" or (name == "local" and owner == "threading"):
                    found.append(("/".join(path.relative_to(PACKAGE).parts), node.lineno))
    outside = [f"{file}:{line}" for file, line in found if file not in CONTEXT_ALLOWED]
    assert not outside, "thread-local / context variables outside the allowed boundary (record on the IR instead):\n" + "\n".join(outside)
    stale = sorted(set(CONTEXT_ALLOWED) - {file for file, _ in found})
    assert not stale, f"CONTEXT_ALLOWED lists modules that hold no such variable any more: {stale}"


def test_register_staging_estimates_the_plan_recorded_on_the_call():
    """MarkRegisterStaging's register estimate reads the plan GemmMetal will lower with (recorded on
    the T.gemm call), not a plan of the call alone: a recorded replicated split (each of 4 simdgroups
    holds the whole 32x32 tile) costs 4x the accumulator registers of the 2x2 split."""
    import tilelang.language as T

    from tilelang_metal.performance import register_budget
    from tilelang_metal.target.capabilities import capabilities_of
    from tilelang_metal.host import Target, gemm_call_fields, tir, tvm, vocab, with_call_annotations
    from tilelang_metal.core.ir_attrs import find_nodes
    from tilelang_metal.planning import GEMM_PLAN_ANNOTATION, encode_plan, plan_gemm
    from tilelang_metal.selection import Partition
    from tilelang_metal.transform.register_staging import loop_registers

    @T.prim_func
    def kernel(A: T.Tensor((32, 64), "float16"), B: T.Tensor((64, 32), "float16"), C: T.Tensor((32, 32), "float32")):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((32, 16), "float16")
            b = T.alloc_shared((16, 32), "float16")
            c = T.alloc_fragment((32, 32), "float32")
            T.clear(c)
            for k in T.Pipelined(4, num_stages=2):
                T.copy(A[0, k * 16], a)
                T.copy(B[k * 16, 0], b)
                T.gemm(a, b, c)
            T.copy(c, C)

    capabilities = capabilities_of(Target("metal"))
    loop = next(f for f in find_nodes(kernel.body, [vocab.TIRX_FOR]) if find_nodes(f.body, [vocab.TIRX_CALL]))
    call = next(c for c in find_nodes(loop.body, [vocab.TIRX_CALL]) if gemm_call_fields(c) is not None)
    alone = plan_gemm(c_scope="local.fragment", M=32, N=32, K=16, threads=128, policy=0, capabilities=capabilities, fragment_ct=True,
                      a_scope="shared")
    replicated = Partition(1, 1, 4)
    recorded = encode_plan(type(alone)(alone.selection, replicated, alone.dataflow, 128))
    annotated = tvm.tirx.stmt_functor.ir_transform(
        loop, None, lambda node: with_call_annotations(node, {GEMM_PLAN_ANNOTATION: recorded}) if node.same_as(call) else None, [vocab.TIRX_CALL])
    assert isinstance(annotated, tir.For)

    def accumulator(part: Partition) -> int:
        return register_budget.gemm_registers(M=32, N=32, instruction=alone.instruction, partition=part, a_dtype="float16",
                                              b_dtype="float16", acc_dtype="float32", shared=True).accumulator

    assert alone.partition != replicated and accumulator(replicated) == 4 * accumulator(alone.partition)
    assert loop_registers(loop, 128, capabilities, True).accumulator == accumulator(alone.partition)
    assert loop_registers(annotated, 128, capabilities, True).accumulator == accumulator(replicated)


# Options whose decision the plan carries (planning.PLAN_FLAGS, set by transform/gemm_plans.py):
# GemmMetal and its tiling read the flag on the recorded plan, never the option.
PLANNED_OPTIONS = {"k_prefetch", "register_staging", "staging_bypass"}


def test_gemm_lowering_reads_no_option_the_plan_decides():
    found = []
    for path in sorted((PACKAGE / "gemm").rglob("*.py")):
        tree = ast.parse(path.read_text())
        holders = set()  # names bound to current_options()

        def is_options(node: ast.AST) -> bool:
            if isinstance(node, ast.Name):
                return node.id in holders
            return isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "current_options"

        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and is_options(node.value):
                holders.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(tree):
            read = isinstance(node, ast.Attribute) and node.attr in PLANNED_OPTIONS and is_options(node.value)
            setting = isinstance(node, ast.Attribute) and node.attr.removesuffix("_mode") in PLANNED_OPTIONS and getattr(node.value, "id", "") == "config"
            if read or setting:
                found.append(f"gemm/{path.relative_to(PACKAGE / 'gemm')}:{node.lineno} reads {node.attr}")
    assert not found, "GemmMetal decides what the recorded plan carries (read the GemmPlan's flag instead):\n" + "\n".join(found)


def test_recorded_plans_carry_k_prefetch_register_staging_and_the_bypass(monkeypatch):
    """The flags GemmMetal lowers with come from the plan recorded on the call, and the MSL follows them."""
    import tilelang

    from tilelang_metal import kernels as E
    from tilelang_metal.gemm import recorded_plans
    from tilelang_metal.host import resolve_target
    from tilelang_metal.host.passes import pass_context

    def lower(func, target, **env):
        for name, value in env.items():
            monkeypatch.setenv("TILELANG_METAL_" + name, value)
        with recorded_plans() as plans, pass_context(), resolve_target(target) as t:
            source = tilelang.lower(func, target=t).kernel_source
        return source, plans

    direct = E.gemm_direct_global(64, 64, 64, 64, 64, threads=128)  # 4 K steps of 16 on metal4
    source, plans = lower(direct, E.metal4_target(), K_PREFETCH="1")
    assert plans and all(p.k_prefetch and p.flags() == ["k_prefetch"] for p in plans) and "_next[" in source
    source, plans = lower(direct, E.metal4_target(), K_PREFETCH="0")
    assert plans and not any(p.k_prefetch for p in plans) and "_next[" not in source

    staged = E.gemm_staged(64, 64, 64, 64, 64, 16, threads=128, num_stages=2)
    source, plans = lower(staged, E.plain_metal_target(), REGISTER_STAGING="1")
    assert any(p.register_staging for p in plans) and "staged_float16" in source
    source, plans = lower(staged, E.plain_metal_target(), REGISTER_STAGING="0")
    assert plans and not any(p.register_staging for p in plans) and "staged_" not in source

    shared = E.gemm_shared(64, 64, 64, 64, 64, 32, num_stages=2)
    source, plans = lower(shared, E.metal4_target(), STAGING_BYPASS="1")
    assert plans and all(p.staging_bypassed and p.dataflow == "direct_global" for p in plans) and "threadgroup_barrier" not in source
    source, plans = lower(shared, E.metal4_target(), STAGING_BYPASS="0")
    assert plans and not any(p.staging_bypassed for p in plans) and "threadgroup_barrier" in source
