"""Execution backends the plugin declares for Metal targets (torch on a Mac, the emulator on Linux)."""
