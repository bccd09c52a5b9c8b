/* out: atomic output files, so that a failed command never leaves a partial file behind.
 *
 * Every viz writer that takes a path goes through here:
 *
 *     ps_out_open(PATH)  -> PATH.tmp.XXXXXX created (mkstemp) in PATH's folder
 *         write to o.f
 *     ps_out_commit      -> fflush, [fsync], fclose, rename(tmp, PATH)   (atomic on POSIX)
 *     ps_out_abort       -> fclose, unlink(tmp); an old PATH stays as it was
 *
 * Invariants: O1. PATH is only ever replaced by a complete file (rename is the last step and
 * happens only when every write, the flush and the close succeeded). O2. After commit or abort
 * no temporary file remains and the struct is zeroed. O3. "-" (or NULL) means stdout, which is
 * flushed but never closed; an abort there cannot take back what was written.
 *
 * A command writes several files (--trace, --json, --svg, -o DIR/...). Between
 * ps_out_defer_begin() and ps_out_defer_end(), commits stop before the rename: the complete
 * temporary files wait, and ps_out_defer_end(true) renames them all (in commit order), while
 * ps_out_defer_end(false) removes them. The CLI wraps every command in it, so a command that
 * fails after writing one output leaves every earlier file as it was (O4: no output of a failed
 * command replaces an old file); a folder it created for them (ps_out_mkdir) goes away again.
 * Single-threaded: one deferral at a time.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "viz/viz.h"

static struct {
    bool on;
    int n, cap;
    char **tmp, **path;
    int n_dirs;
    char *dirs[8]; /* folders ps_out_mkdir created, removed again (when empty) on abort */
} defer;

int ps_out_mkdir(const char *dir, struct ps_diag *diag)
{
    if (mkdir(dir, 0755) == 0) {
        if (defer.on && defer.n_dirs < 8) {
            char *c = strdup(dir);
            if (c) defer.dirs[defer.n_dirs++] = c;
        }
        return 0;
    }
    int e = errno;
    struct stat st;
    if (e == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    return ps_diag_set(diag, -e, dir, "cannot create the folder: %s", strerror(e));
}

void ps_out_defer_begin(void)
{
    defer.on = true;
}

int ps_out_defer_end(bool commit, struct ps_diag *diag)
{
    int rc = 0;
    for (int k = 0; k < defer.n; k++) {
        if (commit && rc == 0 && rename(defer.tmp[k], defer.path[k]) != 0) {
            int e = errno;
            rc = ps_diag_set(diag, -e, defer.path[k], "cannot write the file: %s", strerror(e));
        }
        if (!commit || rc) unlink(defer.tmp[k]);
        free(defer.tmp[k]);
        free(defer.path[k]);
    }
    for (int k = defer.n_dirs - 1; k >= 0; k--) {
        if (!commit || rc) rmdir(defer.dirs[k]);
        free(defer.dirs[k]);
    }
    free(defer.tmp);
    free(defer.path);
    memset(&defer, 0, sizeof(defer));
    return rc;
}

/* Takes over o->tmp and o->path; 0 or -ENOMEM. */
static int defer_add(struct ps_out *o)
{
    if (defer.n == defer.cap) {
        int nc = defer.cap ? defer.cap * 2 : 8;
        char **t = realloc(defer.tmp, (size_t)nc * sizeof(char *));
        if (!t) return -ENOMEM;
        defer.tmp = t;
        char **p = realloc(defer.path, (size_t)nc * sizeof(char *));
        if (!p) return -ENOMEM;
        defer.path = p;
        defer.cap = nc;
    }
    defer.tmp[defer.n] = o->tmp;
    defer.path[defer.n] = o->path;
    defer.n++;
    return 0;
}

int ps_out_open(struct ps_out *o, const char *path, struct ps_diag *diag)
{
    memset(o, 0, sizeof(*o));
    if (!path || strcmp(path, "-") == 0) {
        o->f = stdout;
        return 0;
    }
    size_t n = strlen(path);
    if (n == 0) return ps_diag_set(diag, -EINVAL, "output", "empty file name");
    o->path = strdup(path);
    o->tmp = malloc(n + sizeof(".tmp.XXXXXX"));
    if (!o->path || !o->tmp) {
        ps_out_abort(o);
        return ps_diag_set(diag, -ENOMEM, path, "out of memory");
    }
    memcpy(o->tmp, path, n);
    memcpy(o->tmp + n, ".tmp.XXXXXX", sizeof(".tmp.XXXXXX"));
    int fd = mkstemp(o->tmp);
    if (fd < 0) {
        int e = errno;
        free(o->path);
        free(o->tmp);
        memset(o, 0, sizeof(*o));
        ps_diag_set(diag, -e, path, "cannot create the file: %s", strerror(e));
        ps_diag_hint(diag, "check that the folder exists and is writable");
        return -e;
    }
    struct stat st;
    mode_t mode = 0644;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) mode = st.st_mode & 07777;
    (void)fchmod(fd, mode);
    o->f = fdopen(fd, "w");
    if (!o->f) {
        int e = errno;
        close(fd);
        unlink(o->tmp);
        free(o->path);
        free(o->tmp);
        memset(o, 0, sizeof(*o));
        return ps_diag_set(diag, -e, path, "cannot open the file: %s", strerror(e));
    }
    return 0;
}

