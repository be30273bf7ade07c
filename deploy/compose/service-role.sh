#!/bin/sh
# Runs once, when the db volume is initialised (/docker-entrypoint-initdb.d): the role the service
# connects as owns its database and nothing more; POSTGRES_USER stays the operators' superuser.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v role="$PETSTORE_DB_USER" -v password="$PETSTORE_DB_PASSWORD" -v database="$POSTGRES_DB" <<'SQL'
CREATE ROLE :"role" LOGIN PASSWORD :'password';
ALTER DATABASE :"database" OWNER TO :"role";
SQL
