/* file: input files read whole or line by line, never past the memory limit (file.h).
 *
 * Invariants:
 *   F1. in->text never holds more than in->limit bytes (the memory limit divided by the
 *       caller's factor), plus its NUL: reading one byte more is the error, so /dev/zero, an
 *       endless FIFO or a gzip bomb stops at the limit with a message, never at the OOM killer.
 *   F2. A regular file is checked against the limit from its size before a byte is read, so a
 *       file that cannot fit fails at once with what it would need.
 *   F3. in->text is NUL-terminated after every successful open and fill.
 *   F4. Errors name the file as the user gave it; past the limit also the line and column where
 *       reading stopped.
 *   F5. Gzip (magic 1f 8b, when the caller allows it) is decompressed on the fly, members one
 *       after another as gzip(1) does; a truncated or corrupt stream is an error, never a
 *       silently short text.
 *   F6. Every regular file opened is remembered by device and inode (ps_file_inputs), so that
 *       the outputs can refuse to replace it.
 */
#include "src/file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "src/memlimit.h"

#define CHUNK ((size_t)1 << 16)

void ps_file_line_col(const char *text, size_t pos, int *line, int *col)
{
    long l = 1, c = 1;
    for (size_t i = 0; i < pos; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch == '\n') {
            l++;
            c = 1;
        } else if ((ch & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l > INT_MAX ? INT_MAX : (int)l;
    *col = c > INT_MAX ? INT_MAX : (int)c;
}

static int read_error(struct ps_file_in *in, int e, struct ps_diag *d)
{
    if (in->opts.noun)
        return ps_diag_set(d, -e, in->path, "cannot read %s: %s", in->opts.noun, strerror(e));
    return ps_diag_set(d, -e, in->path, "cannot read: %s", strerror(e));
}

/* F1 and F4: the text would pass the limit. */
static int too_big(struct ps_file_in *in, struct ps_diag *d)
{
    char where[PS_DIAG_WHERE_MAX], nb[32], lb[32];
    int line, col;
    ps_file_line_col(in->text + in->line_from, in->len - in->line_from, &line, &col);
    line = (int)((long)line + in->base_line > INT_MAX ? INT_MAX : line + in->base_line);
    if (in->opts.max_bytes && in->len > in->opts.max_bytes) {
        return ps_diag_set(d, -EFBIG, in->path, "file exceeds the limit of %zu bytes (%s)",
                           in->opts.max_bytes,
                           ps_memlimit_format((double)in->opts.max_bytes, lb, sizeof(lb)));
    }
    uint64_t limit = 0;
    struct ps_diag ignore = {0};
    ps_memlimit_get(&limit, &ignore);
    snprintf(where, sizeof(where), "%s:%d:%d", in->path, line, col);
    ps_diag_set(d, -E2BIG, where, "reading this file would need more than %s of memory; the limit is %s",
                ps_memlimit_format((double)in->len * in->opts.factor, nb, sizeof(nb)),
                ps_memlimit_format((double)limit, lb, sizeof(lb)));
    ps_diag_hint(d, "use a smaller file, or raise the limit with %s=SIZE (e.g. 64G)",
                 PS_MEMLIMIT_ENV);
    return -E2BIG;
}

static int set_cap(struct ps_file_in *in, size_t nc, struct ps_diag *d)
{
    char *t = realloc(in->text, nc);
    if (!t) return ps_diag_set(d, -ENOMEM, in->path, "out of memory reading the file");
    in->text = t;
    in->cap = nc;
    return 0;
}

/* At least one free byte besides the NUL: the buffer doubles, but never holds more than
 * limit + 1 bytes of text (F1: the extra byte proves the file is too big). */
static int grow(struct ps_file_in *in, struct ps_diag *d)
{
    if (in->cap >= in->len + 2) return 0;
    size_t most = in->limit + 2;
    size_t nc = in->cap < CHUNK ? CHUNK : in->cap > SIZE_MAX / 2 ? SIZE_MAX : in->cap * 2;
    if (nc > most) nc = most;
    if (nc <= in->cap) return too_big(in, d);
    return set_cap(in, nc, d);
}

/* read(2) that retries EINTR; returns bytes, 0 at the end, or -errno. */
static ssize_t read_fd(int fd, void *buf, size_t n)
{
    for (;;) {
        ssize_t r = read(fd, buf, n > (size_t)1 << 30 ? (size_t)1 << 30 : n);
        if (r >= 0) return r;
        if (errno != EINTR) return -errno;
    }
}

static struct ps_file_input *inputs;
static int n_inputs, cap_inputs;

/* F6: remembers a regular file opened (once per identity); out of memory forgets nothing
 * silently: the caller's open fails. */
static int remember_input(const char *path, const struct stat *st, struct ps_diag *d)
{
    for (int k = 0; k < n_inputs; k++)
        if (inputs[k].dev == (uint64_t)st->st_dev && inputs[k].ino == (uint64_t)st->st_ino) return 0;
    if (n_inputs == cap_inputs) {
        int nc = cap_inputs ? cap_inputs * 2 : 16;
        struct ps_file_input *p = realloc(inputs, (size_t)nc * sizeof(*p));
        if (!p) return ps_diag_set(d, -ENOMEM, path, "out of memory");
        inputs = p;
        cap_inputs = nc;
    }
    inputs[n_inputs++] = (struct ps_file_input){(uint64_t)st->st_dev, (uint64_t)st->st_ino,
                                                realpath(path, NULL)};
    return 0;
}

int ps_file_inputs(const struct ps_file_input **list)
{
    *list = inputs;
    return n_inputs;
}

int ps_file_open(struct ps_file_in *in, const char *path, const struct ps_file_opts *o,
                 struct ps_diag *d)
{
    memset(in, 0, sizeof(*in));
    in->fd = -1;
    in->path = path;
    if (o) in->opts = *o;
    if (!(in->opts.factor >= 1)) in->opts.factor = 1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (in->opts.noun)
            return ps_diag_set(d, -e, path, "cannot read %s: %s", in->opts.noun, strerror(e));
        return ps_diag_set(d, -e, path, "cannot open: %s", strerror(e));
    }
    in->fd = fd;
    uint64_t limit;
    int rc = ps_memlimit_get(&limit, d);
    struct stat st;
    if (rc == 0 && fstat(fd, &st) != 0) rc = read_error(in, errno, d);
    if (rc == 0 && S_ISDIR(st.st_mode)) rc = read_error(in, EISDIR, d);
    if (rc == 0 && S_ISREG(st.st_mode)) rc = remember_input(path, &st, d);
    if (rc == 0 && S_ISREG(st.st_mode)) {
        in->regular = true;
        if (in->opts.max_bytes && (uint64_t)st.st_size > in->opts.max_bytes) {
            char lb[32];
            rc = ps_diag_set(d, -EFBIG, path, "file exceeds the limit of %zu bytes (%s)",
                             in->opts.max_bytes,
                             ps_memlimit_format((double)in->opts.max_bytes, lb, sizeof(lb)));
        } else if (!in->opts.stream) {
            rc = ps_memlimit_check(in->opts.factor * (double)st.st_size, path, "reading this file",
                                   "use a smaller file", d);
        }
    }
    if (rc == 0) {
        double text = (double)limit / in->opts.factor;
        in->limit = text >= (double)(SIZE_MAX / 2) ? SIZE_MAX / 2 : (uint64_t)text;
        if (in->opts.max_bytes && in->opts.max_bytes < in->limit) in->limit = in->opts.max_bytes;
        /* a regular file's size plus the NUL and one byte to see the end in one read */
        size_t first = CHUNK;
        if (in->regular && !in->opts.stream && (uint64_t)st.st_size < in->limit)
            first = (size_t)st.st_size + 2;
        if (first > in->limit + 2) first = in->limit + 2;
        rc = set_cap(in, first, d);
    }
    if (rc == 0 && in->opts.gzip) {
        /* peek at two bytes; for a FIFO they cannot be put back, so they stay in zin */
        in->zin = malloc(CHUNK);
        if (!in->zin) rc = ps_diag_set(d, -ENOMEM, path, "out of memory");
        while (rc == 0 && in->zin_len < 2) {
            ssize_t r = read_fd(fd, in->zin + in->zin_len, 2 - in->zin_len);
            if (r < 0) rc = read_error(in, (int)-r, d);
            if (r <= 0) break;
            in->zin_len += (size_t)r;
        }
        if (rc == 0 && in->zin_len == 2 && in->zin[0] == 0x1f && in->zin[1] == 0x8b) {
            z_stream *z = calloc(1, sizeof(*z));
            if (!z || inflateInit2(z, 15 + 16) != Z_OK) {
                free(z);
                rc = ps_diag_set(d, -ENOMEM, path, "out of memory");
            } else {
                in->z = z;
            }
        }
    }
    if (rc) {
        ps_file_close(in, false);
        return rc;
    }
    in->text[0] = '\0';
    return 0;
}

/* Plain bytes: first what the gzip peek took, then the descriptor. */
static int fill_plain(struct ps_file_in *in, size_t want, struct ps_diag *d)
{
    while (!in->eof && in->len < want) {
        int rc = grow(in, d);
        if (rc) return rc;
        size_t room = in->cap - 1 - in->len;
        if (in->zin_pos < in->zin_len) {
            size_t n = in->zin_len - in->zin_pos < room ? in->zin_len - in->zin_pos : room;
            memcpy(in->text + in->len, in->zin + in->zin_pos, n);
            in->zin_pos += n;
            in->len += n;
        } else {
            ssize_t r = read_fd(in->fd, in->text + in->len, room);
            if (r < 0) return read_error(in, (int)-r, d);
            if (r == 0) in->eof = true;
            in->len += (size_t)r;
        }
        in->text[in->len] = '\0';
        if (in->len > in->limit) return too_big(in, d);
    }
    return 0;
}

static int gzip_error(struct ps_file_in *in, const char *what, struct ps_diag *d)
{
    return ps_diag_set(d, -EIO, in->path, "corrupt gzip stream: %s", what);
}

static int fill_gzip(struct ps_file_in *in, size_t want, struct ps_diag *d)
{
    z_stream *z = in->z;
    while (!in->eof && in->len < want) {
        int rc = grow(in, d);
        if (rc) return rc;
        size_t room = in->cap - 1 - in->len;
        if (in->zin_pos == in->zin_len) {
            ssize_t r = read_fd(in->fd, in->zin, CHUNK);
            if (r < 0) return read_error(in, (int)-r, d);
            if (r == 0) {
                /* the end of the input inside a member (a finished one resets to no input) */
                if (z->total_in > 0 || z->total_out > 0) return gzip_error(in, "truncated", d);
                in->eof = true;
                break;
            }
            in->zin_len = (size_t)r;
            in->zin_pos = 0;
        }
        z->next_in = in->zin + in->zin_pos;
        z->avail_in = (uInt)(in->zin_len - in->zin_pos);
        z->next_out = (Bytef *)in->text + in->len;
        z->avail_out = room > UINT_MAX ? UINT_MAX : (uInt)room;
        uInt out0 = z->avail_out;
        int zr = inflate(z, Z_NO_FLUSH);
        in->zin_pos = in->zin_len - z->avail_in;
        in->len += out0 - z->avail_out;
        in->text[in->len] = '\0';
        if (in->len > in->limit) return too_big(in, d);
        if (zr == Z_STREAM_END) {
            /* another member may follow, as in `cat a.gz b.gz` */
            if (inflateReset(z) != Z_OK) return gzip_error(in, "reset failed", d);
            while (in->zin_pos == in->zin_len) {
                ssize_t r = read_fd(in->fd, in->zin, CHUNK);
                if (r < 0) return read_error(in, (int)-r, d);
                if (r == 0) {
                    in->eof = true;
                    break;
                }
                in->zin_len = (size_t)r;
                in->zin_pos = 0;
            }
            if (!in->eof && in->zin[in->zin_pos] != 0x1f)
                return gzip_error(in, "unexpected data after the end of the stream", d);
        } else if (zr == Z_BUF_ERROR) {
            if (z->avail_out != 0 && z->avail_in != 0) return gzip_error(in, "no progress", d);
        } else if (zr != Z_OK) {
            return gzip_error(in, z->msg ? z->msg : "inflate failed", d);
        }
    }
    return 0;
}

int ps_file_fill(struct ps_file_in *in, size_t want, struct ps_diag *d)
{
    if (in->fd < 0) return 0;
    return in->z ? fill_gzip(in, want, d) : fill_plain(in, want, d);
}

void ps_file_close(struct ps_file_in *in, bool keep_text)
{
    if (!in) return;
    if (in->fd >= 0) close(in->fd);
    in->fd = -1;
    if (in->z) {
        inflateEnd(in->z);
        free(in->z);
        in->z = NULL;
    }
    free(in->zin);
    in->zin = NULL;
    in->zin_len = in->zin_pos = 0;
    if (!keep_text) {
        free(in->text);
        in->text = NULL;
        in->len = in->cap = 0;
    }
}

int ps_file_read(const char *path, const struct ps_file_opts *o, char **text, size_t *len,
                 struct ps_diag *d)
{
    *text = NULL;
    *len = 0;
    struct ps_file_in in;
    int rc = ps_file_open(&in, path, o, d);
    if (rc) return rc;
    rc = ps_file_fill(&in, SIZE_MAX, d);
    ps_file_close(&in, rc == 0);
    if (rc) return rc;
    *text = in.text;
    *len = in.len;
    return 0;
}

/* ---- lines ---------------------------------------------------------------------------------- */

int ps_file_lines_open(struct ps_file_lines *l, const char *path, struct ps_diag *d)
{
    memset(l, 0, sizeof(*l));
    /* factor 2: the buffer holds about one line, and doubling it briefly needs 1.5 times that */
    struct ps_file_opts o = {.factor = 2, .gzip = true};
    return ps_file_open(&l->in, path, &o, d);
}

int ps_file_lines_next(struct ps_file_lines *l, char **line, size_t *len, struct ps_diag *d)
{
    struct ps_file_in *in = &l->in;
    size_t scanned = l->start;
    char *nl = NULL;
    for (;;) {
        nl = memchr(in->text + scanned, '\n', in->len - scanned);
        size_t stop = nl ? (size_t)(nl - in->text) : in->len;
        if (memchr(in->text + scanned, '\0', stop - scanned)) {
            char where[PS_DIAG_WHERE_MAX];
            snprintf(where, sizeof(where), "%s:%ld", in->path, l->lineno + 1);
            return ps_diag_set(d, -EINVAL, where, "a NUL byte in the line (not a text file?)");
        }
        if (nl || in->eof) break;
        scanned = in->len;
        if (l->start > 0 && l->start >= in->len / 2) {
            /* drop the lines already returned, so the buffer holds about one line */
            memmove(in->text, in->text + l->start, in->len - l->start + 1);
            in->len -= l->start;
            scanned -= l->start;
            l->start = 0;
        }
        in->line_from = l->start; /* returned lines lost their "\n": count after them */
        in->base_line = l->lineno;
        int rc = ps_file_fill(in, in->len + CHUNK, d);
        if (rc) return rc;
    }
    size_t end = nl ? (size_t)(nl - in->text) : in->len;
    if (end == l->start && !nl) return 0; /* the end of the file */
    l->lineno++;
    char *s = in->text + l->start;
    size_t n = end - l->start;
    s[n] = '\0';
    l->start = nl ? end + 1 : end;
    *line = s;
    *len = n;
    return 1;
}

void ps_file_lines_close(struct ps_file_lines *l)
{
    if (!l) return;
    ps_file_close(&l->in, false);
    memset(l, 0, sizeof(*l));
    l->in.fd = -1;
}
