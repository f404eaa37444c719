"""Element types a Metal kernel can take: TileLang / torch dtype name -> MSL scalar type.

The one table for the printer (TIR dtype -> MSL), the emulator (MSL -> torch dtype name of a
parameter) and the launchers (which tensor dtypes a kernel accepts). torch names coincide with
TileLang's for every entry. Also the byte size of MSL types (`msl_type_bytes`), which the emulator's
source rewrite and its front door for hand-written MSL both read.
"""

from __future__ import annotations

import re

MSL_SCALAR = {
    "bool": "bool",
    "int8": "char",
    "uint8": "uchar",
    "int16": "short",
    "uint16": "ushort",
    "int32": "int",
    "uint32": "uint",
    "int64": "long",
    "uint64": "ulong",
    "float16": "half",
    "bfloat16": "bfloat",
    "float32": "float",
}
DTYPE_OF_MSL = {msl: dtype for dtype, msl in MSL_SCALAR.items()}
KERNEL_DTYPES = tuple(MSL_SCALAR)

MSL_SCALAR_BYTES: dict[str, int] = {
    "bool": 1, "char": 1, "uchar": 1, "short": 2, "ushort": 2, "half": 2, "bfloat": 2,
    "int": 4, "uint": 4, "float": 4, "long": 8, "ulong": 8,
}


def msl_type_bytes(type_name: str) -> int | None:
    """Size of an MSL scalar, vector (`half4`) or simdgroup matrix (`simdgroup_float8x8`) type."""
    if type_name in MSL_SCALAR_BYTES:
        return MSL_SCALAR_BYTES[type_name]
    m = re.fullmatch(r"([a-z]+)([234])", type_name)
    if m and m.group(1) in MSL_SCALAR_BYTES:
        return MSL_SCALAR_BYTES[m.group(1)] * int(m.group(2))
    m = re.fullmatch(r"simdgroup_([a-z]+)8x8", type_name)
    if m and m.group(1) in MSL_SCALAR_BYTES:
        return 2 * MSL_SCALAR_BYTES[m.group(1)]  # two elements per lane
    return None
