"""Lowerings: linalg family."""
