"""auth_failures: failed authentications per client address and minute, shared by the
API processes

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'auth_failures',
        sa.Column('name', sa.String(200), primary_key=True),
        sa.Column('window', sa.BigInteger(), primary_key=True),
        sa.Column('count', sa.Integer(), nullable=False, server_default=sa.text('0')),
    )


def downgrade() -> None:
    op.drop_table('auth_failures')
