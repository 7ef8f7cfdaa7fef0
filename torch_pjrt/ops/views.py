"""Lowerings: views family."""
