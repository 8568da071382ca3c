# shellcheck shell=bash disable=SC2034  # the variables set here are used by the sourcing script
# Helpers shared by the scripts under scripts/; sourced, not run.
# The sourcing script sets SCRIPT (its name, for messages) and WORK_PREFIX.

WORK=$(mktemp -d "/tmp/$WORK_PREFIX.XXXXXX")
PIDS=()
cleanup() {
    # Only what this script started, by process id.
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

say() { printf '%s\n' "$*"; }
die() {
    say "$SCRIPT: $*" >&2
    exit 1
}

# Command prefixes, not functions: taskset execs the program, so `$!` of a
# background job is the program itself, the process to measure and to stop.
if [ "$(nproc)" -ge 2 ]; then
    ON_SERVER=(taskset -c 0)
    ON_CLIENT=(taskset -c 1)
    PINNING="server on CPU 0, load tool on CPU 1 (taskset)"
else
    ON_SERVER=()
    ON_CLIENT=()
    PINNING="one CPU: server and load tool share it (no pinning)"
fi

# A port someone else listens on would be measured instead of ours.
check_free() {
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
        die "127.0.0.1:$1 is already in use; stop what listens there first"
    fi
}

# wait_port PORT PID TRIES: until PORT accepts (TRIES × 0.1 s), or PID exits.
wait_port() {
    local port=$1 pid=$2 tries=$3
    for _ in $(seq 1 "$tries"); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# nginx_main DIR: the top of an nginx configuration every script gives it:
# one worker, no master, no daemon, its error log and pid file in DIR.
nginx_main() {
    cat <<NGINX
worker_processes 1;
daemon off;
master_process off;
error_log $1/error.log warn;
pid $1/nginx.pid;
events { worker_connections 4096; }
NGINX
}

# nginx_http NAME BODY: an `http { … }` block with BODY (its servers and
# upstreams) inside: access log off, long-lived keep-alive connections (nthpool
# keeps a connection open as long as the client does; so does nginx here),
# its temporary files under $WORK/nginx-tmp/NAME-*.
nginx_http() {
    cat <<NGINX
http {
    access_log off;
    default_type application/json;
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
    client_body_temp_path $WORK/nginx-tmp/$1-body;
    proxy_temp_path $WORK/nginx-tmp/$1-proxy;
    fastcgi_temp_path $WORK/nginx-tmp/$1-fastcgi;
    uwsgi_temp_path $WORK/nginx-tmp/$1-uwsgi;
    scgi_temp_path $WORK/nginx-tmp/$1-scgi;
$2
}
NGINX
}

# nginx_http_block PORT [SHAPED_PORT]: the `http { … }` block scripts/bench.sh and
# scripts/callgrind.sh give nginx — one worker answering /grant.json with
# `return 200` and the body of a real grant ($WORK/www/grant.json, which must
# exist): the cheapest answer nginx has, the bar to beat. The same body answers
# POST /pools/bench/lock/acquire and `{"released":true}` any release, so wrk's
# Lua acquire -> release script runs unchanged against it.
# With SHAPED_PORT, a second server there answers acquires in nthpool's shape:
# a slotId that differs on every answer (its first 32 characters from nginx's
# $request_id) and the five x-nthpool-* governor headers, so a client's own
# cost of that shape can be told from the server's.
nginx_http_block() {
    local body shaped=""
    body=$(cat "$WORK/www/grant.json")
    case "$body" in *"'"*) die "the grant body holds a quote nginx cannot take" ;; esac
    if [ -n "${2:-}" ]; then
        local slot unique governor
        slot=$(sed 's/.*"slotId":"\([^"]*\)".*/\1/' "$WORK/www/grant.json")
        unique=${body/\"$slot\"/\"\${request_id\}${slot:32}\"}
        governor="add_header x-nthpool-remaining-slots 999999; add_header x-nthpool-effective-limit 1000000;
            add_header x-nthpool-queued-ms 0; add_header x-nthpool-limit 1000000; add_header x-nthpool-queue-depth 0;"
        shaped="
    server {
        listen 127.0.0.1:$2;
        location = /pools/bench/lock/acquire { $governor return 200 '$unique'; }
        location ~ ^/pools/bench/lock/[^/]+/release\$ { return 200 '{\"released\":true}'; }
    }"
    fi
    nginx_http grant "    server {
        listen 127.0.0.1:$1;
        location = /grant.json { return 200 '$body'; }
        # The lock routes wrk's acquire -> release script calls, so nginx can
        # be driven by the very same client work as nthpool.
        location = /pools/bench/lock/acquire { return 200 '$body'; }
        location ~ ^/pools/bench/lock/[^/]+/release\$ { return 200 '{\"released\":true}'; }
    }$shaped"
}

# nginx_upstream_server PORT BODY: the proxy benchmarks' fast upstream, which
# answers everything on PORT with `return 200` BODY (BODY holds no quote).
nginx_upstream_server() {
    printf '    server { listen 127.0.0.1:%s; location / { return 200 '"'"'%s'"'"'; } }\n' "$1" "$2"
}
# nginx_proxy_server UP_PORT PORT: nginx `proxy_pass` on PORT to the upstream on
# UP_PORT, with upstream keepalive (64 idle connections).
nginx_proxy_server() {
    cat <<NGINX
    upstream up { server 127.0.0.1:$1; keepalive 64; }
    server {
        listen 127.0.0.1:$2;
        location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
    }
NGINX
}

# nginx_proxy_confs UP_PORT PORT BODY: writes $WORK/upstream.conf (the fast
# upstream on UP_PORT answering BODY) and $WORK/front.conf (nginx `proxy_pass`
# on PORT to it), each nginx with its own directory under $WORK.
nginx_proxy_confs() {
    mkdir -p "$WORK/nginx-tmp" "$WORK/up" "$WORK/front"
    {
        nginx_main "$WORK/up"
        nginx_http up "$(nginx_upstream_server "$1" "$3")"
    } >"$WORK/upstream.conf"
    {
        nginx_main "$WORK/front"
        nginx_http front "$(nginx_proxy_server "$1" "$2")"
    } >"$WORK/front.conf"
}
