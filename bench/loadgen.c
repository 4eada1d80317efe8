/*
 * The bench's load client for the mix workload (bench/README.md, "The mix").
 *
 * wrk sends one request over and over, and its Lua cannot give each connection a token
 * of its own. This client keeps C connections open over HTTP/1.1 (keep-alive), spread
 * over N threads, each with its own epoll; connection i carries ONE token for its whole
 * life, token i mod T, as a service's connection does, and draws every request's target
 * from that token's keys by their weights (a splitmix64 stream per connection, seeded
 * from --seed and i, and a binary search over the cumulative weights). One request is in
 * flight per connection (closed loop): the next is written as soon as the last byte of
 * the answer is read. Answers must be framed by Content-Length; anything else (chunked,
 * no length, bytes after the body, a head over 16 KiB) stops the run with a message on
 * stderr and exit status 2.
 *
 * The shape of the traffic (all off by default; each draw below comes from the
 * connection's own stream, so a run is the same sequence of requests every time):
 *   --pooled               each request draws its token uniformly among all the tokens,
 *                          then a key of that token by weight (a pooled client's
 *                          connection carrying many callers);
 *   --gzip-share F         each request carries Accept-Encoding: gzip with probability F
 *                          (both forms of every request are built once, at start);
 *   --conditional-share F  each thread remembers the ETag of the last 200 answer of each
 *                          (token, key, gzip or not), up to 256 bytes; a request of a
 *                          variant whose ETag is known carries If-None-Match with
 *                          probability F (a 200 without an ETag forgets it);
 *   --close                each request carries Connection: close and goes on a
 *                          connection of its own; its latency runs from connect();
 *   --rate R               open loop at R requests/s over all connections: connection i
 *                          of C sends its k-th request at t0 + (i / C + k) * C / R (t0:
 *                          when the threads start), at once if that time has passed when
 *                          its last answer completes, never two at a time; a timerfd per
 *                          thread wakes it otherwise. Latency runs from the intended
 *                          time (coordinated omission accounted, as wrk2 does).
 *
 * A warm-up phase (--warmup seconds, not counted) is followed by the measured phase
 * (--duration seconds). A request counts when its answer completes in the measured
 * phase (so do its gzip and conditional flags); its latency runs from the write of its
 * first byte (or as above) to the read of its last byte, kept in a log-linear histogram
 * (128 linear buckets per power of two of nanoseconds: at most 0.4 % off). A connect
 * counts in the phase it is made. The CPU time (utime, stime from /proc/PID/stat) of
 * every --cpu-pid is read when the measured phase starts and when it ends, and the
 * client's own (getrusage), so that CPU per request is over the same window; a process
 * gone by the end (nginx's cache loader exits a minute after start) is reported as
 * "exited", its CPU unknown.
 *
 * The report is one JSON object on stdout; it states the shape it ran ("shape") and,
 * open loop, the offered and achieved rates and the largest lag of a send behind its
 * intended time ("rate"; null in a closed loop). Usage:
 *
 *   loadgen --port PORT --keys FILE [--host 127.0.0.1] [--threads 2] [--connections 48]
 *           [--warmup 2] [--duration 5] [--seed 1] [--header "Name: value"]...
 *           [--cpu-pid PID]... [--pooled] [--gzip-share F] [--conditional-share F]
 *           [--close] [--rate R]
 *
 * The keys file, written by bench/mix.py: "token <Authorization value>" starts a token's
 * keys; each following "<weight> <target>" line is one of its keys (a positive weight and
 * a request target sent as it is, starting with '/'); '#' starts a comment line.
 */

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define HEAD_MAX 16384
#define READ_CHUNK 262144
#define MAX_HEADERS 16
#define MAX_PIDS 64
#define MAX_STATUS 600
/* Latency histogram: values in ns; below 128 one bucket each, then 128 per power of 2. */
#define SUB_BITS 7
#define SUB_COUNT (1 << SUB_BITS)
#define MAX_EXPONENT 40 /* 2^40 ns, about 18 minutes: anything longer is clamped */
#define BUCKETS (SUB_COUNT + (MAX_EXPONENT - SUB_BITS) * SUB_COUNT)
#define REQUEST_TIMEOUT_NS (10ull * 1000000000ull)
#define ETAG_MAX 256 /* a longer ETag is not remembered */
#define IF_NONE_MATCH "If-None-Match: "
/* the remembered line: "If-None-Match: <etag>\r\n\r\n", the end of the request */
#define CONDITION_MAX (sizeof IF_NONE_MATCH - 1 + ETAG_MAX + 4)

enum phase { WARMUP = 0, MEASURE = 1, STOP = 2 };
/* IDLE: no request on the wire (open loop: waiting for its intended time; --close:
 * between connections) */
enum state { CONNECTING, WRITING, HEAD, BODY, IDLE };

struct request {
    /* the whole request: line, Host, Authorization, extra headers, Connection: close with
     * --close; [1] adds Accept-Encoding: gzip (built only with --gzip-share) */
    char *bytes[2];
    size_t len[2];
    const char *target;
    size_t index; /* over the keys of all tokens: where its ETags are remembered */
    size_t token;
};

/* the ETag of the last 200 answer of one (token, key, gzip or not), as the line sent */
struct condition {
    size_t len; /* 0: none known */
    char line[CONDITION_MAX];
};

struct token {
    char *authorization;
    struct request *requests;
    double *cumulative; /* running sum of the weights, in file order */
    size_t count;
    size_t capacity;
};

