"""Element types a Metal kernel can take: TileLang / torch dtype name -> MSL scalar type.

The one table for the printer (TIR dtype -> MSL), the emulator (MSL -> torch dtype name of a
parameter) and the launchers (which tensor dtypes a kernel accepts). torch names coincide with
TileLang's for every entry.
"""

from __future__ import annotations

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
