/* trace_json: a bounded streaming tokenizer for Chrome trace files (see trace_json.h).
 *
 * Invariants:
 *   J1. buf[0..len) holds uncompressed text; pos is the cursor; bytes before min(pos, mark) are
 *       dropped when the buffer refills, so at most one element (mark..pos) plus one read chunk
 *       is held at any time. An element longer than max_element is an error, never a realloc
 *       without bound.
 *   J2. off0 is the offset of buf[0] in the text; nl0 and bol0 count the newlines before it and
 *       the offset just after the last one, so every error can name line and column.
 *   J3. The tokenizer only finds where a value ends (brackets, strings with escapes, scalars);
 *       cJSON parses each element alone and is the judge of its validity.
 */
#include "src/trace_json.h"
#include "src/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK ((size_t)1 << 16)
#define NO_MARK ((size_t)-1)

struct tj {
    const char *name;
    struct ps_file_in in; /* the file (src/file.h: bounded, gzip on the fly); buf aliases its text */
    bool is_file;
    char *buf;
    size_t len, pos, cap, mark;
    bool eof;
    uint64_t off0, nl0, bol0;
    size_t max_el;
    const struct ps_tj_opts *opts;
    uint64_t next_progress, file_size;
    struct ps_tj_meta *meta;
    struct ps_diag *d;
};

static void where_at(struct tj *t, size_t p, char *out, size_t n)
{
    uint64_t line = t->nl0 + 1, bol = t->bol0;
    for (size_t k = 0; k < p && k < t->len; k++)
        if (t->buf[k] == '\n') line++, bol = t->off0 + k + 1;
    snprintf(out, n, "%s:%llu:%llu", t->name, (unsigned long long)line,
             (unsigned long long)(t->off0 + p - bol + 1));
}

static int syntax(struct tj *t, size_t p, const char *what)
{
    char w[PS_DIAG_WHERE_MAX];
    where_at(t, p, w, sizeof(w));
    return ps_diag_set(t->d, -EINVAL, w, "%s", what);
}

/* drop consumed text (J1, J2) */
static void compact(struct tj *t)
{
    size_t keep = t->mark != NO_MARK && t->mark < t->pos ? t->mark : t->pos;
    if (!keep || !t->is_file || keep < t->len / 2) return;
    for (size_t k = 0; k < keep; k++)
        if (t->buf[k] == '\n') t->nl0++, t->bol0 = t->off0 + k + 1;
    memmove(t->buf, t->buf + keep, t->len - keep + 1); /* with the NUL */
    t->len -= keep;
    t->in.len = t->len;
    t->pos -= keep;
    if (t->mark != NO_MARK) t->mark -= keep;
    t->off0 += keep;
}

/* Reads more text. Returns 1 when bytes were added, 0 at the end, < 0 on error. */
static int fill(struct tj *t)
{
    if (t->eof || !t->is_file) {
        t->eof = true;
        return 0;
    }
    compact(t);
    size_t before = t->in.len;
    int rc = ps_file_fill(&t->in, t->in.len + CHUNK, t->d);
    t->buf = t->in.text;
    t->len = t->in.len;
    if (rc) return rc;
    size_t got = t->in.len - before;
    if (!got) {
        t->eof = true;
        return 0;
    }
    t->meta->bytes += got;
    if (t->opts && t->opts->progress && t->meta->bytes >= t->next_progress) {
        bool gz = t->in.z != NULL; /* on-disk progress is known for plain files only */
        t->opts->progress(t->opts->progress_ctx, t->meta->bytes, gz ? 0 : t->off0 + t->len,
                          gz ? 0 : t->file_size);
        t->next_progress = t->meta->bytes + ((uint64_t)16 << 20);
    }
    return 1;
}

/* next byte without consuming it; -1 at the end, -2 on a read error */
static int peek(struct tj *t)
{
    while (t->pos >= t->len) {
        int r = fill(t);
        if (r < 0) return -2;
        if (r == 0) return -1;
    }
    return (unsigned char)t->buf[t->pos];
}

static int skip_ws(struct tj *t)
{
    for (;;) {
        int c = peek(t);
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') t->pos++;
        else return c;
    }
}

static bool scalar_char(int c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           c == '-' || c == '+' || c == '.';
}

/* Moves pos past one JSON value (J3). When capturing (mark set at its start) the value must
 * stay within max_el bytes. Returns 0 or an error; `path` names the value in errors. */
