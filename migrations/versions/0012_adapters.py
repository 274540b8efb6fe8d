"""adapters: LoRA adapters a tenant stored; each job's adapter set

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'adapters',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('tenant_id', sa.Uuid(), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=True),
        sa.Column('model', sa.String(length=100), nullable=False),
        sa.Column('family', sa.String(length=40), nullable=False),
        sa.Column('bytes', sa.Integer(), nullable=False),
        sa.Column('rank', sa.Integer(), nullable=False),
        sa.Column('layers', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('tenant_id', 'sha256', name='uq_adapters_tenant_id_sha256'),
    )
    op.add_column('jobs', sa.Column('adapter_set', sa.String(length=64), server_default=sa.text("''"), nullable=False))
    op.add_column('jobs', sa.Column('warm_skips', sa.Integer(), server_default=sa.text('0'), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('warm_skips')
        batch.drop_column('adapter_set')
    op.drop_table('adapters')