struct tally {
    uint64_t requests;
    uint64_t statuses[MAX_STATUS];
    uint64_t other_status;
    uint64_t bytes;      /* heads and bodies */
    uint64_t body_bytes; /* Content-Length of the answers */
    uint64_t gzip;       /* answers with Content-Encoding: gzip */
    uint64_t gzip_requests;        /* answered requests sent with Accept-Encoding: gzip */
    uint64_t conditional_requests; /* answered requests sent with If-None-Match */
    uint64_t connects;             /* connect() calls made */
    uint64_t behind_max_ns;        /* open loop: the largest lag of a send behind its time */
    uint64_t x_cache_hit;
    uint64_t x_cache_miss;
    uint64_t x_cache_other;
    uint64_t x_cache_none;
    uint64_t reconnects; /* the server closed a kept-alive connection (not counted: --close) */
    uint64_t retries;    /* closed before any byte of the answer: sent again */
    uint64_t read_errors;
    uint64_t connect_errors;
    uint64_t timeouts;
    uint64_t latency_sum_ns;
    uint64_t latency_max_ns;
    uint64_t histogram[BUCKETS];
};

struct thread;

struct conn {
    int fd; /* -1: none (--close, between requests) */
    int index;
    int token; /* without --pooled, the token of every request */
    enum state state;
    const struct request *request; /* NULL: none chosen yet */
    int gzip;                      /* the request is sent in its gzip form */
    int waiting;                   /* open loop: chosen, its intended time not come yet */
    size_t written;
    uint64_t started_ns; /* where its latency runs from */
    uint64_t sent_ns;    /* the last write of it began (its timeout runs from there) */
    uint64_t intended_ns;
    uint64_t sent_count; /* open loop: requests issued so far (k) */
    double offset_ns;    /* open loop: i / C * C / R, in ns */
    uint64_t rng;
    size_t condition_len; /* > 0: the request ends with this If-None-Match line */
    char condition[CONDITION_MAX];
    size_t head_len;
    uint64_t body_left;
    int close_after;
    /* what the answer's head said, counted with the request once its body is whole (in
       the phase it completes in: an answer cut by the end is counted as nothing) */
    int status;
    int answer_gzip;
    int x_cache; /* 0 none, 1 HIT, 2 MISS, 3 another */
    uint64_t answer_bytes;
    uint64_t answer_body;
    struct thread *thread;
    char head[HEAD_MAX];
};

struct thread {
    pthread_t id;
    int epoll;
    struct conn *conns;
    int count;
    struct tally warm;
    struct tally measured;
    uint64_t *by_token; /* measured requests of each token */
    char *chunk;
    struct condition *conditions; /* 2 per key (identity, gzip); with --conditional-share */
    int timer;                    /* open loop: a timerfd at the earliest intended time */
    uint64_t armed_ns;            /* when the timer is set to fire; 0: not armed */
};

static struct {
    const char *host;
    int port;
    const char *keys;
    int threads;
    int connections;
    double warmup_s;
    double duration_s;
    uint64_t seed;
    const char *headers[MAX_HEADERS];
    int header_count;
    int pids[MAX_PIDS];
    int pid_count;
    int pooled;
    double gzip_share;
    double conditional_share;
    int close;
    double rate; /* requests/s over all connections; 0: closed loop */
} opt = {"127.0.0.1", 0, NULL, 2, 48, 2.0, 5.0, 1, {0}, 0, {0}, 0, 0, 0.0, 0.0, 0, 0.0};

static struct token *tokens;
static size_t token_count;
static size_t key_count;
static uint64_t t0_ns; /* when the threads start: the open loop's schedule begins there */
static double interval_ns; /* open loop: C / R, in ns */
static struct sockaddr_in address;
static _Atomic int phase = WARMUP;

