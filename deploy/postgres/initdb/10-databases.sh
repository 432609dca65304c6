#!/usr/bin/env bash
# Creates the two databases of the deployment, each owned by a login role of its own:
#
#   airflow          Airflow's metadata database (and the Celery result backend)
#   dbspark_catalog  the dbspark trace catalog (epochs, batches, iterations)
#
# The official postgres image runs the files in /docker-entrypoint-initdb.d once, when
# the data volume is empty (first start), as the superuser on a local socket.
# Passwords come from the container's environment (set in docker-compose.yml from
# .env); psql variables quote them, so any character is safe. Changing a password
# later means ALTER ROLE, or a fresh volume: this script does not run again.
#
# tests/deploy/test_compose_file.py reads the create_database lines below: the
# database, its role and the variable holding the role's password.
set -eo pipefail  # no -u: the entrypoint sources this file when it is not executable

create_database() {
    local database="$1" role="$2" password="$3"
    if [[ -z "${password}" ]]; then
        echo "initdb: no password for role ${role} (database ${database})" >&2
        return 1
    fi
    psql --set ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER}" --dbname postgres \
        --set role="${role}" --set database="${database}" --set password="${password}" <<'SQL'
CREATE ROLE :"role" LOGIN PASSWORD :'password';
CREATE DATABASE :"database" OWNER :"role" ENCODING 'UTF8';
REVOKE ALL ON DATABASE :"database" FROM PUBLIC;
SQL
    echo "initdb: created database ${database} owned by role ${role}"
}

create_database airflow airflow "${AIRFLOW_DB_PASSWORD}"
create_database dbspark_catalog dbspark "${DBSPARK_CATALOG_DB_PASSWORD}"
