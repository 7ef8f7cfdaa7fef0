"""Lowerings: reductions family."""
