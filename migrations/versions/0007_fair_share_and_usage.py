"""fair share and cost: tenants' weight and daily GPU-second quota; each job's GPU
seconds, device and the message it ran on; daily usage per tenant, model and device

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('tenants', sa.Column('weight', sa.Float(), nullable=False, server_default=sa.text('1')))
    op.add_column('tenants', sa.Column('daily_gpu_seconds', sa.Float(), nullable=True))
    op.add_column('jobs', sa.Column('gpu_seconds', sa.Float(), nullable=True))
    op.add_column('jobs', sa.Column('device', sa.String(length=100), nullable=True))
    op.add_column('jobs', sa.Column('permit_id', sa.Uuid(), nullable=True))
    op.create_index('ix_jobs_queue_finished', 'jobs', ['queue', 'finished_at'], unique=False)
    op.create_index('ix_jobs_permit', 'jobs', ['permit_id'], unique=False, postgresql_where=sa.text("status = 'running'"), sqlite_where=sa.text("status = 'running'"))
    op.create_table(
        'daily_usage',
        sa.Column('tenant_id', sa.Uuid(), nullable=False),
        sa.Column('day', sa.Date(), nullable=False),
        sa.Column('model', sa.String(length=100), nullable=False),
        sa.Column('device', sa.String(length=100), nullable=False),
        sa.Column('gpu_seconds', sa.Float(), nullable=False),
        sa.Column('jobs', sa.Integer(), nullable=False),
        sa.Column('images', sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('tenant_id', 'day', 'model', 'device'),
    )


def downgrade() -> None:
    op.drop_table('daily_usage')
    op.drop_index('ix_jobs_permit', table_name='jobs', postgresql_where=sa.text("status = 'running'"), sqlite_where=sa.text("status = 'running'"))
    op.drop_index('ix_jobs_queue_finished', table_name='jobs')
    op.drop_column('jobs', 'permit_id')
    op.drop_column('jobs', 'device')
    op.drop_column('jobs', 'gpu_seconds')
    op.drop_column('tenants', 'daily_gpu_seconds')
    op.drop_column('tenants', 'weight')
