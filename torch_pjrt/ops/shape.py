"""Lowerings: shape family."""
