"""The plugin's kernels and MLX's, side by side, for one fixed set of problems (issue: MLX reference).

For each problem and chip class, the plugin's kernel (the kernels package: `kernels.matmul`'s choice,
flash attention, flash decoding, row softmax and reductions, `kernels.quantized_matmul`) and the kernel MLX's own dispatch picks
(NAX kernels against the plugin's metal4 kernels on the "nax" class, steel kernels against plain metal
on the "steel" class; MLX's host logic for 0.32.x in tests/mlx_reference/mlx_*.py) run in the emulator,
are checked against torch, and their counters are scaled to the full problem from proxies
(count_models.py). Writes compare_mlx.csv and compare_mlx.md into --out; the plugin rows carry the
ratio of each count per FLOP to MLX's.

    python benchmark/compare_mlx.py --dry-run --out /tmp/cmp          # anywhere (the emulator)
    python benchmark/compare_mlx.py --dry-run --out /tmp/cmp --only gemm-nn-fp16-4096

Counts are the emulator's (docs/emulator.md, Counters; MLX's memory traffic is traced from its own
loads and stores, Foreign MSL, with clang only: n/a with g++): device_bytes is loads + stores,
threadgroup_bytes loads + stores, barriers are threadgroup barriers, matrix_ops every matrix
instruction (an 8x8x8 simdgroup op and a 16x32x16 matmul2d count one each). On a Mac the same
problems are timed with bench_gemm.py / bench_attention.py; this script compares structure only.
registers_estimate and threadgroups_per_core are estimates for each side's heaviest kernel (most
registers: a split's first pass, not its combine kernel; the
plugin's from its kernels' artifact records, MLX's per kernel family from its template parameters,
benchmark/mlx_registers.py; docs/performance.md, "Registers and occupancy"); their `_vs_mlx` is the
plain ratio. The exit status is 1 when a row is not verified against torch, or with --check-bounds
(CI's run over the problem set) when a plugin row misses one of issue 35's count bounds against MLX
(`count_bounds_missed`, printed as COUNT BOUND MISSED).
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("TILELANG_DISABLE_CACHE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "mlx_reference"))

import count_models  # noqa: E402
from compare_common import (CLASSES, PROBLEMS, PROXY_BATCH, STEEL_CLASSES, ErrorTracker, Measured, Problem, attention_mask,  # noqa: E402
                            gemm_case, quantized_operands, torch_dtype)

# device_load_ops, device_store_ops, narrow_device_loads: source-level (one per access as spelled);
# the GPU-level columns after them count what a GPU would issue (docs/emulator.md, "GPU-level counts").
SOURCE_LEVEL = ("device_load_ops", "device_store_ops", "narrow_device_loads")
GPU_LEVEL = ("load_instructions", "store_instructions", "unique_device_load_bytes", "device_transactions",
             "threadgroup_replays", "memory_barriers", "lockstep_barriers")
# estimates per kernel, not counts per problem: their `_vs_mlx` is the plain ratio, not per FLOP
OCCUPANCY_COLUMNS = ("registers_estimate", "threadgroups_per_core")
COLUMNS = ("problem", "chip_class", "implementation", "config", "verified", "max_rel_err", "flops", "device_bytes",
           *SOURCE_LEVEL, "threadgroup_bytes", "barriers", "matrix_ops", *GPU_LEVEL, *OCCUPANCY_COLUMNS)
RATIO_COLUMNS = ("device_bytes", "device_load_ops", "narrow_device_loads", "threadgroup_bytes", "barriers", "matrix_ops",
                 *GPU_LEVEL)
# ---------------------------------------------------------------- the emulator's counts


def summarize(total: dict[str, float]) -> dict[str, float | None]:
    """The table's columns from one launch's (or a model's) counter totals; None where the counts do
    not include that kind (MLX's memory traffic when the emulator builds with g++: foreign kernels'
    accesses are traced only with clang, `foreign.memory_counts_unavailable()`)."""
    from tilelang_metal.emulator.instrument import MATRIX_COUNTER_NAMES

    def pair(a: str, b: str) -> float | None:
        return total[a] + total[b] if a in total and b in total else None

    return {
        "device_bytes": pair("device_load_bytes", "device_store_bytes"),
        "device_load_ops": total.get("device_load_instructions"),
        "device_store_ops": total.get("device_store_instructions"),
        "narrow_device_loads": total.get("narrow_device_loads"),
        "threadgroup_bytes": pair("threadgroup_load_bytes", "threadgroup_store_bytes"),
        "barriers": total.get("threadgroup_barriers"),
        "matrix_ops": sum(total.get(n, 0) for n in MATRIX_COUNTER_NAMES),
        **{name: total.get(name) for name in GPU_LEVEL},
    }


_counted: list[Any] = []  # the plugin kernels counted for the problem being measured (their records give the occupancy)


def plugin_counts(kernel: Any, *args: Any) -> dict[str, float]:
    from tilelang_metal.emulator import counters

    _counted.append(kernel)
    return {k: float(v) for k, v in counters(kernel, *args).total.items()}


def plugin_occupancy(kernels: list[Any]) -> tuple[int, int] | None:
    """(registers per thread, threadgroups per core) of the kernel with the most registers among
    `kernels` (every kernel of their modules: a split's combine kernel is the lighter one), from
    their artifact records (register_budget.kernel_occupancy)."""
    from tilelang_metal.codegen.artifact import artifact_of
    from tilelang_metal.performance.register_budget import kernel_occupancy

    found = [kernel_occupancy(r) for k in kernels for r in artifact_of(k.get_kernel_source()).kernels]
    if not found:
        return None
    regs, occupancy = max(found, key=lambda pair: (pair[0].total, -pair[1].threadgroups))
    return regs.total, occupancy.threadgroups


# ---------------------------------------------------------------- the plugin's kernels


def plugin_gemm(p: Problem, klass: str) -> Measured:
    from tilelang_metal import kernels

    target_name, chip = CLASSES[klass]
    d = p.dims
    layout = d["layout"]
    batch, epilogue = d.get("batch", 0), d.get("epilogue", "none")
    # the dispatch's choice for the layout as stored (plain metal's NT tile is MLX's 64x32x32, not the NN tile)
    choice = kernels.matmul_config(d["M"], d["N"], d["K"], p.dtype, chip=chip, target=target_name, trans_A=layout == "tn",
                                   trans_B=layout == "nt", batch=batch or None, epilogue=epilogue)
    if layout != "nn" and choice.route != "gemm":
        raise ValueError(f"{p.name}: the dispatch routes {choice.route}, which takes no transposed operands")
    # the chip and the reasons change no kernel: a class whose pick is another class's kernel reuses its counts
    return _gemm_measured(p, replace(choice, chip="", reasons=()))


@functools.lru_cache(maxsize=None)
def _gemm_measured(p: Problem, choice: Any) -> Measured:
    """The plugin's GEMM `choice` on problem `p` measured (counts at full size, its occupancy)."""
    matmul_module = importlib.import_module("tilelang_metal.kernels.matmul")  # `kernels.matmul` is the function
    d = p.dims
    layout, batch = d["layout"], d.get("batch", 0)
    errors = ErrorTracker()
    compiled: list[Any] = []

    def measure(m: int, n: int) -> dict[str, float]:
        # the same tile at the proxy size (a batch of PROXY_BATCH); swizzle moves no work
        proxy = replace(choice, M=m, N=n, swizzle=0, **({"batch": PROXY_BATCH} if batch else {}))
        # the routed kernel, with the layout's transposes (the gemm route's kernel takes trans_A / trans_B)
        kern = matmul_module.compile_choice(proxy, "emulator", trans_A=layout == "tn", trans_B=layout == "nt")
        args, ref = gemm_case(m, n, d["K"], layout, p.dtype, PROXY_BATCH if batch else 0, choice.epilogue == "bias")
        errors.check(kern(*args), ref)
        compiled.append(kern)
        return plugin_counts(kern, *args)

    if choice.route == "gemv":
        total = measure(d["M"], d["N"])  # a full GEMV is small enough for the emulator
    else:
        total = count_models.gemm_counts(d["M"], d["N"], choice.block_m, choice.block_n, measure)
    if batch:
        total = {k: v * batch / PROXY_BATCH for k, v in total.items()}
    config = choice.summary().split(": ", 1)[1] + (f", layout {layout}" if layout != "nn" else "")
    return Measured(config, errors.worst, total, plugin_occupancy(compiled))


def plugin_attention(p: Problem, klass: str) -> Measured:
    import torch
    import torch.nn.functional as F

    from tilelang_metal import kernels
    from tilelang_metal.kernels.attention_config import attention_blocks, attention_dataflow

    target_name, _ = CLASSES[klass]
    d = p.dims
    mask = d.get("mask")  # None, "bool" or "additive": a (seq, seq) tensor shared by the heads
    target = kernels.metal4_target() if target_name == "metal4" else kernels.plain_metal_target()
    # the kernel's defaults (no block sizes given; the same choice here, for the count model's blocks)
    blocks = attention_blocks(d["head_dim"], dataflow=attention_dataflow(target), dtype=p.dtype, row_bounds=d["causal"] or mask is not None,
                              inputs=4 + (mask is not None))
    block_m, block_n = blocks.block_m, blocks.block_n
    errors = ErrorTracker()
    dt = torch_dtype(p.dtype)

    def measure(seq: int) -> dict[str, float]:
        kern = kernels.flash_attention_forward(1, 1, seq, d["head_dim"], causal=d["causal"], dtype=p.dtype, target=target,
                                               execution_backend="emulator", **({"mask": mask} if mask else {}))
        g = torch.Generator().manual_seed(seq)
        q, k, v = (torch.randn(1, seq, 1, d["head_dim"], generator=g).to(dt) for _ in range(3))
        mask_tensor = attention_mask(mask, seq, p.dtype, seed=seq) if mask else None
        extra = () if mask_tensor is None else (mask_tensor,)
        attn_mask = mask_tensor if mask_tensor is None or mask == "bool" else mask_tensor.float()  # torch: a float mask adds
        ref = F.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q, k, v)), attn_mask=attn_mask,
                                             is_causal=d["causal"]).transpose(1, 2)
        errors.check(kern(q, k, v, *extra), ref)
        return plugin_counts(kern, q, k, v, *extra)

    total = count_models.attention_counts(d["seq"], block_m, block_n, d["causal"], d["heads"], measure)
    with_mask = f", {mask} mask" if mask else ""
    return Measured(f"flash attention {block_m}x{block_n}, {blocks.threads} threads, {target_name}{with_mask}", errors.worst, total)


