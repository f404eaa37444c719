"""Can this Mac's runtime run a kernel with Metal 4 tensor operations (MPP cooperative tensors, the
`metal4` target key)? Checked before the first launch on the torch and MLX backends.

MPP compiles and runs on any Apple-silicon GPU (M1 to M5) under macOS 26. What fails is a macOS
older than 26 (its Metal compiler has no MSL 4.0) or a runtime that does not ask Metal for MSL 4.0
when it compiles source. A kernel that cannot run is refused in one line naming what is missing;
there is no fallback to the simdgroup build (that is another kernel, compiled for another target:
the fix names it). docs/guide.md, "Metal 4 kernels at launch". Unverified on a Mac.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..codegen.artifact import KernelArtifact
from ..errors import Metal4UnavailableError
from ..target.isa import METAL4_FEATURE, REGISTRY

MIN_MACOS_MAJOR = 26
# torch.mps.compile_shader asks for MSL 4.0 on macOS 26 since pytorch/pytorch#172230 ("Use Metal-4.0
# on MacOS-26", merged 2026-01-12, after the 2.10 branch cut of 2025-12-16): first in 2.11, a release
# inferred from those dates, not checked against a 2.10 build.
MIN_TORCH = (2, 11)
# MLX compiles custom kernels as MSL 4.0 on macOS 26 (mlx/backend/metal/device.cpp,
# get_metal_version); 0.30 is the plugin's documented minimum, not bisected.
MIN_MLX = (0, 30)
PLAIN_TARGET_FIX = "or compile it for target={'kind': 'metal', 'keys': ['metal', 'gpu']} (simdgroup matrices, no metal4 key)"
# Compiler messages that mean the runtime's compiler did not take MSL 4.0 tensor code.
_MSL4_MISSING = re.compile(r"MetalPerformancePrimitives|metal_tensor|tensor_ops|mpp::|dextents|cooperative_tensor|__HAVE_TENSOR__")


def runs_metal4(instructions: Iterable[str]) -> bool:
    """Does a kernel running these matrix instructions (its artifact record's `instructions`, names
    of isa.REGISTRY) need Metal 4? Those that require the metal4 target feature are MPP's
    cooperative tensors, the only code the printer writes that needs MSL 4.0 (and its MPP header)."""
    for name in instructions:
        try:
            inst = REGISTRY.named(name)
        except KeyError:
            raise ValueError(f"the artifact records matrix instruction {name}, which this tilelang_metal does not know: compile the kernel again") from None
        if METAL4_FEATURE in inst.requires:
            return True
    return False


def needs_metal4(artifact: KernelArtifact) -> bool:
    """Does any kernel of the printed module need Metal 4 (read from its artifact's records)?"""
    return any(runs_metal4(k.instructions) for k in artifact.kernels)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def _shown(version: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in version)


@dataclass(frozen=True)
class RuntimeFacts:
    """What decides it; read from the host by `current`, injectable for tests."""

    macos_release: str  # platform.mac_ver()[0]; "" off macOS
    runtime: str  # "torch" or "mlx"
    runtime_version: str


def current(runtime: str) -> RuntimeFacts:
    if runtime == "torch":
        import torch

        version = str(torch.__version__)
    else:
        import mlx.core as mx

        version = str(mx.__version__)
    return RuntimeFacts(platform.mac_ver()[0], runtime, version)


def missing(facts: RuntimeFacts) -> list[str]:
    """What this host lacks for MSL 4.0 tensor operations, each with its fix; empty when nothing."""
    problems = []
    release = _version(facts.macos_release)
    if not release or release[0] < MIN_MACOS_MAJOR:
        shown = f"macOS {facts.macos_release}" if facts.macos_release else "a host that is not macOS"
        problems.append(f"{shown} has no MSL 4.0 (update to macOS {MIN_MACOS_MAJOR} or later)")
    minimum = MIN_TORCH if facts.runtime == "torch" else MIN_MLX
    if _version(facts.runtime_version) < minimum:
        what = "torch.mps.compile_shader" if facts.runtime == "torch" else "mx.fast.metal_kernel"
        problems.append(
            f"{facts.runtime} {facts.runtime_version}'s {what} does not request MSL 4.0 "
            f"(pip install '{facts.runtime}>={_shown(minimum)}')"
        )
    return problems


def check(kernel_name: str, facts: RuntimeFacts) -> None:
    """Refuse, in one line, a metal4 kernel this host cannot run."""
    problems = missing(facts)
    if problems:
        raise Metal4UnavailableError(
            f"kernel {kernel_name} uses Metal 4 tensor operations (target key metal4), which need MSL 4.0: "
            f"{'; '.join(problems)}; {PLAIN_TARGET_FIX}"
        )


def explain_compile_error(kernel_names: str, error: BaseException) -> Metal4UnavailableError | None:
    """A one-line error when the runtime's compiler rejected a metal4 source for lack of MSL 4.0
    (the checks above passed, e.g. an SDK or compiler older than the OS); None for other errors."""
    text = str(error)
    if not _MSL4_MISSING.search(text):
        return None
    first = next((line.strip() for line in text.splitlines() if "error" in line.lower()), text.strip().splitlines()[0] if text.strip() else "")
    return Metal4UnavailableError(
        f"kernel {kernel_names}: the runtime's Metal compiler rejected its Metal 4 tensor operations "
        f"({first[:200]}): it lacks MSL 4.0 or was not asked for it; {PLAIN_TARGET_FIX}"
    )
