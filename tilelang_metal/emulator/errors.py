"""Exceptions of the emulator."""

from __future__ import annotations


class EmulatorError(Exception):
    """Base class of everything the emulator raises on purpose."""


class EmulatorCompileError(EmulatorError):
    """The MSL could not be rewritten or compiled; the message holds the diagnostics and source lines."""


class EmulatorRuntimeError(EmulatorError, RuntimeError):
    """A launch failed: out-of-bounds access, divergent barrier or collective, bad launch arguments."""


class EmulatorLaunchError(EmulatorRuntimeError, ValueError):
    """The arguments of `EmulatedKernel.launch` do not match the kernel (checked before running)."""


class EmulatorStackError(EmulatorCompileError):
    """The kernel's thread-private arrays do not fit the emulator's fiber stack limit (refused before building)."""


class EmulatorRaceError(EmulatorRuntimeError):
    """racecheck found a data race, an uninitialized read or schedule-dependent outputs."""
