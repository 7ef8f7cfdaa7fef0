"""Lowerings: foreach family."""