static int scan_value(struct tj *t, bool capture, const char *path)
{
    int c = skip_ws(t);
    if (c == -2) return t->d->code;
    if (c == -1) return syntax(t, t->pos, "not valid JSON (the file ends where a value should be)");
    if (capture) t->mark = t->pos;
    size_t start_abs = t->off0 + t->pos;
    int depth = 0;
    bool str = false, esc = false;
    if (c == '{' || c == '[' || c == '"') {
        for (;;) {
            c = peek(t);
            if (c == -2) return t->d->code;
            if (c == -1)
                return syntax(t, t->pos, "not valid JSON (the file ends inside a value)");
            t->pos++;
            if (str) {
                if (esc) esc = false;
                else if (c == '\\') esc = true;
                else if (c == '"') {
                    str = false;
                    if (depth == 0) break;
                }
            } else if (c == '"') {
                str = true;
            } else if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (--depth <= 0) break;
            }
            if (capture && t->off0 + t->pos - start_abs > t->max_el) {
                char sz[32];
                snprintf(sz, sizeof(sz), "%zu MiB", t->max_el >> 20);
                return ps_diag_set(t->d, -E2BIG, t->name, "%s: an element of more than %s",
                                   path, t->max_el >= ((size_t)1 << 20) ? sz : "its bound");
            }
        }
        return 0;
    }
    if (!scalar_char(c)) return syntax(t, t->pos, "not valid JSON");
    for (;;) {
        c = peek(t);
        if (c == -2) return t->d->code;
        if (c < 0 || !scalar_char(c)) return 0;
        t->pos++;
        if (t->off0 + t->pos - start_abs > 4096) return syntax(t, t->pos, "not valid JSON");
    }
}

/* parses buf[mark..pos) with cJSON; NULL with diag on error */
static cJSON *parse_marked(struct tj *t)
{
    const char *text = t->buf + t->mark, *end = NULL;
    size_t n = t->pos - t->mark;
    cJSON *v = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!v || (end && (size_t)(end - text) < n)) {
        size_t at = t->mark + (end && end >= text ? (size_t)(end - text) : 0);
        cJSON_Delete(v);
        syntax(t, at, "not valid JSON");
        return NULL;
    }
    return v;
}

static int events_array(struct tj *t, ps_tj_event_fn fn, void *ctx)
{
    t->meta->has_events = true;
    t->pos++; /* '[' */
    int c = skip_ws(t);
    if (c == -2) return t->d->code;
    if (c == ']') {
        t->pos++;
        return 0;
    }
    for (uint64_t k = 0;; k++) {
        char path[48];
        snprintf(path, sizeof(path), "traceEvents[%llu]", (unsigned long long)k);
        int rc = scan_value(t, true, path);
        if (rc) return rc;
        cJSON *ev = parse_marked(t);
        t->mark = NO_MARK;
        if (!ev) return t->d->code;
        t->meta->n_elements++;
        rc = fn(ctx, k, ev, t->d);
        cJSON_Delete(ev);
        if (rc) return rc;
        c = skip_ws(t);
        if (c == -2) return t->d->code;
        if (c == ',') {
            t->pos++;
            continue;
        }
        if (c == ']') {
            t->pos++;
            return 0;
        }
        return syntax(t, t->pos, c == -1 ? "not valid JSON (the file ends inside traceEvents)"
                                         : "not valid JSON");
    }
}

static void take_meta(struct tj *t, const char *key, const cJSON *v)
{
    struct ps_tj_meta *m = t->meta;
    if (!strcmp(key, "distributedInfo") && cJSON_IsObject(v)) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(v, "rank");
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(v, "world_size");
        if (cJSON_IsNumber(r) && r->valuedouble >= 0 && r->valuedouble < 1e9 &&
            r->valuedouble == (double)(int64_t)r->valuedouble)
            m->has_rank = true, m->rank = (int64_t)r->valuedouble;
        if (cJSON_IsNumber(w) && w->valuedouble >= 1 && w->valuedouble < 1e9)
            m->world_size = (int64_t)w->valuedouble;
    } else if (!strcmp(key, "otherData") && cJSON_IsObject(v)) {
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(v, "pipescope");
        const cJSON *src = cJSON_GetObjectItemCaseSensitive(v, "source");
        m->pipescope = ps != NULL;
        if (ps && cJSON_IsString(src)) snprintf(m->source, sizeof(m->source), "%s", src->valuestring);
    }
}

/* baseTimeNanoseconds: an exact integer (a double cannot hold 1.7e18 to the nanosecond) */
static int take_base(struct tj *t)
{
    const char *s = t->buf + t->mark;
    size_t n = t->pos - t->mark;
    char tmp[32];
    if (n == 0 || n >= sizeof(tmp)) goto bad;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(tmp, &end, 10);
    if (errno || *end || v < 0) goto bad;
    t->meta->has_base = true;
    t->meta->base_ns = v;
    return 0;
bad:
    return ps_diag_set(t->d, -EINVAL, t->name,
                       "baseTimeNanoseconds: expected an integer >= 0 below 2^63 (nanoseconds)");
}

