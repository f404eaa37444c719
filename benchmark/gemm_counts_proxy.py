"""Per-threadgroup emulator counters of the default direct-global GEMM at 4096^3 and 4000^3, without
running the full grid (too slow in the emulator).

A threadgroup's work depends on K, the tile and where the tile meets the buffer edges, not on how
many threadgroups there are. So each size is measured on a 2x2-threadgroup proxy with the same K and
the same remainders (64x128 tiles, 128 threads):

    4096^3 -> 128 x 256 x 4096   every threadgroup is a whole tile, like every one of 4096^3
    4000^3 ->  96 x 160 x 4000   4000 % 64 = 32 rows, 4000 % 128 = 32 columns in the last tiles:
                                 (0,0) interior, (1,0) last tile column, (0,1) last tile row, (1,1) corner

Row strides differ from the full size (e.g. 160 instead of 4000) but are multiples of 4 in both, so
the same accesses are proven aligned. Prints JSON: per target and size, the relative error against
torch and the counters of each threadgroup.

    PYTHONPATH=. python benchmark/gemm_counts_proxy.py [metal4,metal]
"""

from __future__ import annotations

import json
import sys

PROXIES = {"4096^3": (128, 256, 4096), "4000^3": (96, 160, 4000)}


def main(targets: list[str]) -> dict:
    import tilelang
    import torch

    import tilelang_metal  # noqa: F401
    from tilelang_metal import kernels as examples
    from tilelang_metal.emulator import counters

    out = {}
    for name in targets:
        target = examples.metal4_target() if name == "metal4" else examples.plain_metal_target()
        for label, (m, n, k) in PROXIES.items():
            kern = tilelang.compile(examples.gemm_direct_global(m, n, k), out_idx=[-1], target=target, execution_backend="emulator")
            a = torch.randn(m, k, dtype=torch.float16) / 8
            b = torch.randn(k, n, dtype=torch.float16) / 8
            ref = a.float() @ b.float()
            err = ((kern(a, b).float() - ref).abs().max() / ref.abs().max()).item()
            stats = counters(kern, a, b)
            out[f"{name} {label}"] = {"rel_err": err, **{str(pos): row for pos, row in sorted(stats.threadgroups.items())}}
    return out


if __name__ == "__main__":
    chosen = sys.argv[1].split(",") if len(sys.argv) > 1 else ["metal4", "metal"]
    print(json.dumps(main(chosen), indent=1))
