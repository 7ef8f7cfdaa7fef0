"""Lowerings: core family."""