int ps_out_commit(struct ps_out *o, struct ps_diag *diag)
{
    if (!o->f) return ps_diag_set(diag, -EBADF, "output", "commit of a file that is not open");
    if (o->f == stdout) {
        int bad = fflush(stdout) != 0 || ferror(stdout);
        memset(o, 0, sizeof(*o));
        if (bad) return ps_diag_set(diag, -EIO, "stdout", "write error");
        return 0;
    }
    int e = 0;
    if (fflush(o->f) != 0 || ferror(o->f)) e = errno ? errno : EIO;
    if (!e && o->sync && fsync(fileno(o->f)) != 0) e = errno;
    if (fclose(o->f) != 0 && !e) e = errno ? errno : EIO;
    o->f = NULL;
    if (!e && defer.on) {
        if (defer_add(o) == 0) {
            memset(o, 0, sizeof(*o)); /* renamed by ps_out_defer_end */
            return 0;
        }
        e = ENOMEM;
    }
    if (!e && rename(o->tmp, o->path) != 0) e = errno;
    if (e) {
        unlink(o->tmp);
        ps_diag_set(diag, -e, o->path, "cannot write the file: %s", strerror(e));
        free(o->path);
        free(o->tmp);
        memset(o, 0, sizeof(*o));
        return -e;
    }
    free(o->path);
    free(o->tmp);
    memset(o, 0, sizeof(*o));
    return 0;
}

void ps_out_abort(struct ps_out *o)
{
    if (!o) return;
    if (o->f == stdout) {
        fflush(stdout);
    } else {
        if (o->f) fclose(o->f);
        if (o->tmp) unlink(o->tmp);
    }
    free(o->path);
    free(o->tmp);
    memset(o, 0, sizeof(*o));
}

int ps_out_write(const char *path, int (*write)(FILE *f, void *ctx, struct ps_diag *diag),
                 void *ctx, struct ps_diag *diag)
{
    struct ps_out o;
    int rc = ps_out_open(&o, path, diag);
    if (rc < 0) return rc;
    rc = write(o.f, ctx, diag);
    if (rc < 0) {
        ps_out_abort(&o);
        return rc;
    }
    return ps_out_commit(&o, diag);
}

const char *ps_viz_device_name(const struct ps_graph *g, int device, char *buf, int len)
{
    const struct ps_spec *s = g ? g->spec : NULL;
    if (s && s->devices && s->device_id) {
        for (int j = 0; j < s->n_partitions; j++)
            if (s->device_id[j] == device) {
                ps_device_format(&s->devices[j], buf, len);
                return buf;
            }
    }
    snprintf(buf, (size_t)len, "cuda:%d", device);
    return buf;
}

const char *ps_viz_color_scale(double v, double lo, double hi, char buf[8])
{
    /* white (255,255,255), red (215,25,28), blue (44,123,182) */
    double r = 255, gg = 255, b = 255, t;
    if (!(hi > lo)) hi = lo + 1;
    if (v < lo) v = lo;
    if (v > hi) v = hi;
    if (lo < 0 && hi > 0) {
        if (v < 0) {
            t = v / lo; /* 0 at zero, 1 at lo */
            r = 255 + t * (44 - 255);
            gg = 255 + t * (123 - 255);
            b = 255 + t * (182 - 255);
        } else {
            t = v / hi;
            r = 255 + t * (215 - 255);
            gg = 255 + t * (25 - 255);
            b = 255 + t * (28 - 255);
        }
    } else {
        t = (v - lo) / (hi - lo);
        r = 255 + t * (215 - 255);
        gg = 255 + t * (25 - 255);
        b = 255 + t * (28 - 255);
    }
    snprintf(buf, 8, "#%02x%02x%02x", (unsigned)(r + 0.5) & 0xff, (unsigned)(gg + 0.5) & 0xff,
             (unsigned)(b + 0.5) & 0xff);
    return buf;
}
