"""The package version, in one place every layer may read."""
__version__ = "0.1.0"
