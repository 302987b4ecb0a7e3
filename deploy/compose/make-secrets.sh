#!/bin/sh
# Random secrets for docker-compose.yml, one file each under deploy/compose/secrets/
# (git-ignored); an existing file is kept.
set -eu
dir="$(dirname "$0")/secrets"
mkdir -p "$dir"
put() { [ -s "$dir/$1" ] || { umask 077; printf '%s' "$2" > "$dir/$1"; echo "wrote $dir/$1"; }; }
put postgres_password "$(openssl rand -hex 24)"
put scheduler_token_secret "$(openssl rand -base64 48 | tr -d '\n')"
put webhook_password "$(openssl rand -hex 24)"
put webhook_secret "whsec_$(openssl rand -base64 32 | tr -d '\n')"
put grafana_admin_password "$(openssl rand -hex 16)"
# The containers run as uid 10001 and read these through bind mounts: let them.
chmod 0644 "$dir"/*
