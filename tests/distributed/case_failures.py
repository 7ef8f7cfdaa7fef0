"""Failure behaviour: filled in below."""
