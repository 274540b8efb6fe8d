"""submit reservations: a tenant's submits in progress, counted by the queued cap

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


# PostgreSQL: take the slot in one call, made in autocommit, so that the tenant's lock
# is held only for the rest of the call and its commit, inside the server (each
# statement of a VOLATILE function sees what committed before it began, so the count
# sees every slot taken before the lock). Over the cap the call takes no slot.
RESERVE = """
CREATE OR REPLACE FUNCTION diffq_reserve_slot(
    p_job uuid, p_tenant uuid, p_cap bigint, p_now timestamptz, p_since timestamptz,
    p_lock bigint
) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    taken bigint;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO submit_reservations (job_id, tenant_id, created_at)
        VALUES (p_job, p_tenant, p_now);
    PERFORM pg_advisory_xact_lock(p_lock);
    SELECT (SELECT count(*) FROM jobs WHERE tenant_id = p_tenant AND status = 'queued')
         + (SELECT count(*) FROM submit_reservations
            WHERE tenant_id = p_tenant AND created_at > p_since)
      INTO taken;
    IF taken > p_cap THEN
        DELETE FROM submit_reservations WHERE job_id = p_job;
        RETURN false;
    END IF;
    RETURN true;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        'submit_reservations',
        sa.Column('job_id', sa.Uuid(), nullable=False),
        sa.Column('tenant_id', sa.Uuid(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('job_id'),
    )
    op.create_index('ix_submit_reservations_tenant_id_created_at', 'submit_reservations', ['tenant_id', 'created_at'], unique=False)
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(RESERVE)


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute('DROP FUNCTION IF EXISTS diffq_reserve_slot')
    op.drop_index('ix_submit_reservations_tenant_id_created_at', table_name='submit_reservations')
    op.drop_table('submit_reservations')