DECODE_SPLITS = 32  # key ranges per KV head (MLX's sdpa_vector_2pass takes 64 blocks here)


def plugin_decode(p: Problem, klass: str) -> Measured:
    import tilelang
    import torch

    from tilelang_metal import kernels

    d = p.dims
    errors = ErrorTracker()
    dt = torch_dtype(p.dtype)
    group = d["heads"] // d["kv_heads"]

    kv_proxy, heads = 1, group  # one kv head and its query heads

    def measure(kv_len: int) -> dict[str, float]:
        func = kernels.flash_decoding_program(1, heads, kv_proxy, kv_len, d["head_dim"], dtype=p.dtype, num_split=DECODE_SPLITS)
        kern = tilelang.compile(func, out_idx=[3, 4, 5], target=kernels.plain_metal_target(), execution_backend="emulator")
        g = torch.Generator().manual_seed(kv_len)
        q = torch.randn(1, heads, d["head_dim"], generator=g).to(dt)
        k, v = (torch.randn(1, kv_len, kv_proxy, d["head_dim"], generator=g).to(dt) for _ in range(2))
        kk = k.float().repeat_interleave(group, dim=2)  # (1, n, heads, d)
        vv = v.float().repeat_interleave(group, dim=2)
        scores = torch.einsum("bhd,bnhd->bhn", q.float(), kk) / math.sqrt(d["head_dim"])
        ref = torch.einsum("bhn,bnhd->bhd", torch.softmax(scores, -1), vv)
        errors.check(kern(q, k, v)[-1], ref)
        return plugin_counts(kern, q, k, v)

    total = count_models.linear_counts(d["kv_len"], (512, 1024), d["kv_heads"] / kv_proxy, measure)
    return Measured(f"flash decoding (vector), {group} query heads per kv head, {DECODE_SPLITS} splits", errors.worst, total)


