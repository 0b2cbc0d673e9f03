#!/usr/bin/env bash
# Start the local PostgreSQL 15 cluster and create the role the test suite uses
# (gandiva/gandiva on 127.0.0.1, allowed to create one database per test).
set -euo pipefail
pg_ctlcluster --skip-systemctl-redirect 15 main start 2>/dev/null || pg_ctlcluster --skip-systemctl-redirect 15 main status >/dev/null
for _ in $(seq 1 30); do
  su postgres -c "psql -qAtc 'select 1'" >/dev/null 2>&1 && break
  sleep 0.5
done
su postgres -c "psql -qAt" <<'SQL'
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gandiva') THEN
    CREATE ROLE gandiva LOGIN CREATEDB PASSWORD 'gandiva';
  END IF;
END $$;
SELECT 'CREATE DATABASE gandiva OWNER gandiva' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'gandiva')\gexec
-- Dropping a test database WITH (FORCE) must be able to end an autovacuum worker
-- that happens to be in it (such processes have no role of their own).
GRANT pg_signal_backend TO gandiva;
SQL
echo "PostgreSQL ready: postgresql+asyncpg://gandiva:gandiva@127.0.0.1:5432/gandiva"
