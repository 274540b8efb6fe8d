"""Persistence: typed models on one declarative base, engines and sessions, migrations."""