def plugin_rows(p: Problem, klass: str) -> Measured:
    import tilelang
    import torch

    from tilelang_metal import kernels

    d = p.dims
    errors = ErrorTracker()
    proxy_rows = 8
    build = kernels.softmax if p.kind == "softmax" else (lambda r, c, **kw: kernels.reduce_rows(r, c, "sum", **kw))
    kern = tilelang.compile(build(proxy_rows, d["cols"], dtype=p.dtype), out_idx=[-1], target=kernels.plain_metal_target(),
                            execution_backend="emulator")
    x = torch.randn(proxy_rows, d["cols"], generator=torch.Generator().manual_seed(0)).to(torch_dtype(p.dtype))
    ref = torch.softmax(x.float(), -1) if p.kind == "softmax" else x.float().sum(-1)
    errors.check(kern(x), ref)
    counts = plugin_counts(kern, x)
    total = {k: v * d["rows"] / proxy_rows for k, v in counts.items()}
    return Measured(f"kernels.{'softmax' if p.kind == 'softmax' else 'reduce_rows'}", errors.worst, total)


def plugin_quantized(p: Problem, klass: str) -> Measured:
    """kernels.quantized_matmul on MLX's affine weights: the vector kernel on a whole 1 x N launch
    (small enough for the emulator), the tiled kernel (route "tiled") from GEMM proxies of its tile."""
    import functools

    from tilelang_metal import kernels
    qm = importlib.import_module("tilelang_metal.kernels.quantized_matmul")

    d = p.dims
    errors = ErrorTracker()
    layout = {"bits": d["bits"], "group_size": d["group_size"], "dtype": p.dtype}

    @functools.lru_cache(maxsize=None)
    def compiled(n: int) -> Any:  # one kernel per proxy width; M dynamic for the tiled route
        if p.kind == "qmv":
            return kernels.quantized_matmul(d["M"], n, d["K"], **layout, execution_backend="emulator")
        return kernels.quantized_matmul(None, n, d["K"], **layout, route=qm.TILED, execution_backend="emulator")

    def measure(m: int, n: int) -> dict[str, float]:
        x, w_q, scales, biases, ref = quantized_operands(m, n, d["K"], d["bits"], d["group_size"], p.dtype)
        kern = compiled(n)
        errors.check(kern(x, w_q, scales, biases), ref)
        return plugin_counts(kern, x, w_q, scales, biases)

    if p.kind == "qmv":
        total = measure(d["M"], d["N"])
        config = (f"quantized_matmul vector: {qm.SIMDGROUPS} simdgroups x {qm.COLUMNS} columns, "
                  f"{qm.WORDS_PER_LANE} words a lane and step, {d['bits']}-bit gs{d['group_size']}")
    else:
        total = count_models.gemm_counts(d["M"], d["N"], qm.TILE_M, qm.TILE_N, measure)
        config = f"quantized_matmul tiled {qm.TILE_M}x{qm.TILE_N}x{qm.TILE_K}, {qm.TILE_THREADS} threads, {d['bits']}-bit gs{d['group_size']}"
    return Measured(config, errors.worst, total)


