"""Problem sizes and options given to the ready kernels, checked before any TileLang is built: a
wrong one is a one-line error naming the argument and what to pass, never an error from TVM after a
page of builder code."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any


def integer_sizes(
    what: str,
    *,
    minimum: int | None = None,
    multiples: Mapping[str, tuple[int, str]] | None = None,
    error: type[Exception] = ValueError,
    symbolic: Iterable[str] = (),
    **sizes: Any,
) -> tuple[Any, ...]:
    """The values of `sizes` as Python ints, in order: any integer type (numpy's, a 0-d integer
    tensor, a TIR integer constant) is taken by value; bools, floats and other objects are refused
    in one line naming `what` and the argument. `minimum`: each size must be at least this (1 where
    a size is meant); `multiples`: {name: (step, why)}, that size must be a multiple of step, `why`
    says what needs it. The sizes named in `symbolic` may also be integer TIR expressions
    (`T.dynamic("M")`), kept as they are: their value is checked per call by the calling convention."""
    values = []
    for name, value in sizes.items():
        if isinstance(value, bool):  # an int subclass: True would be a size of 1
            raise error(f"{what} {name}={value!r} must be an integer, not a bool; pass the number itself")
        if name in symbolic and _is_symbolic_integer(value):
            values.append(value)
            continue
        try:
            number = operator.index(value)
        except TypeError:
            number = _integer_constant(value)
            if number is None:
                raise error(f"{what} {name}={value!r} must be an integer (a {type(value).__name__} was given); pass int({name})") from None
        if minimum is not None and number < minimum:
            raise error(f"{what} {name}={number} must be at least {minimum}; pass {name} >= {minimum}")
        step, why = (multiples or {}).get(name, (1, ""))
        if number % step:
            near = " or ".join(str(v) for v in (number // step * step, -(-number // step) * step) if v >= max(step, minimum or 0))
            raise error(f"{what} {name}={number} is not a multiple of {step} ({why}); use {name}={near}")
        values.append(number)
    return tuple(values)


def optional_size(what: str, name: str, value: Any, *, minimum: int = 1, none_means: str, error: type[Exception] = ValueError) -> int | None:
    """`value` as an int of at least `minimum`, or None (which means `none_means`)."""
    if value is None:
        return None
    try:
        (number,) = integer_sizes(what, minimum=minimum, error=error, **{name: value})
    except error as refusal:
        raise error(f"{refusal}, or None ({none_means})") from None
    return number


def flags(what: str, *, error: type[Exception] = ValueError, **values: Any) -> None:
    """Each of `values` must be True or False (a 0 / 1 or a string is refused)."""
    for name, value in values.items():
        if not isinstance(value, bool):
            raise error(f"{what} {name}={value!r} must be True or False")


def one_of(what: str, name: str, value: Any, allowed: Iterable[Any], *, error: type[Exception] = ValueError) -> None:
    """`value` must be one of `allowed` (compared by type and value: 1.0 is not 1, True is not 1)."""
    allowed = tuple(allowed)
    if not any(type(value) is type(option) and value == option for option in allowed):
        raise error(f"{what} {name}={value!r} is not supported; use one of {', '.join(repr(option) for option in allowed)}")


def _integer_constant(value: Any) -> int | None:
    """The value of a TIR integer constant (`T.int32(64)`), else None."""
    from ..host import tir

    if isinstance(value, tir.IntImm) and not str(value.dtype).startswith("bool"):
        return int(value.value)
    return None


def _is_symbolic_integer(value: Any) -> bool:
    from ..host import tir

    return isinstance(value, tir.PrimExpr) and not isinstance(value, tir.IntImm) and str(value.dtype).startswith(("int", "uint"))
