"""Single source of the plugin version."""

__version__ = "0.1.0"
