"""Stub: see the package docstring."""
