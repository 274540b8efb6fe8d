"""used_tickets: WebSocket tickets already spent, so that each opens one socket

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'used_tickets',
        sa.Column('ticket_id', sa.String(length=32), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('ticket_id'),
    )
    op.create_index('ix_used_tickets_expires_at', 'used_tickets', ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_used_tickets_expires_at', table_name='used_tickets')
    op.drop_table('used_tickets')