PLUGIN: dict[str, Callable[[Problem, str], Measured]] = {
    "gemm": plugin_gemm, "attention": plugin_attention, "decode": plugin_decode, "softmax": plugin_rows, "row_sum": plugin_rows,
    "qmv": plugin_quantized, "qmm": plugin_quantized,
}


# ---------------------------------------------------------------- MLX's kernels

from compare_mlx_side import MLX  # noqa: E402  (through the reference tier's launch modules)


# ---------------------------------------------------------------- the table


def _row(p: Problem, klass: str, impl: str, m: Measured | None, error: str = "") -> dict[str, Any]:
    row: dict[str, Any] = {"problem": p.name, "chip_class": klass, "implementation": impl, "flops": p.flops()}
    if m is None:
        row.update(config=f"FAILED: {error}", verified=False, max_rel_err="")
        return row
    row.update(config=m.config, verified=m.verified(p.dtype), max_rel_err=f"{m.max_rel_err:.3g}")
    row.update({k: "n/a" if v is None else round(v) for k, v in summarize(m.counts).items()})
    if m.occupancy is not None:
        row.update(zip(OCCUPANCY_COLUMNS, m.occupancy))
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """On each plugin row: its count per FLOP over MLX's, for the counts in RATIO_COLUMNS."""
    mlx = {(r["problem"], r["chip_class"]): r for r in rows if r["implementation"] == "mlx" and r["verified"]}
    for r in rows:
        other = mlx.get((r["problem"], r["chip_class"]))
        if r["implementation"] != "plugin" or other is None or not r["verified"]:
            continue
        for col in RATIO_COLUMNS:
            if "n/a" in (r[col], other[col]):
                continue
            mine, theirs = r[col] / r["flops"], other[col] / other["flops"]
            r[f"{col}_vs_mlx"] = "" if theirs == 0 and mine == 0 else ("inf" if theirs == 0 else f"{mine / theirs:.3g}")
        for col in OCCUPANCY_COLUMNS:
            if r.get(col, "") != "" and other.get(col, "") != "":
                r[f"{col}_vs_mlx"] = f"{r[col] / other[col]:.3g}"


