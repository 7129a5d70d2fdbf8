#!/bin/sh
# The three databases of payouts (DESIGN §3) and the roles that serve them,
# created on the first start of the compose PostgreSQL. The owner (the
# image's POSTGRES_USER) applies the migrations (the migrate-* services);
# the payment resource and the rail proxy serve as roles with data
# privileges only, granted by `payouts migrate --grant-to`, so that neither
# can disable the triggers and indexes that guard its database.
#
# The image runs this as its postgres user (uid 999), not as root: the
# serving roles' password files must be readable by that user. A password
# that cannot be read, or is empty, stops the first start here: PostgreSQL
# would take an empty password for none, and the servers could never log in.
set -eu
secrets=${PAYOUTS_SECRETS_DIR:-/run/secrets}
password() {
  if ! pw=$(cat "$secrets/$1"); then
    echo "init.sh: cannot read $secrets/$1 as $(id -un) (uid $(id -u)): make the file readable by that user (docs/operations.md)" >&2
    exit 1
  fi
  if [ -z "$pw" ]; then
    echo "init.sh: $secrets/$1 is empty" >&2
    exit 1
  fi
  printf '%s' "$pw"
}
payment_pw=$(password payment_db_password)
proxy_pw=$(password proxy_db_password)
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v payment_pw="$payment_pw" -v proxy_pw="$proxy_pw" <<'SQL'
CREATE DATABASE paydb;
CREATE DATABASE proxydb;
CREATE DATABASE lockdb;
CREATE ROLE payouts_payment LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'payment_pw';
CREATE ROLE payouts_proxy LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'proxy_pw';
SQL
