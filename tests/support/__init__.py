"""Helpers that start and inspect the real services the tests use."""