def _ratio(row: dict[str, Any], column: str) -> float | None:
    """`column`'s per-FLOP ratio on a plugin row: None where neither side has the count."""
    value = str(row.get(f"{column}_vs_mlx", ""))
    return None if value == "" else float(value)


def count_bounds_missed(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 35's count bounds against MLX, one line per bound a verified plugin row misses: steel-class
    GEMMs at most MLX's load instructions, device transactions and bank replays per FLOP and at least its
    threadgroups per core; skinny (M <= 64) and batched GEMMs at most 1.1x its matrix operations per
    FLOP; attention within the register budget, at most MLX's threadgroup bytes and memory barriers per
    FLOP. Rows without an MLX row to compare with are not judged."""
    from tilelang_metal.performance.register_budget import REGISTER_BUDGET

    problems = {p.name: p for p in PROBLEMS}
    missed = []
    for r in rows:
        p = problems.get(r["problem"])
        if r["implementation"] != "plugin" or p is None or str(r.get("threadgroups_per_core_vs_mlx", "")) == "":
            continue
        bounds: list[tuple[str, bool]] = []
        if p.kind == "gemm" and r["chip_class"] in STEEL_CLASSES:
            bounds += [(f"{c} per FLOP at most MLX's", (_ratio(r, c) or 0) <= 1)
                       for c in ("load_instructions", "device_transactions", "threadgroup_replays")]
            bounds.append(("threadgroups per core at least MLX's", float(r["threadgroups_per_core_vs_mlx"]) >= 1))
        if p.kind == "gemm" and (p.dims["M"] <= 64 or p.dims.get("batch")):
            bounds.append(("matrix operations per FLOP at most 1.1x MLX's", (_ratio(r, "matrix_ops") or 0) <= 1.1))
        if p.kind == "attention":
            bounds.append((f"registers within the budget of {REGISTER_BUDGET.registers}",
                           int(r["registers_estimate"]) <= REGISTER_BUDGET.registers))
            bounds += [(f"{c} per FLOP at most MLX's", (_ratio(r, c) or 0) <= 1) for c in ("threadgroup_bytes", "memory_barriers")]
        missed += [f"{r['problem']} [{r['chip_class']}]: {what} ({r['config']})" for what, held in bounds if not held]
    return missed


def write_outputs(rows: list[dict[str, Any]], out: Path, seconds: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    columns = list(COLUMNS) + [f"{c}_vs_mlx" for c in (*RATIO_COLUMNS, *OCCUPANCY_COLUMNS)]
    with open(out / "compare_mlx.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in columns})
    lines = [
        "# The plugin and MLX, side by side (emulator counts at full size, from proxies)", "",
        f"{len(rows)} rows in {seconds:.0f} s. Counts per problem at its full size (benchmark/count_models.py); "
        "`x_vs_mlx` = the plugin's count per FLOP over MLX's (below 1: the plugin does less). Structure, not time.", "",
        "| problem | class | impl | verified | rel err | device bytes | load ops (source) | narrow loads (source) | tg bytes | barriers | matrix ops "
        "| load ops (source) vs MLX | narrow (source) vs MLX | tg bytes vs MLX | barriers vs MLX | config |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['problem']} | {r['chip_class']} | {r['implementation']} | {'yes' if r['verified'] else 'NO'} | {r.get('max_rel_err', '')} | "
                     f"{r.get('device_bytes', '')} | {r.get('device_load_ops', '')} | {r.get('narrow_device_loads', '')} | "
                     f"{r.get('threadgroup_bytes', '')} | {r.get('barriers', '')} | {r.get('matrix_ops', '')} | "
                     f"{r.get('device_load_ops_vs_mlx', '')} | {r.get('narrow_device_loads_vs_mlx', '')} | "
                     f"{r.get('threadgroup_bytes_vs_mlx', '')} | {r.get('barriers_vs_mlx', '')} | {r['config']} |")
    lines += [
        "", "GPU-level counts (merged per-thread instructions, 128-byte segments per simdgroup access, bank replays, "
        "barriers by kind; docs/emulator.md), and their ratio per FLOP to MLX's:", "",
        "| problem | class | impl | " + " | ".join(GPU_LEVEL) + " | matrix_ops | " + " | ".join(f"{c} vs MLX" for c in (*GPU_LEVEL, "matrix_ops")) + " |",
        "|---|---|---|" + "---|" * (2 * len(GPU_LEVEL) + 2),
    ]
    for r in rows:
        cells = [str(r.get(c, "")) for c in (*GPU_LEVEL, "matrix_ops")] + [str(r.get(f"{c}_vs_mlx", "")) for c in (*GPU_LEVEL, "matrix_ops")]
        lines.append(f"| {r['problem']} | {r['chip_class']} | {r['implementation']} | " + " | ".join(cells) + " |")
    lines += [
        "", "Registers per thread and threadgroups per core of each implementation's heaviest kernel (estimates: "
        "docs/performance.md, \"Registers and occupancy\"), and their plain ratio to MLX's:", "",
        "| problem | class | impl | registers_estimate | threadgroups_per_core | registers vs MLX | threadgroups vs MLX |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [str(r.get(c, "")) for c in OCCUPANCY_COLUMNS] + [str(r.get(f"{c}_vs_mlx", "")) for c in OCCUPANCY_COLUMNS]
        lines.append(f"| {r['problem']} | {r['chip_class']} | {r['implementation']} | " + " | ".join(cells) + " |")
    (out / "compare_mlx.md").write_text("\n".join(lines) + "\n")


def run(problems: list[Problem], classes: list[str], out: Path, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    start = time.time()
    for p in problems:
        for klass in (c for c in p.classes if c in classes):
            for impl, table in (("plugin", PLUGIN), ("mlx", MLX)):
                t0 = time.time()
                _counted.clear()
                try:
                    measured = table[p.kind](p, klass)
                    if impl == "plugin" and measured.occupancy is None:
                        measured.occupancy = plugin_occupancy(_counted)
                    rows.append(_row(p, klass, impl, measured))
                except Exception as e:  # a failure is a row, and the run's exit status
                    rows.append(_row(p, klass, impl, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"))
                log(f"{p.name} [{klass}] {impl}: {rows[-1]['config']} ({time.time() - t0:.1f} s)")
            add_ratios(rows)
            write_outputs(rows, out, time.time() - start)  # each problem as it finishes
    return rows


# The columns of docs/performance.md's table "Against MLX, problem by problem": GPU-level counts per
# FLOP as a ratio to MLX's (when MLX's count is 0 the cell gives both counts), then the estimates.
DOC_RATIO_COLUMNS = (("load instructions", "load_instructions"), ("device transactions", "device_transactions"),
                     ("device bytes read once", "unique_device_load_bytes"), ("threadgroup replays", "threadgroup_replays"),
                     ("memory barriers", "memory_barriers"), ("lockstep barriers", "lockstep_barriers"),
                     ("matrix ops", "matrix_ops"))


def _count(value: str) -> str:
    return f"{float(value):,.0f}".replace(",", " ") if value not in ("", None) else "-"


def doc_table(rows: list[dict[str, str]]) -> str:
    """The plugin rows of a compare_mlx.csv as docs/performance.md's per-problem table."""
    mlx = {(r["problem"], r["chip_class"]): r for r in rows if r["implementation"] == "mlx"}
    head = ["problem", "class", "plugin kernel", *(name + " vs MLX" for name, _ in DOC_RATIO_COLUMNS),
            "registers (est., plugin vs MLX)", "threadgroups per core (plugin vs MLX)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["implementation"] != "plugin":
            continue
        theirs = mlx.get((r["problem"], r["chip_class"]), {})
        cells = [r["problem"], r["chip_class"], r["config"].split(" tile, ")[0] if r["config"].startswith("gemm ") else r["config"]]
        for _, column in DOC_RATIO_COLUMNS:
            ratio = r.get(f"{column}_vs_mlx", "")
            mine, other = r.get(column, ""), theirs.get(column, "")
            zero = ("0", "0.0")
            if mine in zero and other in zero:
                cells.append("none")  # neither kernel has any
            elif ratio in ("", "inf", "0") or other in ("", *zero):
                cells.append(f"{_count(mine)} / {_count(other)}")  # a ratio would hide which side has none
            else:
                cells.append(ratio)
        for column in OCCUPANCY_COLUMNS:
            cells.append(f"{r.get(column, '') or '-'} vs {theirs.get(column, '') or '-'}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for compare_mlx.csv and compare_mlx.md")
    ap.add_argument("--dry-run", action="store_true", help="the emulator (the only mode so far: timing is bench_gemm.py's job)")
    ap.add_argument("--only", default="", help="comma-separated problem names (default: all)")
    ap.add_argument("--classes", default=",".join(CLASSES),
                    help="chip classes: nax (M5: metal4 vs MLX NAX), steel (M3: plain metal vs steel), steel-pro, steel-max, "
                         "steel-ultra (the M3 Pro, Max, Ultra: MLX's steel tile per size class)")
    ap.add_argument("--check-bounds", action="store_true",
                    help="exit 1 where a plugin row misses one of issue 35's count bounds against MLX (count_bounds_missed)")
    ap.add_argument("--doc-table", type=Path, metavar="CSV",
                    help="print docs/performance.md's per-problem table from a compare_mlx.csv this script wrote, and stop")
    args = ap.parse_args(argv)
    if args.doc_table:
        with open(args.doc_table, newline="") as f:
            print(doc_table(list(csv.DictReader(f))))
        return 0
    names = {n for n in args.only.split(",") if n}
    unknown = names - {p.name for p in PROBLEMS}
    if unknown:
        ap.error(f"unknown problem(s) {sorted(unknown)}; known: {', '.join(p.name for p in PROBLEMS)}")
    classes = [c for c in args.classes.split(",") if c]
    if set(classes) - set(CLASSES):
        ap.error(f"--classes {args.classes}: unknown {sorted(set(classes) - set(CLASSES))}; known: {', '.join(CLASSES)}")
    import tilelang_metal  # noqa: F401  (installs the plugin)

    rows = run([p for p in PROBLEMS if not names or p.name in names], classes, args.out)
    failed = [r for r in rows if not r["verified"]]
    for r in failed:
        print(f"NOT VERIFIED: {r['problem']} [{r['chip_class']}] {r['implementation']}: {r['config']}", file=sys.stderr)
    missed = count_bounds_missed(rows)
    for line in missed:
        print(f"COUNT BOUND MISSED: {line}", file=sys.stderr)
    return 1 if failed or (missed and args.check_bounds) else 0


if __name__ == "__main__":
    sys.exit(main())