static void fatal(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fputs("loadgen: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(2);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* splitmix64: one 64-bit state per connection, a fast and well-mixed stream. */
static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* a number in [0, 1) from the connection's stream */
static double unit(struct conn *c) { return (double)(splitmix64(&c->rng) >> 11) * 0x1.0p-53; }

static const struct request *draw(struct conn *c, size_t token) {
    const struct token *t = &tokens[token];
    double total = t->cumulative[t->count - 1];
    double point = unit(c) * total;
    size_t low = 0, high = t->count - 1; /* the first cumulative weight above point */
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (t->cumulative[middle] > point)
            high = middle;
        else
            low = middle + 1;
    }
    return &t->requests[low];
}

/* ---- the keys file ---- */

static char *trimmed(char *line) {
    size_t len = strlen(line);
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
    return line;
}

static void add_key(struct token *t, double weight, const char *target, size_t line_no) {
    if (!(weight > 0) || !isfinite(weight))
        fatal("%s:%zu: the weight must be a positive number", opt.keys, line_no);
    if (target[0] != '/')
        fatal("%s:%zu: the target must start with '/': %s", opt.keys, line_no, target);
    for (const char *p = target; *p; p++)
        if ((unsigned char)*p <= ' ' || (unsigned char)*p >= 0x7f)
            fatal("%s:%zu: a space, control or non-ASCII byte in the target (percent-encode it)",
                  opt.keys, line_no);
    if (t->count == t->capacity) {
        t->capacity = t->capacity ? t->capacity * 2 : 64;
        t->requests = realloc(t->requests, t->capacity * sizeof *t->requests);
        t->cumulative = realloc(t->cumulative, t->capacity * sizeof *t->cumulative);
        if (!t->requests || !t->cumulative) fatal("out of memory");
    }
    struct request *r = &t->requests[t->count];
    *r = (struct request){.target = strdup(target), .index = key_count++, .token = token_count - 1};
    for (int gzip = 0; gzip < (opt.gzip_share > 0 ? 2 : 1); gzip++) {
        size_t extra = 0;
        for (int i = 0; i < opt.header_count; i++) extra += strlen(opt.headers[i]) + 2;
        size_t size = strlen(target) + strlen(t->authorization) + strlen(opt.host) + extra + 160;
        char *bytes = malloc(size);
        if (!bytes) fatal("out of memory");
        int len = snprintf(bytes, size, "GET %s HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: %s\r\n",
                           target, opt.host, opt.port, t->authorization);
        for (int i = 0; i < opt.header_count; i++)
            len += snprintf(bytes + len, size - (size_t)len, "%s\r\n", opt.headers[i]);
        if (gzip) len += snprintf(bytes + len, size - (size_t)len, "Accept-Encoding: gzip\r\n");
        if (opt.close) len += snprintf(bytes + len, size - (size_t)len, "Connection: close\r\n");
        len += snprintf(bytes + len, size - (size_t)len, "\r\n");
        r->bytes[gzip] = bytes;
        r->len[gzip] = (size_t)len;
    }
    t->cumulative[t->count] = (t->count ? t->cumulative[t->count - 1] : 0.0) + weight;
    t->count++;
}

static void read_keys(void) {
    FILE *file = fopen(opt.keys, "r");
    if (!file) fatal("cannot open %s: %s", opt.keys, strerror(errno));
    char *line = NULL;
    size_t capacity = 0, line_no = 0, token_capacity = 0;
    while (getline(&line, &capacity, file) >= 0) {
        line_no++;
        trimmed(line);
        if (line[0] == '\0' || line[0] == '#') continue;
        if (strncmp(line, "token ", 6) == 0) {
            if (token_count == token_capacity) {
                token_capacity = token_capacity ? token_capacity * 2 : 32;
                tokens = realloc(tokens, token_capacity * sizeof *tokens);
                if (!tokens) fatal("out of memory");
            }
            tokens[token_count] = (struct token){.authorization = strdup(line + 6)};
            token_count++;
            continue;
        }
        if (token_count == 0) fatal("%s:%zu: a key before the first token line", opt.keys, line_no);
        char *space = strchr(line, ' ');
        if (!space) fatal("%s:%zu: expected \"<weight> <target>\"", opt.keys, line_no);
        *space = '\0';
        char *end;
        double weight = strtod(line, &end);
        if (*end != '\0') fatal("%s:%zu: the weight is not a number", opt.keys, line_no);
        add_key(&tokens[token_count - 1], weight, space + 1, line_no);
    }
    free(line);
    fclose(file);
    if (token_count == 0) fatal("%s: no token", opt.keys);
    for (size_t i = 0; i < token_count; i++)
        if (tokens[i].count == 0) fatal("%s: token %zu has no key", opt.keys, i);
}

/* ---- one connection ---- */

static void record(struct tally *t, uint64_t latency_ns) {
    unsigned index;
    if (latency_ns < SUB_COUNT) {
        index = (unsigned)latency_ns;
    } else {
        unsigned exponent = 63u - (unsigned)__builtin_clzll(latency_ns);
        if (exponent >= MAX_EXPONENT) {
            index = BUCKETS - 1;
        } else {
            unsigned shift = exponent - SUB_BITS;
            index = SUB_COUNT + shift * SUB_COUNT + (unsigned)((latency_ns >> shift) - SUB_COUNT);
        }
    }
    t->histogram[index]++;
    t->latency_sum_ns += latency_ns;
    if (latency_ns > t->latency_max_ns) t->latency_max_ns = latency_ns;
}

static double bucket_value_ns(unsigned index) {
    if (index < SUB_COUNT) return index;
    unsigned shift = (index - SUB_COUNT) / SUB_COUNT;
    unsigned sub = (index - SUB_COUNT) % SUB_COUNT;
    double width = (double)(1ull << shift);
    return (double)(SUB_COUNT + sub) * width + width / 2; /* the bucket's middle */
}

static void watch(struct conn *c, uint32_t events, int op) {
    struct epoll_event event = {.events = events, .data.ptr = c};
    if (epoll_ctl(c->thread->epoll, op, c->fd, &event) != 0)
        fatal("epoll_ctl: %s", strerror(errno));
}

static struct tally *tally_of(struct thread *t) {
    return atomic_load_explicit(&phase, memory_order_relaxed) == MEASURE ? &t->measured : &t->warm;
}

static void start_connect(struct conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) fatal("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->state = CONNECTING;
    tally_of(c->thread)->connects++;
    if (opt.close && opt.rate <= 0) c->started_ns = now_ns(); /* connection set-up counts */
    if (connect(c->fd, (struct sockaddr *)&address, sizeof address) != 0 && errno != EINPROGRESS)
        fatal("connect to %s:%d: %s", opt.host, opt.port, strerror(errno));
    watch(c, EPOLLOUT, EPOLL_CTL_ADD);
}

static void reconnect(struct conn *c) {
    close(c->fd); /* also takes it out of the epoll set */
    start_connect(c);
}

/* Write what is left of the current request (and its If-None-Match line); returns 0 once
 * all is written. */
static int write_rest(struct conn *c) {
    const char *bytes = c->request->bytes[c->gzip];
    /* a conditional request ends with its own line: the request's final "\r\n" gives way */
    size_t first = c->request->len[c->gzip] - (c->condition_len ? 2 : 0);
    size_t total = first + c->condition_len;
    while (c->written < total) {
        struct iovec parts[2];
        int count = 0;
        if (c->written < first) {
            parts[count++] = (struct iovec){(void *)(bytes + c->written), first - c->written};
            if (c->condition_len) parts[count++] = (struct iovec){c->condition, c->condition_len};
        } else {
            size_t done = c->written - first;
            parts[count++] = (struct iovec){c->condition + done, c->condition_len - done};
        }
        ssize_t n = writev(c->fd, parts, count);
        if (n < 0) {
            if (errno == EAGAIN) return 1;
            if (errno == EINTR) continue;
            return -1;
        }
        c->written += (size_t)n;
    }
    return 0;
}

static void retry_after_close(struct conn *c, int partial) {
    /* the server closed a kept-alive connection (or reset it): before any byte of the
     * answer, the request is sent again on a new connection; after some, it is an error */
    struct tally *t = tally_of(c->thread);
    if (partial)
        t->read_errors++;
    else
        t->retries++;
    reconnect(c); /* c->request is written once connected */
}

static void send_request(struct conn *c) {
    c->written = 0;
    c->head_len = 0;
    c->state = WRITING;
    c->sent_ns = now_ns();
    if (!opt.close && opt.rate <= 0) c->started_ns = c->sent_ns;
    int left = write_rest(c);
    if (left < 0) {
        retry_after_close(c, 0);
    } else if (left > 0) {
        watch(c, EPOLLIN | EPOLLOUT, EPOLL_CTL_MOD);
    } else {
        c->state = HEAD;
    }
}

/* Choose the next request: its token (--pooled), key, form (--gzip-share) and condition
 * (--conditional-share), each drawn only when its option is on. */
static void choose(struct conn *c) {
    size_t token = (size_t)c->token;
    if (opt.pooled)
        token = (size_t)(((unsigned __int128)splitmix64(&c->rng) * token_count) >> 64);
    c->request = draw(c, token);
    c->gzip = opt.gzip_share > 0 && unit(c) < opt.gzip_share;
    c->condition_len = 0;
    if (opt.conditional_share > 0) {
        const struct condition *known = &c->thread->conditions[c->request->index * 2 + c->gzip];
        if (known->len && unit(c) < opt.conditional_share) {
            memcpy(c->condition, known->line, known->len); /* the memory may change meanwhile */
            c->condition_len = known->len;
        }
    }
}

static void arm(struct thread *th, uint64_t at_ns) {
    if (th->armed_ns && th->armed_ns <= at_ns) return;
    th->armed_ns = at_ns;
    struct itimerspec when = {.it_value = {(time_t)(at_ns / 1000000000ull),
                                           (long)(at_ns % 1000000000ull)}};
    if (timerfd_settime(th->timer, TFD_TIMER_ABSTIME, &when, NULL) != 0)
        fatal("timerfd_settime: %s", strerror(errno));
}

/* Put the chosen request on the wire: now, on its own connection with --close, or once
 * the connection being opened is up. */
static void dispatch(struct conn *c, uint64_t now) {
    c->waiting = 0;
    if (opt.rate > 0) {
        struct tally *t = tally_of(c->thread);
        uint64_t behind = now > c->intended_ns ? now - c->intended_ns : 0;
        if (behind > t->behind_max_ns) t->behind_max_ns = behind;
    }
    if (c->fd < 0)
        start_connect(c);
    else if (c->state != CONNECTING)
        send_request(c);
}

static void next_request(struct conn *c) {
    choose(c);
    uint64_t now = opt.rate > 0 ? now_ns() : 0;
    if (opt.rate > 0) {
        c->intended_ns = t0_ns + (uint64_t)(c->offset_ns + (double)c->sent_count * interval_ns);
        c->sent_count++;
        c->started_ns = c->intended_ns;
        if (now < c->intended_ns) {
            c->waiting = 1;
            if (c->state != CONNECTING) c->state = IDLE;
            arm(c->thread, c->intended_ns);
            return;
        }
    }
    dispatch(c, now);
}

static void on_timer(struct thread *th) {
    uint64_t expirations;
    if (read(th->timer, &expirations, sizeof expirations) < 0 && errno != EAGAIN)
        fatal("timerfd read: %s", strerror(errno));
    th->armed_ns = 0;
    uint64_t now = now_ns(), next = 0;
    for (int i = 0; i < th->count; i++) {
        struct conn *c = &th->conns[i];
        if (!c->waiting) continue;
        if (c->intended_ns <= now)
            dispatch(c, now);
        else if (next == 0 || c->intended_ns < next)
            next = c->intended_ns;
    }
    if (next) arm(th, next);
}

static int header_is(const char *line, size_t len, const char *name, const char **value) {
    size_t name_len = strlen(name);
    if (len <= name_len || line[name_len] != ':' || strncasecmp(line, name, name_len) != 0)
        return 0;
    const char *v = line + name_len + 1;
    while (v < line + len && (*v == ' ' || *v == '\t')) v++;
    *value = v;
    return 1;
}

static int value_has(const char *value, const char *end, const char *word) {
    size_t len = strlen(word);
    for (const char *p = value; p + len <= end; p++)
        if (strncasecmp(p, word, len) == 0) return 1;
    return 0;
}

/* The If-None-Match line of an ETag, or nothing: none, empty or over ETAG_MAX bytes. */
static void remember(struct condition *known, const char *etag, size_t len) {
    known->len = 0;
    if (!etag || len == 0 || len > ETAG_MAX) return;
    size_t prefix = sizeof IF_NONE_MATCH - 1;
    memcpy(known->line, IF_NONE_MATCH, prefix);
    memcpy(known->line + prefix, etag, len);
    memcpy(known->line + prefix + len, "\r\n\r\n", 4);
    known->len = prefix + len + 4;
}

/* Parse the head of an answer: status, Content-Length and the headers counted. */
static void parse_head(struct conn *c, size_t head_size) {
    const char *head = c->head, *end = c->head + head_size - 2;
    const char *target = c->request->target;
    if (head_size < 16 || strncmp(head, "HTTP/1.", 7) != 0 || head[8] != ' ')
        fatal("not an HTTP/1.x answer to GET %s: %.40s", target, head);
    int status = atoi(head + 9);
    c->status = status;
    c->answer_gzip = 0;
    int64_t length = -1;
    int x_cache = 0;
    const char *etag = NULL;
    size_t etag_len = 0;
    c->close_after = strncmp(head, "HTTP/1.0", 8) == 0;
    const char *line = (const char *)memchr(head, '\n', head_size) + 1;
    while (line < end) {
        const char *eol = memchr(line, '\r', (size_t)(end - line));
        if (!eol) eol = end;
        size_t len = (size_t)(eol - line);
        const char *value;
        if (header_is(line, len, "Content-Length", &value)) {
            char *stop;
            long long parsed = strtoll(value, &stop, 10);
            if (stop == value || parsed < 0) fatal("a bad Content-Length in the answer to %s", target);
            length = parsed;
        } else if (header_is(line, len, "Transfer-Encoding", &value)) {
            fatal("the answer to GET %s has Transfer-Encoding (%.*s): only Content-Length "
                  "framing is read",
                  target, (int)(eol - value), value);
        } else if (header_is(line, len, "Content-Encoding", &value)) {
            if (value_has(value, eol, "gzip")) c->answer_gzip = 1;
        } else if (header_is(line, len, "Connection", &value)) {
            if (value_has(value, eol, "close")) c->close_after = 1;
            if (value_has(value, eol, "keep-alive")) c->close_after = 0;
        } else if (header_is(line, len, "ETag", &value)) {
            etag = value;
            etag_len = (size_t)(eol - value);
            while (etag_len > 0 && (etag[etag_len - 1] == ' ' || etag[etag_len - 1] == '\t'))
                etag_len--;
        } else if (header_is(line, len, "X-Cache", &value)) {
            if (strncasecmp(value, "HIT", 3) == 0)
                x_cache = 1;
            else if (strncasecmp(value, "MISS", 4) == 0)
                x_cache = 2;
            else
                x_cache = 3;
        }
        line = eol + 2;
    }
    c->x_cache = x_cache;
    if (status == 200 && opt.conditional_share > 0) /* what the variant is now */
        remember(&c->thread->conditions[c->request->index * 2 + c->gzip], etag, etag_len);
    if (length < 0) {
        if (status == 204 || status == 304 || (status >= 100 && status < 200))
            length = 0;
        else
            fatal("the answer to GET %s (status %d) has no Content-Length", target, status);
    }
    c->body_left = (uint64_t)length;
    c->answer_bytes = head_size + (uint64_t)length;
    c->answer_body = (uint64_t)length;
}

static void complete(struct conn *c, uint64_t now) {
    struct thread *th = c->thread;
    struct tally *t = tally_of(th);
    t->requests++;
    if (c->status >= 0 && c->status < MAX_STATUS)
        t->statuses[c->status]++;
    else
        t->other_status++;
    t->gzip += (uint64_t)c->answer_gzip;
    if (c->x_cache == 1)
        t->x_cache_hit++;
    else if (c->x_cache == 2)
        t->x_cache_miss++;
    else if (c->x_cache == 3)
        t->x_cache_other++;
    else
        t->x_cache_none++;
    t->body_bytes += c->answer_body;
    t->bytes += c->answer_bytes;
    t->gzip_requests += (uint64_t)c->gzip;
    t->conditional_requests += c->condition_len > 0;
    record(t, now - c->started_ns);
    if (t == &th->measured) th->by_token[c->request->token]++;
    if (opt.close || c->close_after) {
        if (!opt.close) t->reconnects++;
        close(c->fd); /* also takes it out of the epoll set */
        c->fd = -1;
        c->state = IDLE;
    }
    next_request(c);
}

/* The bytes just read on a connection waiting for (part of) an answer. */
static void on_bytes(struct conn *c, const char *bytes, size_t n) {
    while (n > 0) {
        if (c->state == HEAD) {
            size_t room = HEAD_MAX - c->head_len, take = n < room ? n : room;
            size_t before = c->head_len, from = before >= 3 ? before - 3 : 0;
            memcpy(c->head + before, bytes, take);
            c->head_len += take;
            char *found = memmem(c->head + from, c->head_len - from, "\r\n\r\n", 4);
            if (!found) {
                if (c->head_len == HEAD_MAX)
                    fatal("the head of the answer to GET %s is over %d bytes", c->request->target,
                          HEAD_MAX);
                return;
            }
            size_t head_size = (size_t)(found + 4 - c->head), used = head_size - before;
            parse_head(c, head_size);
            bytes += used;
            n -= used;
            c->state = BODY;
        } else if (c->state == BODY) {
            if (n > c->body_left)
                fatal("%zu bytes more than Content-Length after the answer to GET %s",
                      n - (size_t)c->body_left, c->request->target);
            c->body_left -= n;
            n = 0;
        } else {
            fatal("bytes from the server while no request was waiting (after GET %s)",
                  c->request ? c->request->target : "-");
        }
        if (c->state == BODY && c->body_left == 0) {
            if (n > 0)
                fatal("%zu bytes after the answer to GET %s (one request is in flight)", n,
                      c->request->target);
            complete(c, now_ns());
            return;
        }
    }
}

static void on_event(struct conn *c, uint32_t events) {
    struct thread *th = c->thread;
    if (c->state == CONNECTING) {
        int error = 0;
        socklen_t len = sizeof error;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &len);
        if (error != 0) {
            if (error != ECONNREFUSED && error != ECONNRESET && error != ETIMEDOUT)
                fatal("connect to %s:%d: %s", opt.host, opt.port, strerror(error));
            tally_of(th)->connect_errors++;
            reconnect(c);
            return;
        }
        watch(c, EPOLLIN, EPOLL_CTL_MOD);
        c->state = IDLE; /* up, nothing on the wire yet */
        if (!c->request)
            next_request(c);
        else if (!c->waiting)
            send_request(c);
        return;
    }
    if (c->state == WRITING && (events & EPOLLOUT)) {
        int left = write_rest(c);
        if (left < 0) {
            retry_after_close(c, 0);
            return;
        }
        if (left == 0) {
            c->state = HEAD;
            watch(c, EPOLLIN, EPOLL_CTL_MOD);
        }
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    for (;;) {
        ssize_t n = read(c->fd, th->chunk, READ_CHUNK);
        if (n > 0) {
            int fd = c->fd;
            on_bytes(c, th->chunk, (size_t)n);
            /* a short read drained the socket, and after an answer the next request went
             * out (or the connection was replaced, or waits): epoll says when there is more */
            if ((size_t)n < READ_CHUNK || c->fd != fd || c->head_len == 0 ||
                c->state == CONNECTING || c->state == IDLE)
                return;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return;
        if (c->state == IDLE) { /* closed while its next request waits for its time */
            tally_of(th)->reconnects++;
            reconnect(c);
            return;
        }
        /* closed (0) or reset: before any byte of the answer it is sent again */
        int partial = c->state == BODY || c->head_len > 0;
        retry_after_close(c, partial);
        return;
    }
}

static void *run_thread(void *arg) {
    struct thread *th = arg;
    struct epoll_event events[256];
    for (int i = 0; i < th->count; i++) {
        struct conn *c = &th->conns[i];
        if (opt.close) /* a connection per request, opened when it is sent */
            next_request(c);
        else
            start_connect(c);
    }
    uint64_t last_check = now_ns();
    while (atomic_load_explicit(&phase, memory_order_relaxed) != STOP) {
        int ready = epoll_wait(th->epoll, events, 256, 100);
        if (ready < 0) {
            if (errno == EINTR) continue;
            fatal("epoll_wait: %s", strerror(errno));
        }
        for (int i = 0; i < ready; i++) {
            if (events[i].data.ptr == th)
                on_timer(th);
            else
                on_event(events[i].data.ptr, events[i].events);
        }
        uint64_t now = now_ns();
        if (now - last_check > 1000000000ull) { /* a request unanswered for 10 s: again */
            last_check = now;
            for (int i = 0; i < th->count; i++) {
                struct conn *c = &th->conns[i];
                if (c->state != CONNECTING && c->state != IDLE &&
                    now - c->sent_ns > REQUEST_TIMEOUT_NS) {
                    tally_of(th)->timeouts++;
                    reconnect(c); /* c->request is written again once connected */
                }
            }
        }
    }
    return NULL;
}

/* ---- CPU of the servers and of this client ---- */

struct cpu {
    double user_s;
    double system_s;
    int exited; /* gone by the end of the measured phase: its CPU is not known */
};

static struct cpu pid_cpu(int pid, int must_exist) {
    char path[64], text[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *file = fopen(path, "r");
    if (!file && !must_exist) return (struct cpu){0, 0, 1};
    if (!file) fatal("cannot read %s: %s (did the server exit?)", path, strerror(errno));
    size_t len = fread(text, 1, sizeof text - 1, file);
    fclose(file);
    text[len] = '\0';
    /* pid (comm) state ppid ... : comm may hold spaces, so count from the last ')' */
    char *p = strrchr(text, ')');
    if (!p) fatal("cannot parse %s", path);
    unsigned long long utime = 0, stime = 0;
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        fatal("cannot parse %s", path);
    double tick = (double)sysconf(_SC_CLK_TCK);
    return (struct cpu){utime / tick, stime / tick, 0};
}

static struct cpu own_cpu(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return (struct cpu){usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6,
                        usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6, 0};
}

static void sleep_s(double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- the report ---- */

static void merge(struct tally *into, const struct tally *from) {
    into->requests += from->requests;
    for (int i = 0; i < MAX_STATUS; i++) into->statuses[i] += from->statuses[i];
    into->other_status += from->other_status;
    into->bytes += from->bytes;
    into->body_bytes += from->body_bytes;
    into->gzip += from->gzip;
    into->gzip_requests += from->gzip_requests;
    into->conditional_requests += from->conditional_requests;
    into->connects += from->connects;
    if (from->behind_max_ns > into->behind_max_ns) into->behind_max_ns = from->behind_max_ns;
    into->x_cache_hit += from->x_cache_hit;
    into->x_cache_miss += from->x_cache_miss;
    into->x_cache_other += from->x_cache_other;
    into->x_cache_none += from->x_cache_none;
    into->reconnects += from->reconnects;
    into->retries += from->retries;
    into->read_errors += from->read_errors;
    into->connect_errors += from->connect_errors;
    into->timeouts += from->timeouts;
    into->latency_sum_ns += from->latency_sum_ns;
    if (from->latency_max_ns > into->latency_max_ns) into->latency_max_ns = from->latency_max_ns;
    for (int i = 0; i < BUCKETS; i++) into->histogram[i] += from->histogram[i];
}

static double percentile_ms(const struct tally *t, double q) {
    if (t->requests == 0) return 0.0;
    uint64_t rank = (uint64_t)ceil(q * (double)t->requests), seen = 0;
    if (rank == 0) rank = 1;
    for (unsigned i = 0; i < BUCKETS; i++) {
        seen += t->histogram[i];
        if (seen >= rank) return bucket_value_ns(i) / 1e6;
    }
    return t->latency_max_ns / 1e6;
}

static void print_statuses(const struct tally *t) {
    printf("{");
    int first = 1;
    for (int i = 0; i < MAX_STATUS; i++) {
        if (!t->statuses[i]) continue;
        printf("%s\"%d\": %llu", first ? "" : ", ", i, (unsigned long long)t->statuses[i]);
        first = 0;
    }
    if (t->other_status)
        printf("%s\"other\": %llu", first ? "" : ", ", (unsigned long long)t->other_status);
    printf("}");
}

static void print_tally(const char *name, const struct tally *t) {
    printf("  \"%s\": {\"requests\": %llu, \"statuses\": ", name, (unsigned long long)t->requests);
    print_statuses(t);
    printf(", \"bytes\": %llu, \"body_bytes\": %llu, \"gzip_answers\": %llu,\n",
           (unsigned long long)t->bytes, (unsigned long long)t->body_bytes,
           (unsigned long long)t->gzip);
    printf("    \"x_cache\": {\"HIT\": %llu, \"MISS\": %llu, \"other\": %llu, \"none\": %llu},\n",
           (unsigned long long)t->x_cache_hit, (unsigned long long)t->x_cache_miss,
           (unsigned long long)t->x_cache_other, (unsigned long long)t->x_cache_none);
    printf("    \"gzip_requests\": %llu, \"conditional_requests\": %llu, \"connects\": %llu,\n",
           (unsigned long long)t->gzip_requests, (unsigned long long)t->conditional_requests,
           (unsigned long long)t->connects);
    printf("    \"reconnects\": %llu, \"retries\": %llu, \"read_errors\": %llu, "
           "\"connect_errors\": %llu, \"timeouts\": %llu}",
           (unsigned long long)t->reconnects, (unsigned long long)t->retries,
           (unsigned long long)t->read_errors, (unsigned long long)t->connect_errors,
           (unsigned long long)t->timeouts);
}

static void usage(void) {
    fputs("usage: loadgen --port PORT --keys FILE [--host 127.0.0.1] [--threads 2] "
          "[--connections 48] [--warmup 2] [--duration 5] [--seed 1] "
          "[--header 'Name: value']... [--cpu-pid PID]... [--pooled] [--gzip-share F] "
          "[--conditional-share F] [--close] [--rate R]\n",
          stderr);
    exit(2);
}

/* a number in [low, high] (high: infinity for none) or the usage */
static double number_in(const char *name, const char *value, double low, double high) {
    char *end;
    double number = strtod(value, &end);
    if (end == value || *end != '\0' || !isfinite(number) || number < low || number > high)
        fatal("%s wants a number in [%g, %g]: %s", name, low, high, value);
    return number;
}

static void parse_args(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];
        if (strcmp(name, "--pooled") == 0) {
            opt.pooled = 1;
            continue;
        }
        if (strcmp(name, "--close") == 0) {
            opt.close = 1;
            continue;
        }
        if (i + 1 >= argc) usage();
        const char *value = argv[++i];
        if (strcmp(name, "--host") == 0)
            opt.host = value;
        else if (strcmp(name, "--port") == 0)
            opt.port = atoi(value);
        else if (strcmp(name, "--keys") == 0)
            opt.keys = value;
        else if (strcmp(name, "--threads") == 0)
            opt.threads = atoi(value);
        else if (strcmp(name, "--connections") == 0)
            opt.connections = atoi(value);
        else if (strcmp(name, "--warmup") == 0)
            opt.warmup_s = atof(value);
        else if (strcmp(name, "--duration") == 0)
            opt.duration_s = atof(value);
        else if (strcmp(name, "--seed") == 0)
            opt.seed = strtoull(value, NULL, 10);
        else if (strcmp(name, "--header") == 0 && opt.header_count < MAX_HEADERS)
            opt.headers[opt.header_count++] = value;
        else if (strcmp(name, "--cpu-pid") == 0 && opt.pid_count < MAX_PIDS)
            opt.pids[opt.pid_count++] = atoi(value);
        else if (strcmp(name, "--gzip-share") == 0)
            opt.gzip_share = number_in(name, value, 0, 1);
        else if (strcmp(name, "--conditional-share") == 0)
            opt.conditional_share = number_in(name, value, 0, 1);
        else if (strcmp(name, "--rate") == 0)
            opt.rate = number_in(name, value, 0, INFINITY);
        else
            usage();
    }
    if (opt.port <= 0 || opt.port > 65535 || !opt.keys || opt.threads < 1 ||
        opt.connections < opt.threads || opt.warmup_s < 0 || opt.duration_s <= 0)
        usage();
    for (int i = 0; i < opt.header_count; i++)
        if (!strchr(opt.headers[i], ':') || strpbrk(opt.headers[i], "\r\n"))
            fatal("--header wants one \"Name: value\" line: %s", opt.headers[i]);
}

int main(int argc, char **argv) {
    parse_args(argc, argv);
    address.sin_family = AF_INET;
    address.sin_port = htons((uint16_t)opt.port);
    if (inet_pton(AF_INET, opt.host, &address.sin_addr) != 1)
        fatal("--host must be an IPv4 address: %s", opt.host);
    read_keys();

    struct thread *threads = calloc((size_t)opt.threads, sizeof *threads);
    if (!threads) fatal("out of memory");
    for (int k = 0; k < opt.threads; k++) {
        struct thread *th = &threads[k];
        /* contiguous blocks: with C a multiple of T x tokens every thread carries every token */
        int first = k * opt.connections / opt.threads;
        int last = (k + 1) * opt.connections / opt.threads;
        th->count = last - first;
        th->conns = calloc((size_t)th->count, sizeof *th->conns);
        th->by_token = calloc(token_count, sizeof *th->by_token);
        th->chunk = malloc(READ_CHUNK);
        th->epoll = epoll_create1(EPOLL_CLOEXEC);
        if (!th->conns || !th->by_token || !th->chunk || th->epoll < 0) fatal("out of resources");
        if (opt.conditional_share > 0) {
            th->conditions = calloc(key_count * 2, sizeof *th->conditions);
            if (!th->conditions) fatal("out of memory");
        }
        if (opt.rate > 0) {
            th->timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
            struct epoll_event event = {.events = EPOLLIN, .data.ptr = th};
            if (th->timer < 0 || epoll_ctl(th->epoll, EPOLL_CTL_ADD, th->timer, &event) != 0)
                fatal("timerfd: %s", strerror(errno));
        }
        for (int i = 0; i < th->count; i++) {
            struct conn *c = &th->conns[i];
            c->fd = -1;
            c->state = IDLE;
            c->index = first + i;
            c->token = (int)((size_t)c->index % token_count);
            c->thread = th;
            c->rng = opt.seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)c->index + 1);
            splitmix64(&c->rng);
            c->started_ns = c->sent_ns = now_ns();
            if (opt.rate > 0) c->offset_ns = c->index * 1e9 / opt.rate;
        }
    }
    if (opt.rate > 0) interval_ns = opt.connections * 1e9 / opt.rate;
    uint64_t started = now_ns();
    t0_ns = started;
    for (int k = 0; k < opt.threads; k++)
        if (pthread_create(&threads[k].id, NULL, run_thread, &threads[k]) != 0)
            fatal("pthread_create failed");

    sleep_s(opt.warmup_s);
    struct cpu servers_before[MAX_PIDS];
    for (int i = 0; i < opt.pid_count; i++) servers_before[i] = pid_cpu(opt.pids[i], 1);
    struct cpu client_before = own_cpu();
    uint64_t measure_start = now_ns();
    atomic_store(&phase, MEASURE);
    sleep_s(opt.duration_s);
    atomic_store(&phase, STOP);
    uint64_t measure_end = now_ns();
    struct cpu client_after = own_cpu();
    struct cpu servers_after[MAX_PIDS];
    for (int i = 0; i < opt.pid_count; i++) {
        struct cpu now = pid_cpu(opt.pids[i], 0);
        if (now.exited) { /* counted as nothing */
            now = servers_before[i];
            now.exited = 1;
        }
        servers_after[i] = now;
    }
    for (int k = 0; k < opt.threads; k++) pthread_join(threads[k].id, NULL);

    static struct tally warm, measured;
    uint64_t *by_token = calloc(token_count, sizeof *by_token);
    for (int k = 0; k < opt.threads; k++) {
        merge(&warm, &threads[k].warm);
        merge(&measured, &threads[k].measured);
        for (size_t i = 0; i < token_count; i++) by_token[i] += threads[k].by_token[i];
    }
    double seconds = (double)(measure_end - measure_start) / 1e9;
    size_t keys = 0;
    for (size_t i = 0; i < token_count; i++) keys += tokens[i].count;

    printf("{\n  \"threads\": %d, \"connections\": %d, \"tokens\": %zu, \"keys\": %zu, "
           "\"seed\": %llu,\n",
           opt.threads, opt.connections, token_count, keys, (unsigned long long)opt.seed);
    printf("  \"warmup_s\": %.3f, \"duration_s\": %.6f, \"elapsed_s\": %.3f,\n", opt.warmup_s,
           seconds, (double)(measure_end - started) / 1e9);
    printf("  \"requests_per_s\": %.1f,\n", measured.requests / seconds);
    printf("  \"shape\": {\"pooled\": %s, \"gzip_share\": %.10g, \"conditional_share\": %.10g, "
           "\"close\": %s},\n",
           opt.pooled ? "true" : "false", opt.gzip_share, opt.conditional_share,
           opt.close ? "true" : "false");
    if (opt.rate > 0)
        printf("  \"rate\": {\"offered_per_s\": %.10g, \"achieved_per_s\": %.1f, "
               "\"behind_max_ms\": %.4f},\n",
               opt.rate, measured.requests / seconds, measured.behind_max_ns / 1e6);
    else
        printf("  \"rate\": null,\n");
    printf("  \"latency_ms\": {\"p50\": %.4f, \"p99\": %.4f, \"p999\": %.4f, \"mean\": %.4f, "
           "\"max\": %.4f},\n",
           percentile_ms(&measured, 0.50), percentile_ms(&measured, 0.99),
           percentile_ms(&measured, 0.999),
           measured.requests ? (double)measured.latency_sum_ns / measured.requests / 1e6 : 0.0,
           measured.latency_max_ns / 1e6);
    print_tally("measured", &measured);
    printf(",\n");
    print_tally("warmup", &warm);
    printf(",\n  \"requests_by_token\": [");
    for (size_t i = 0; i < token_count; i++)
        printf("%s%llu", i ? ", " : "", (unsigned long long)by_token[i]);
    printf("],\n  \"client_cpu\": {\"user_s\": %.4f, \"system_s\": %.4f},\n",
           client_after.user_s - client_before.user_s,
           client_after.system_s - client_before.system_s);
    printf("  \"server_cpu\": [");
    for (int i = 0; i < opt.pid_count; i++)
        printf("%s{\"pid\": %d, \"user_s\": %.2f, \"system_s\": %.2f, \"exited\": %s}",
               i ? ", " : "", opt.pids[i], servers_after[i].user_s - servers_before[i].user_s,
               servers_after[i].system_s - servers_before[i].system_s,
               servers_after[i].exited ? "true" : "false");
    printf("]\n}\n");
    fflush(stdout);
    /* in-flight requests are abandoned: exit without closing every socket in turn */
    _exit(0);
}
