-- The three databases of payouts (DESIGN §3), created on the first start of
-- the compose PostgreSQL. Each role applies its own migrations (--migrate).
CREATE DATABASE paydb;
CREATE DATABASE proxydb;
CREATE DATABASE lockdb;
