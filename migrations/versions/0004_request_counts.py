"""request counts per API key and window (rate limits shared by every API process);
jobs' data_removed_at (result retention) and admitted_at (cap on jobs in flight)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'request_counts',
        sa.Column('key_id', sa.String(length=32), nullable=False),
        sa.Column('window_start', sa.DateTime(timezone=True), nullable=False),
        sa.Column('count', sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint('key_id', 'window_start'),
    )
    op.add_column('jobs', sa.Column('data_removed_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('jobs', sa.Column('admitted_at', sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE jobs SET admitted_at = created_at")  # every existing job was let through
    op.create_index('ix_jobs_held', 'jobs', ['tenant_id', 'publish_priority', 'id'], unique=False, postgresql_where=sa.text("admitted_at IS NULL AND status = 'queued'"), sqlite_where=sa.text("admitted_at IS NULL AND status = 'queued'"))
    op.create_index('ix_jobs_retention', 'jobs', ['finished_at'], unique=False, postgresql_where=sa.text("status = 'succeeded' AND data_removed_at IS NULL"), sqlite_where=sa.text("status = 'succeeded' AND data_removed_at IS NULL"))


def downgrade() -> None:
    op.drop_index('ix_jobs_retention', table_name='jobs', postgresql_where=sa.text("status = 'succeeded' AND data_removed_at IS NULL"), sqlite_where=sa.text("status = 'succeeded' AND data_removed_at IS NULL"))
    op.drop_index('ix_jobs_held', table_name='jobs', postgresql_where=sa.text("admitted_at IS NULL AND status = 'queued'"), sqlite_where=sa.text("admitted_at IS NULL AND status = 'queued'"))
    op.drop_column('jobs', 'admitted_at')
    op.drop_column('jobs', 'data_removed_at')
    op.drop_table('request_counts')
