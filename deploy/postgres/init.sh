#!/bin/sh
# The three databases of payouts (DESIGN §3) and the roles that serve them,
# created on the first start of the compose PostgreSQL. The owner (the
# image's POSTGRES_USER) applies the migrations (the migrate-* services);
# the payment resource and the rail proxy serve as roles with data
# privileges only, granted by `payouts migrate --grant-to`, so that neither
# can disable the triggers and indexes that guard its database.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v payment_pw="$(cat /run/secrets/payment_db_password)" \
  -v proxy_pw="$(cat /run/secrets/proxy_db_password)" <<'SQL'
CREATE DATABASE paydb;
CREATE DATABASE proxydb;
CREATE DATABASE lockdb;
CREATE ROLE payouts_payment LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'payment_pw';
CREATE ROLE payouts_proxy LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'proxy_pw';
SQL
