"""TVM dtypes to MSL type names and literals."""

from __future__ import annotations

import math

from ..core.dtypes import MSL_SCALAR
from ..errors import CodegenError

SCALAR_TYPES = MSL_SCALAR
VECTOR_LANES = (2, 3, 4)


def split_dtype(dtype: str) -> tuple[str, int]:
    text = str(dtype)
    if "x" in text:
        base, lanes = text.rsplit("x", 1)
        if lanes.isdigit():
            return base, int(lanes)
    return text, 1


def scalar_type(dtype: str) -> str:
    base, _ = split_dtype(dtype)
    try:
        return SCALAR_TYPES[base]
    except KeyError:
        raise CodegenError(
            f"dtype {base} has no Metal equivalent (Metal has no float64 and no fp8); use float32, float16, bfloat16 or an integer type"
        ) from None


def msl_type(dtype: str) -> str:
    base, lanes = split_dtype(dtype)
    name = scalar_type(base)
    if lanes == 1:
        return name
    if lanes not in VECTOR_LANES:
        raise CodegenError(f"vector {dtype} has {lanes} lanes; Metal vectors have 2, 3 or 4. Vectorize by 4 or less")
    return f"{name}{lanes}"


def float_literal(value: float, dtype: str) -> str:
    base, _ = split_dtype(dtype)
    if math.isnan(value):
        text = "NAN"
    elif math.isinf(value):
        text = "INFINITY" if value > 0 else "(-INFINITY)"
    else:
        text = repr(float(value))
        if "e" not in text and "." not in text:
            text += ".0"
        text += "f"
    if base == "float32":
        return text
    return f"{scalar_type(base)}({text})"


def int_literal(value: int, dtype: str) -> str:
    base, _ = split_dtype(dtype)
    if base == "bool":
        return "true" if value else "false"
    if base == "int32":
        return str(value) if value != -(2**31) else "(-2147483647 - 1)"
    if base == "uint32":
        return f"{value}u"
    return f"(({scalar_type(base)}){value})"