static int document(struct tj *t, ps_tj_event_fn fn, void *ctx)
{
    int c = skip_ws(t);
    if (c == -2) return t->d->code;
    if (c == -1) return ps_diag_set(t->d, -EINVAL, t->name, "empty file (expected a Chrome trace)");
    int rc;
    if (c == '[') {
        t->meta->object = false;
        if ((rc = events_array(t, fn, ctx))) return rc;
    } else if (c == '{') {
        t->meta->object = true;
        t->pos++;
        c = skip_ws(t);
        if (c == -2) return t->d->code;
        if (c == '}') {
            t->pos++;
        } else {
            for (;;) {
                c = skip_ws(t);
                if (c == -2) return t->d->code;
                if (c != '"') return syntax(t, t->pos, "not valid JSON");
                if ((rc = scan_value(t, true, "key"))) return rc;
                cJSON *k = parse_marked(t);
                t->mark = NO_MARK;
                if (!k) return t->d->code;
                char key[64];
                snprintf(key, sizeof(key), "%s", cJSON_IsString(k) ? k->valuestring : "");
                cJSON_Delete(k);
                c = skip_ws(t);
                if (c == -2) return t->d->code;
                if (c != ':') return syntax(t, t->pos, "not valid JSON");
                t->pos++;
                c = skip_ws(t);
                if (c == -2) return t->d->code;
                if (!strcmp(key, "traceEvents")) {
                    if (c != '[')
                        return ps_diag_set(t->d, -EINVAL, t->name, "traceEvents: expected an array");
                    if ((rc = events_array(t, fn, ctx))) return rc;
                } else if (!strcmp(key, "distributedInfo") || !strcmp(key, "otherData")) {
                    if ((rc = scan_value(t, true, key))) return rc;
                    cJSON *v = parse_marked(t);
                    t->mark = NO_MARK;
                    if (!v) return t->d->code;
                    take_meta(t, key, v);
                    cJSON_Delete(v);
                } else if (!strcmp(key, "baseTimeNanoseconds")) {
                    if ((rc = scan_value(t, true, key))) return rc;
                    rc = take_base(t);
                    t->mark = NO_MARK;
                    if (rc) return rc;
                } else if ((rc = scan_value(t, false, key))) {
                    return rc;
                }
                c = skip_ws(t);
                if (c == -2) return t->d->code;
                if (c == ',') {
                    t->pos++;
                    continue;
                }
                if (c == '}') {
                    t->pos++;
                    break;
                }
                return syntax(t, t->pos, c == -1 ? "not valid JSON (the file ends inside the "
                                                   "top-level object)"
                                                 : "not valid JSON");
            }
        }
        if (!t->meta->has_events)
            return ps_diag_set(t->d, -EINVAL, t->name,
                               "traceEvents: missing (not a Chrome trace: expected an object with "
                               "\"traceEvents\" or an array of events)");
    } else {
        return ps_diag_set(t->d, -EINVAL, t->name,
                           "expected a JSON object with \"traceEvents\" or an array of events");
    }
    c = skip_ws(t);
    if (c == -2) return t->d->code;
    if (c != -1) return syntax(t, t->pos, "trailing data after the JSON document");
    return 0;
}

static int run(struct tj *t, const char *name, const struct ps_tj_opts *opts, ps_tj_event_fn fn,
               void *ctx, struct ps_tj_meta *meta, struct ps_diag *d)
{
    memset(meta, 0, sizeof(*meta));
    meta->world_size = -1;
    t->name = name;
    t->mark = NO_MARK;
    t->opts = opts;
    t->max_el = opts && opts->max_element ? opts->max_element : PS_TJ_MAX_ELEMENT;
    t->meta = meta;
    t->d = d;
    t->next_progress = (uint64_t)16 << 20;
    return document(t, fn, ctx);
}

int ps_tj_read_mem(const char *buf, size_t len, const char *name, const struct ps_tj_opts *opts,
                   ps_tj_event_fn fn, void *ctx, struct ps_tj_meta *meta, struct ps_diag *d)
{
    /* the whole text is there: the tokenizer only reads it (J1's dropping is for files) */
    struct tj t = {.buf = (char *)buf, .len = len, .eof = true, .file_size = len};
    return run(&t, name, opts, fn, ctx, meta, d);
}

int ps_tj_read_file(const char *path, const char *name, const struct ps_tj_opts *opts,
                    ps_tj_event_fn fn, void *ctx, struct ps_tj_meta *meta, struct ps_diag *d)
{
    if (!name) name = path;
    memset(meta, 0, sizeof(*meta));
    struct tj t = {.is_file = true};
    /* stream: the text held is about one element (J1); what the callback keeps per event it
       counts against the memory limit itself, so the file's size is never the limit */
    struct ps_file_opts fo = {.factor = 1, .gzip = true, .stream = true};
    int rc = ps_file_open(&t.in, path, &fo, d);
    if (rc) return rc;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) t.file_size = (uint64_t)st.st_size;
    t.buf = t.in.text;
    t.len = t.in.len;
    meta->bytes = t.len;
    rc = run(&t, name, opts, fn, ctx, meta, d);
    if (!rc) meta->bytes = t.off0 + t.len;
    ps_file_close(&t.in, false);
    return rc;
}
