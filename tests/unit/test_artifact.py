"""The kernel artifact (codegen/artifact.py) as data: every record kind survives the comment line it
travels in, other versions and damaged lines are refused in one line, MSL without an artifact is
refused in one line that names emulator.compile_msl."""

from __future__ import annotations

import json

import pytest

from tilelang_metal.codegen import artifact as A

RECORD = A.KernelRecord(
    name="main_kernel",
    params=(
        A.BufferParam(0, "X", "half", True),
        A.BufferParam(1, "Out", "float", False, restrict=False),
        A.ScalarParam(2, "n", "int"),
        A.PositionParam("blockIdx", "uint3", "threadgroup_position_in_grid"),
    ),
    block=(32, 4, 1),
    max_total_threads=128,
    threadgroup_arrays=(A.ThreadgroupArrayDecl("buf_dyn_shmem", "uchar", 1024),),
    threadgroup_views=(
        A.ThreadgroupViewDecl("A_s", "half", "buf_dyn_shmem", "0", 256),
        A.ThreadgroupViewDecl("B_s", "float", "buf_dyn_shmem", "512", None),
    ),
    thread_arrays=(A.ThreadArrayDecl("acc", "float", 8, live=((3, 9),)), A.ThreadArrayDecl("staged_half", "half", 16, align=16)),
    cooperative_tensors=(A.CooperativeTensorDecl("C", "float", 2, 16, "matmul2d_16x32x16", live=((4, 12), (20, 24))),),
    tile_pointers=(A.TilePointerDecl("__src", "half", True, "X"),),
    instructions=("simdgroup_multiply_accumulate_8x8x8",),
    prints=True,
    access_marks=((9, 4, 3, "w"), (9, 30, 1, "p"), (12, 20, 3, "s")),
    predicated_blocks=((11, 27),),
)
RUNTIME = A.KernelRecord(
    name="k2", params=(A.BufferParam(0, "Y", "int", False), A.ArgStructParam(1, "__tlm_args", "__tlm_k2_args", 16, (("m", "int32"), ("s", "float32")))),
    block=None, max_total_threads=None,
)


def test_round_trip_keeps_every_record():
    art = A.KernelArtifact(convention=A.STANDARD, kernels=(RECORD,))
    line = art.line()
    assert "\n" not in line and line.startswith("// tilelang_metal.artifact v4 {")
    assert A.decode(line) == art
    runtime = A.KernelArtifact(convention=A.TVM_RUNTIME, kernels=(RECORD, RUNTIME))
    assert A.decode(runtime.line()) == runtime
    source = f"// tilelang_metal 0.1.0: main_kernel, k2\n{runtime.line()}\n#include <metal_stdlib>\n"
    assert A.artifact_of(source) == runtime and A.artifact_of(source).kernel("k2").bound[1].members[1] == ("s", "float32")
    assert A.strip_artifact(source) == "// tilelang_metal 0.1.0: main_kernel, k2\n#include <metal_stdlib>\n"


def test_records_spell_the_printers_declarations():
    assert [p.msl() for p in RECORD.params] == [
        "const device half* __restrict X [[ buffer(0) ]]",
        "device float* Out [[ buffer(1) ]]",
        "constant int& n [[ buffer(2) ]]",
        "uint3 blockIdx [[threadgroup_position_in_grid]]",
    ]
    assert RECORD.opening() == "[[kernel, max_total_threads_per_threadgroup(128)]] void main_kernel("
    assert RUNTIME.opening() == "[[kernel]] void k2("
    assert RECORD.threadgroup_views[0].msl() == "threadgroup half* A_s = (threadgroup half*)(buf_dyn_shmem + 0);  // 256 elements"
    assert RECORD.threadgroup_views[1].msl() == "threadgroup float* B_s = (threadgroup float*)(buf_dyn_shmem + 512);"
    assert RECORD.thread_arrays[1].msl() == "alignas(16) half staged_half[16];"
    assert RECORD.tile_pointers[0].prefix() == "const device half* __src = "
    assert [p.name for p in RECORD.bound] == ["X", "Out", "n"] and [p.name for p in RECORD.positions] == ["blockIdx"]


def test_other_version_is_refused_in_one_line():
    line = A.KernelArtifact(convention=A.STANDARD, kernels=(RECORD,)).line().replace(" v4 ", " v3 ", 1)
    with pytest.raises(A.ArtifactError) as info:
        A.artifact_of("// tilelang_metal 9.9: main_kernel\n" + line + "\nkernel void f() {}\n")
    text = str(info.value)
    assert "\n" not in text and "artifact v3" in text and "reads v4" in text and "compile the kernel again" in text


@pytest.mark.parametrize("damage", ["truncated", "unknown field", "unknown kind"])
def test_damaged_artifact_is_refused_in_one_line(damage):
    payload = json.loads(A.KernelArtifact(convention=A.STANDARD, kernels=(RECORD,)).line().split(" ", 3)[3])
    if damage == "truncated":
        text = json.dumps(payload)[:-20]
    elif damage == "unknown field":
        payload["kernels"][0]["params"][0]["stride"] = 4
        text = json.dumps(payload)
    else:
        payload["kernels"][0]["params"][0]["kind"] = "texture"
        text = json.dumps(payload)
    with pytest.raises(A.ArtifactError) as info:
        A.decode(f"// tilelang_metal.artifact v4 {text}")
    assert "\n" not in str(info.value)


def test_msl_without_an_artifact_is_refused_in_one_line():
    hand_written = "#include <metal_stdlib>\nusing namespace metal;\nkernel void add(device float* x [[buffer(0)]]) {}\n"
    assert A.find_artifact(hand_written) is None
    with pytest.raises(A.ArtifactError) as info:
        A.artifact_of(hand_written)
    text = str(info.value)
    assert "\n" not in text and "no tilelang_metal artifact" in text and "emulator.compile_msl" in text


def test_unknown_kernel_names_the_recorded_ones():
    art = A.KernelArtifact(convention=A.STANDARD, kernels=(RECORD, RUNTIME))
    with pytest.raises(A.ArtifactError, match=r"kernel nope is not in the module's artifact \(kernels: main_kernel, k2\)"):
        art.kernel("nope")


def test_plugin_adapter_refuses_msl_without_an_artifact():
    """A plugin path (here the emulator adapter) handed hand-written MSL says so in one line, before
    it looks at anything else."""
    from tilelang_metal.execution.emulator_adapter import EmulatorKernelAdapter

    with pytest.raises(A.ArtifactError) as info:
        EmulatorKernelAdapter([], [], None, None, "kernel void f(device float* x [[buffer(0)]]) {}\n")
    assert "\n" not in str(info.value) and "emulator.compile_msl" in str(info.value)
