"""Lowerings: nn family."""
