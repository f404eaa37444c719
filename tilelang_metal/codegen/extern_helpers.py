"""CUDA device functions that TileLang's frontend emits as `call_extern` by name and that Metal
has no equivalent for, written once per kernel file as MSL helpers.

`T.dp4a(A, B, C)` is `call_extern("DP4A", &A, &B, &C)`: C[0] += the dot product of the four int8
values at A and B (CUDA's `__dp4a` on 32 bits of packed bytes). The helper takes the three
pointers as template parameters, so one definition serves thread, threadgroup and device memory.
"""

from __future__ import annotations

DP4A = "__tlm_dp4a"

EXTERN_HELPERS: dict[str, tuple[str, str]] = {
    "DP4A": (
        DP4A,
        f"""template <typename PA, typename PB, typename PC>
inline void {DP4A}(PA a, PB b, PC c) {{
  int sum = c[0];
  for (int i = 0; i < 4; ++i) {{
    sum += int(a[i]) * int(b[i]);
  }}
  c[0] = sum;
}}
""",
    ),
}
