"""held_models: the models each worker process holds loaded (the hold for a warm worker)

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'held_models',
        sa.Column('owner', sa.String(200), primary_key=True),
        sa.Column('model', sa.String(100), primary_key=True),
        sa.Column('loaded_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('seen_at', sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index('ix_held_models_model', 'held_models', ['model'])


def downgrade() -> None:
    op.drop_index('ix_held_models_model', table_name='held_models')
    op.drop_table('held_models')
