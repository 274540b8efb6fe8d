"""model_pauses: models an operator paused; api_keys.operator; jobs.yield_reason and
jobs.preemptions

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'model_pauses',
        sa.Column('model', sa.String(100), primary_key=True),
        sa.Column('paused_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('now', sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column('reason', sa.String(200), nullable=True),
        sa.Column('paused_by', sa.String(100), nullable=True),
    )
    op.add_column(
        'api_keys',
        sa.Column('operator', sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.add_column('jobs', sa.Column('yield_reason', sa.String(20), nullable=True))
    op.add_column(
        'jobs',
        sa.Column('preemptions', sa.Integer(), nullable=False, server_default=sa.text('0')),
    )


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('preemptions')
        batch.drop_column('yield_reason')
    with op.batch_alter_table('api_keys') as batch:
        batch.drop_column('operator')
    op.drop_table('model_pauses')
