"""Alembic migrations for the diffq schema."""
