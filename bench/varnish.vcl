# Varnish as the bench's second peer: a cache in front of the reference upstream, keyed
# as the gateway and nginx key: path + query + the caller's Authorization header.
# bench/servers.py replaces @UPSTREAM_HOST@ and @UPSTREAM_PORT@ and runs
#   varnishd -F -n <tmp>/varnish/work -a 127.0.0.1:<port> -f <tmp>/varnish/bench.vcl \
#            -s malloc,512m -T none -j none
vcl 4.1;

backend reference {
    .host = "@UPSTREAM_HOST@";
    .port = "@UPSTREAM_PORT@";
}

sub vcl_recv {
    if (req.url == "/__bench_ready") {
        return (synth(204));
    }
    if (req.method != "GET" && req.method != "HEAD") {
        return (pass);
    }
    # The builtin vcl_recv passes every request that carries Authorization; here the
    # token is part of the key instead (vcl_hash), so each caller has its own entries.
    return (hash);
}

sub vcl_hash {
    hash_data(req.url);
    hash_data(req.http.Authorization);
    # not the builtin's Host: one entry per path + query + token, as nginx and the gateway
    return (lookup);
}

sub vcl_backend_response {
    if (beresp.status == 200) {
        # long-lived, as the gateway's TTLs in the bench; the upstream's own headers
        # (no Cache-Control) would give the default TTL
        set beresp.ttl = 3600s;
        set beresp.grace = 0s;
        return (deliver);
    }
    # anything else is passed on and never kept
    set beresp.ttl = 0s;
    set beresp.uncacheable = true;
    return (deliver);
}

sub vcl_deliver {
    # what nginx's $upstream_cache_status and the gateway's X-Cache say
    if (obj.hits > 0) {
        set resp.http.X-Cache = "HIT";
    } else {
        set resp.http.X-Cache = "MISS";
    }
}
