"""authenticate a request in one call: the key's lookup, its rate-limit count and its
last-used time

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


# PostgreSQL, called in autocommit (app/keys.py `admit`): one round trip per request for
# what took a transaction of four statements. Nothing is counted for a key that does not
# match: the presented key's SHA-256 is compared here (a hash of a 256-bit secret, so the
# comparison's timing tells nothing usable). The count and last_used_at are written
# without waiting for the WAL flush: one lost in a crash lets one extra request through.
AUTHENTICATE = """
CREATE OR REPLACE FUNCTION diffq_authenticate(
    p_key_id text, p_digest text, p_window timestamptz, p_limit bigint,
    p_now timestamptz, p_stale_before timestamptz
) RETURNS TABLE (tenant uuid, daily_gpu_seconds double precision, requests bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    found_tenant uuid;
    quota double precision;
    used_at timestamptz;
    counted bigint := 0;
BEGIN
    SELECT k.tenant_id, t.daily_gpu_seconds, k.last_used_at
      INTO found_tenant, quota, used_at
      FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
     WHERE k.key_id = p_key_id AND k.revoked_at IS NULL AND k.secret_hash = p_digest;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    IF p_limit > 0 THEN
        INSERT INTO request_counts AS c (key_id, window_start, count)
            VALUES (p_key_id, p_window, 1)
            ON CONFLICT (key_id, window_start) DO UPDATE SET count = c.count + 1
            RETURNING c.count INTO counted;
    END IF;
    IF used_at IS NULL OR used_at < p_stale_before THEN
        UPDATE api_keys SET last_used_at = p_now WHERE key_id = p_key_id;
    END IF;
    tenant := found_tenant;
    daily_gpu_seconds := quota;
    requests := counted;
    RETURN NEXT;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(AUTHENTICATE)


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute('DROP FUNCTION IF EXISTS diffq_authenticate')
