"""Lowerings: indexing family."""
