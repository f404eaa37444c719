"""The version guard: tilelang_metal supports one range of tilelang releases; checked before anything
else of the host is imported (an unsupported tilelang fails with one line, not deep in an import)."""

from __future__ import annotations

from ..errors import UnsupportedHostError
from ..version import SUPPORTED_RANGE_TEXT, SUPPORTED_TILELANG

def _parse_version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_host_version() -> str:
    """Return tilelang's version, or raise if the plugin does not support it."""
    try:
        import tilelang
    except ImportError as err:  # pragma: no cover - exercised only without tilelang
        raise UnsupportedHostError(f"tilelang_metal needs {SUPPORTED_RANGE_TEXT}; tilelang is not importable: {err}") from err
    version = str(getattr(tilelang, "__version__", "0"))
    parsed = _parse_version(version)
    low, high = SUPPORTED_TILELANG
    if not (low <= parsed < high):
        raise UnsupportedHostError(
            f"tilelang_metal supports {SUPPORTED_RANGE_TEXT}, found tilelang {version}. "
            "Install a supported tilelang (pip install 'tilelang==0.1.15') or a tilelang_metal release for your tilelang."
        )
    return version
