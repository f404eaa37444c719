"""Problem sizes given to the ready kernels, as Python ints."""

from __future__ import annotations

import operator
from typing import Any


def integer_sizes(what: str, **sizes: Any) -> tuple[int, ...]:
    """The values of `sizes` as Python ints, in order: any integer type (numpy's, a 0-d integer
    tensor) is taken by value; bools, floats and other objects are refused in one line naming `what`."""
    values = []
    for name, value in sizes.items():
        try:
            if isinstance(value, bool):
                raise TypeError
            values.append(operator.index(value))
        except TypeError:
            raise ValueError(f"{what} {name}={value!r} must be an integer (a {type(value).__name__} was given); pass int({name})") from None
    return tuple(values)
