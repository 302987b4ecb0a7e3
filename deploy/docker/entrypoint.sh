#!/bin/sh
# The image's entry point: `crater "$@"` (the default command is `run gateway`).
#
# Crater reads its own secrets from files itself (CRATER_..._FILE). Two secrets are read by
# others, from the environment only, so they are exported here from a file when one is named:
#   PGPASSWORD_FILE -> PGPASSWORD: the PostgreSQL password asyncpg uses when
#     CRATER_DATABASE_URL carries none (keep passwords out of the URL);
#   CRATER_RECEIVER_PASSWORD_FILE, CRATER_RECEIVER_SECRET_FILE -> the reference receiver's
#     options (`crater receiver`).
set -eu
for name in PGPASSWORD CRATER_RECEIVER_PASSWORD CRATER_RECEIVER_SECRET; do
  eval "file=\${${name}_FILE:-}"
  if [ -n "$file" ]; then
    value="$(cat "$file")" || { echo "crater-entrypoint: cannot read ${name}_FILE=$file" >&2; exit 2; }
    export "$name=$value"
    unset "${name}_FILE"
  fi
done
exec crater "$@"
