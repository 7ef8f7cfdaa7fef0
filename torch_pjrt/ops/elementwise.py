"""Lowerings: elementwise family."""
