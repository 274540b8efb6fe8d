"""The one declarative base, with a constraint naming convention alembic can rely on."""

from __future__ import annotations

from sqlalchemy import Index, MetaData, text
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def partial_index(name: str, *columns: str, where: str, **options) -> Index:
    """An index over the rows where `where` (SQL) holds, on PostgreSQL and SQLite alike."""
    return Index(name, *columns, postgresql_where=text(where), sqlite_where=text(where), **options)
