/* out: every file and folder pipescope writes, written so that nothing it did not write is lost.
 *
 * Files (ps_out_open / ps_out_commit / ps_out_abort, ps_out_write):
 *
 *     PATH            regular or absent: .NAME.tmp.RANDOM created beside it (O_CREAT|O_EXCL|
 *                     O_NOFOLLOW, relative to the folder's descriptor), renamed over NAME on commit
 *     PATH -> TARGET  a symbolic link: the same for TARGET, so the link stays a link
 *     /dev/stdout, /dev/fd/N, /proc/self/fd/N (or a link to one): the descriptor itself (dup),
 *                     so `>> log` appends; the file behind it is never renamed over
 *     char device, FIFO, "-" (stdout): written straight through, no temporary file, no rename
 *     folder, block device, dangling link: refused
 *
 * Folders (ps_out_folder, for -o DIR and --save-state DIR): DIR's files are written into a
 * temporary twin .DIR.tmp.RANDOM (mkdtemp-like, beside DIR) that holds pipescope's marker file
 * MARKER; on success the twin is swapped in with one renameat2(RENAME_EXCHANGE) when DIR exists
 * (so DIR exists at every instant) and the old DIR is removed, or renamed into place when it
 * does not. DIR may be absent, empty, or a folder holding MARKER; anything else (a file, a link,
 * a folder of the user's) is refused before any computation, and checked again at the swap.
 *
 * Invariants:
 *   O1. PATH is only ever replaced by a complete file: the rename is the last step, after every
 *       write, the flush and the close succeeded (each one checked).
 *   O2. After commit or abort no temporary file remains and the struct is zeroed.
 *   O3. "-" (or NULL) means stdout, flushed but never closed; straight-through writes (stdout,
 *       devices, FIFOs) cannot be taken back by an abort.
 *   O4. Between ps_out_defer_begin() and ps_out_defer_end(), commits stop before the rename: the
 *       complete temporary files and folders wait; ps_out_defer_end(true) first checks that
 *       nothing replaces an input (device and inode), that no two outputs share a name, that no
 *       file or input lies in a folder replaced whole and that every folder may still be
 *       replaced; then swaps the folders in (each can be swapped back), then renames the files,
 *       and only then removes what the folders replaced; ps_out_defer_end(false) removes them.
 *       The CLI wraps every command in it, so a failed command replaces no old output.
 *   O7. Removing a folder never leaves its file system or mount (rm --one-file-system) and has
 *       no depth limit (two descriptors at a time, descending again from the top).
 *   O5. Only what pipescope created is ever removed: temporary names are unique (two runs on
 *       the same output never share one), created and removed relative to a folder descriptor
 *       without following links; a folder is replaced only when it is empty or carries MARKER
 *       (an empty one with rmdir, which fails when a file appeared in it);
 *       missing parent folders are created and removed again (when empty) on failure.
 *   O6. SIGINT, SIGTERM and SIGHUP remove every temporary file and folder and every created
 *       parent still registered (async-signal-safe: unlinkat, getdents64, no allocation), then
 *       the signal takes its default course.
 * Single-threaded for registration; one deferral at a time.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "src/file.h"
#include "viz/viz.h"

#define MARKER_TEXT                                                                                \
    "This folder was written by pipescope. pipescope replaces it, whole, the next time it\n"       \
    "writes here; remove this file to keep pipescope from doing that.\n"

/* ---- the cleanup registry (O6) ------------------------------------------------------------ */

enum { R_FREE, R_FILE, R_TREE, R_EMPTY };
#define N_REG 128

static struct reg {
    volatile sig_atomic_t kind; /* set last on add, first on delete */
    int dirfd;                  /* the folder holding `name` (owned by the registry) */
    char name[NAME_MAX + 1];
} reg[N_REG];
static bool handlers_installed;

/* Folders remove_tree_at could not empty (another file system below, a file it may not
 * remove): skipped on the next descents. Static, not on the stack: the signal handler may use
 * it, and then the process ends. */
static struct { dev_t dev; ino_t ino; } stuck[256];
static int n_stuck;

/* The file system a folder is on: its device and, where statx says it, its mount (a bind
 * mount of the same device is another mount). */
struct fs_id { dev_t dev; uint64_t mnt; bool has_mnt; };

/* statx of `name` under fd (name "": fd itself), no links followed; 0 or -1. */
static int fs_of(int fd, const char *name, struct fs_id *id, struct stat *st)
{
    struct statx sx;
    int fl = AT_SYMLINK_NOFOLLOW | (*name ? 0 : AT_EMPTY_PATH);
    if (statx(fd, name, fl, STATX_TYPE | STATX_INO | STATX_MNT_ID, &sx) != 0) return -1;
    memset(st, 0, sizeof(*st));
    st->st_mode = sx.stx_mode;
    st->st_ino = sx.stx_ino;
    st->st_dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
    id->dev = st->st_dev;
    id->has_mnt = (sx.stx_mask & STATX_MNT_ID) != 0;
    id->mnt = sx.stx_mnt_id;
    return 0;
}

static bool same_fs(const struct fs_id *a, const struct fs_id *b)
{
    return a->dev == b->dev && (!a->has_mnt || !b->has_mnt || a->mnt == b->mnt);
}

static bool is_stuck(const struct stat *st)
{
    for (int k = 0; k < n_stuck; k++)
        if (stuck[k].dev == st->st_dev && stuck[k].ino == st->st_ino) return true;
    return false;
}

/* One pass over folder fd: unlinks what is not a folder, removes empty folders of file
 * system `dev`, and copies into `down` the name of the first folder of `dev` that is neither
 * empty nor stuck. Returns 1 when it removed something, 0 when not, -1 on a read error. */
static int tree_pass(int fd, const struct fs_id *top, char down[NAME_MAX + 1])
{
    char buf[4096];
    int removed = 0;
    lseek(fd, 0, SEEK_SET);
    for (;;) {
        long n = syscall(SYS_getdents64, fd, buf, sizeof(buf));
        if (n < 0) return -1;
        if (n == 0) return removed;
        for (long off = 0; off < n;) {
            struct {
                uint64_t ino;
                int64_t off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *e = (void *)(buf + off);
            off += e->reclen;
            if (!strcmp(e->name, ".") || !strcmp(e->name, "..")) continue;
            struct stat st;
            if (e->type != DT_DIR) {
                if (e->type != DT_UNKNOWN ||
                    (fstatat(fd, e->name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode))) {
                    if (unlinkat(fd, e->name, 0) == 0) removed = 1;
                    continue;
                }
            }
            /* a folder: never one of another file system (a mount point), as rm
               --one-file-system */
            struct fs_id id;
            if (fs_of(fd, e->name, &id, &st) != 0 || !S_ISDIR(st.st_mode) || !same_fs(&id, top) ||
                is_stuck(&st))
                continue;
            if (unlinkat(fd, e->name, AT_REMOVEDIR) == 0) removed = 1;
            else if (!down[0]) memcpy(down, e->name, strlen(e->name) + 1);
        }
    }
}

/* Removes folder `name` under dirfd and everything in it of the same file system, without
 * following links, at any depth: each round descends from the top to a folder holding no
 * folder left to empty, empties it and removes it, holding two descriptors at a time. Only
 * async-signal-safe calls. Returns 0 or -errno of the final rmdir. */
static int remove_tree_at(int dirfd, const char *name)
{
    n_stuck = 0;
    struct stat st;
    struct fs_id top, id;
    if (fs_of(dirfd, name, &top, &st) == 0 && S_ISDIR(st.st_mode)) {
        for (;;) {
            int parent = -1, fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            char leaf[NAME_MAX + 1] = "";
            if (fd < 0 || fs_of(fd, "", &id, &st) != 0 || !same_fs(&id, &top)) {
                if (fd >= 0) close(fd);
                break;
            }
            for (;;) {
                char down[NAME_MAX + 1] = "";
                int r;
                while ((r = tree_pass(fd, &top, down)) == 1) down[0] = '\0';
                if (r < 0 || !down[0]) break;
                int child = openat(fd, down, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (child < 0 || fs_of(child, "", &id, &st) != 0 || !same_fs(&id, &top)) {
                    if (child >= 0) close(child);
                    if (fstatat(fd, down, &st, AT_SYMLINK_NOFOLLOW) == 0 && n_stuck < 256)
                        stuck[n_stuck].dev = st.st_dev, stuck[n_stuck++].ino = st.st_ino;
                    else break;
                    continue;
                }
                if (parent >= 0) close(parent);
                parent = fd;
                fd = child;
                memcpy(leaf, down, sizeof(leaf));
            }
            if (parent < 0) { /* the top itself holds no folder left to empty */
                close(fd);
                break;
            }
            struct stat ls;
            bool got = fstat(fd, &ls) == 0;
            close(fd);
            if (unlinkat(parent, leaf, AT_REMOVEDIR) != 0) {
                if (!got || n_stuck == 256) {
                    close(parent);
                    break;
                }
                stuck[n_stuck].dev = ls.st_dev;
                stuck[n_stuck++].ino = ls.st_ino;
            }
            close(parent);
        }
    }
    return unlinkat(dirfd, name, AT_REMOVEDIR) == 0 ? 0 : -errno;
}

static void cleanup_entry(struct reg *r)
{
    int k = r->kind;
    r->kind = R_FREE;
    if (k == R_FILE) unlinkat(r->dirfd, r->name, 0);
    else if (k == R_TREE) remove_tree_at(r->dirfd, r->name);
    else if (k == R_EMPTY) unlinkat(r->dirfd, r->name, AT_REMOVEDIR);
}

static void on_signal(int sig)
{
    int saved = errno;
    for (int i = N_REG - 1; i >= 0; i--) /* newest first: files, then folders, then parents */
        if (reg[i].kind != R_FREE) cleanup_entry(&reg[i]);
    signal(sig, SIG_DFL);
    errno = saved;
    raise(sig);
}

static void install_handlers(void)
{
    if (handlers_installed) return;
    handlers_installed = true;
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t k = 0; k < sizeof(sigs) / sizeof(sigs[0]); k++) {
        struct sigaction old, sa;
        if (sigaction(sigs[k], NULL, &old) != 0 || old.sa_handler != SIG_DFL) continue; /* nohup */
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sigfillset(&sa.sa_mask);
        sigaction(sigs[k], &sa, NULL);
    }
}

/* INT, TERM and HUP held back while a temporary is created and registered, so that no
 * signal finds it made but not yet registered (O6). */
static void hold_signals(sigset_t *old)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, old);
}

static void release_signals(const sigset_t *old)
{
    sigprocmask(SIG_SETMASK, old, NULL);
}

/* Registers `name` under dirfd (duplicated) for removal on a signal; the slot, or -1 when the
 * registry is full (the entry is then only removed by the normal paths). */
static int reg_add(int kind, int dirfd, const char *name)
{
    install_handlers();
    for (int i = 0; i < N_REG; i++) {
        if (reg[i].kind != R_FREE) continue;
        int fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) return -1;
        reg[i].dirfd = fd;
        snprintf(reg[i].name, sizeof(reg[i].name), "%s", name);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        reg[i].kind = kind;
        return i;
    }
    return -1;
}

/* Forgets slot i (no removal); -1 is ignored. */
static void reg_del(int i)
{
    if (i < 0 || i >= N_REG || reg[i].kind == R_FREE) return;
    reg[i].kind = R_FREE;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    close(reg[i].dirfd);
    reg[i].dirfd = -1;
}

/* ---- names --------------------------------------------------------------------------------- */

/* Splits PATH into its folder (malloc'd; "." when none) and last component (in PATH, after
 * trailing slashes were cut by the caller). */
static char *parent_of(const char *path, const char **base)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        *base = path;
        return strdup(".");
    }
    *base = slash + 1;
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* ".NAME.tmp.RANDOM" (RANDOM: 6 random characters), NAME cut to fit NAME_MAX */
static void temp_name(const char *base, char out[NAME_MAX + 1])
{
    static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned char rnd[6];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        static unsigned counter;
        unsigned v = (unsigned)getpid() * 2654435761u ^ ++counter * 40503u;
        for (int k = 0; k < 6; k++) rnd[k] = (unsigned char)(v >> (k * 5));
    }
    int keep = (int)strlen(base);
    if (keep > NAME_MAX - 16) keep = NAME_MAX - 16;
    int n = snprintf(out, NAME_MAX + 1, ".%.*s.tmp.", keep, base);
    for (int k = 0; k < 6; k++) out[n + k] = digits[rnd[k] % (sizeof(digits) - 1)];
    out[n + 6] = '\0';
}

/* ---- created parent folders and the deferral ------------------------------------------------ */

struct dirmade { int slot; char *path; };
struct pending { int dirfd, slot; char *tmp, *name, *path; bool done; };
enum { F_NONE, F_NEW, F_EMPTIED, F_EXCHANGED, F_MOVED };
struct folder {
    int dirfd, slot;
    int state, old_slot; /* F_*: what folder_swap did; old_slot: the registered old name */
    mode_t mode;         /* the replaced folder's */
    char old[NAME_MAX + 1]; /* F_MOVED: where the replaced folder is */
    char *path;  /* DIR as the user gave it, trailing slashes cut */
    char *name;  /* last component */
    char *tmp;   /* temporary twin's name in dirfd */
    char *write; /* parent/tmp: where the command writes DIR's files */
};

static struct {
    bool on;
    int n, cap;
    struct pending *files;
    int n_folders;
    struct folder folders[8];
    int n_dirs;
    struct dirmade dirs[64]; /* parents created, removed again when they stay empty */
} defer;

static int diag_errno(struct ps_diag *diag, int e, const char *where, const char *what)
{
    return ps_diag_set(diag, -e, where, "%s: %s", what, strerror(e));
}

/* Creates the missing folders of `dir` (mkdir -p), remembering those it made (O5). */
static int make_parents(const char *dir, struct ps_diag *diag)
{
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return 0;
        return ps_diag_set(diag, -ENOTDIR, dir, "cannot create a folder here: %s", strerror(ENOTDIR));
    }
    char *p = strdup(dir);
    if (!p) return ps_diag_set(diag, -ENOMEM, dir, "out of memory");
    int rc = 0;
    size_t n = strlen(p);
    for (size_t i = 1; i <= n && rc == 0; i++) {
        if (i < n && p[i] != '/') continue;
        if (i < n && p[i - 1] == '/') continue; /* "a//b" */
        char c = p[i];
        p[i] = '\0';
        sigset_t held;
        hold_signals(&held); /* made and registered before a signal can come */
        if (mkdir(p, 0755) == 0) {
            if (defer.on && defer.n_dirs < (int)(sizeof(defer.dirs) / sizeof(defer.dirs[0]))) {
                const char *base;
                char *par = parent_of(p, &base);
                int fd = par ? open(par, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
                struct dirmade *m = &defer.dirs[defer.n_dirs++];
                m->path = strdup(p);
                m->slot = fd >= 0 ? reg_add(R_EMPTY, fd, base) : -1;
                if (fd >= 0) close(fd);
                free(par);
            }
        } else if (errno != EEXIST) {
            rc = diag_errno(diag, errno, p, "cannot create the folder");
        } else if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
            rc = ps_diag_set(diag, -ENOTDIR, p, "cannot create a folder here: %s", strerror(ENOTDIR));
        }
        release_signals(&held);
        p[i] = c;
    }
    free(p);
    return rc;
}

/* Removes the created parents that are empty (all of them after a failure, the unused ones
 * after a success), newest first. */
static void drop_parents(void)
{
    for (int k = defer.n_dirs - 1; k >= 0; k--) {
        reg_del(defer.dirs[k].slot);
        if (defer.dirs[k].path) rmdir(defer.dirs[k].path);
        free(defer.dirs[k].path);
    }
    defer.n_dirs = 0;
}

void ps_out_defer_begin(void)
{
    install_handlers(); /* before the first probe or temporary file */
    defer.on = true;
}

static void folder_free(struct folder *f)
{
    reg_del(f->slot);
    if (f->dirfd >= 0) close(f->dirfd);
    free(f->path);
    free(f->name);
    free(f->tmp);
    free(f->write);
    memset(f, 0, sizeof(*f));
    f->dirfd = -1;
}

/* 1 when folder `name` under dirfd is pipescope's (holds MARKER as a regular file) or empty,
 * 0 when not, or -errno. */
static int owned_at(int dirfd, const char *name)
{
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstatat(fd, PS_OUT_MARKER, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
        close(fd);
        return 1;
    }
    DIR *dp = fdopendir(fd);
    if (!dp) {
        close(fd);
        return -errno;
    }
    int own = 1;
    struct dirent *e;
    while ((e = readdir(dp)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) own = 0;
    closedir(dp);
    return own;
}

/* DIR may be replaced: absent, empty or pipescope's. 0, or -errno with diag. */
static int check_replaceable(int dirfd, const char *name, const char *path, struct ps_diag *diag)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return 0;
        return diag_errno(diag, errno, path, "cannot use the folder");
    }
    if (S_ISLNK(st.st_mode)) {
        ps_diag_set(diag, -EEXIST, path, "is a symbolic link; pipescope writes its folders only in place of "
                                         "an empty folder or one it wrote");
        ps_diag_hint(diag, "give the folder the link points to, or another name");
        return -EEXIST;
    }
    if (!S_ISDIR(st.st_mode)) {
        ps_diag_set(diag, -EEXIST, path, "exists and is not a folder; pipescope does not replace it");
        ps_diag_hint(diag, "choose another name, or remove it yourself");
        return -EEXIST;
    }
    int own = owned_at(dirfd, name);
    if (own < 0) return diag_errno(diag, -own, path, "cannot read the folder");
    if (!own) {
        ps_diag_set(diag, -EEXIST, path,
                    "the folder holds files pipescope did not write (no %s in it); pipescope replaces "
                    "only empty folders and its own",
                    PS_OUT_MARKER);
        ps_diag_hint(diag, "choose another folder, or empty this one");
        return -EEXIST;
    }
    return 0;
}

static int write_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? -errno : -EIO;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

int ps_out_folder(const char *dir, const char **write_to, struct ps_diag *diag)
{
    *write_to = NULL;
    if (!defer.on) return ps_diag_set(diag, -EINVAL, dir ? dir : "output", "output folders need a deferral");
    if (!dir || !*dir) return ps_diag_set(diag, -EINVAL, "output", "empty folder name");
    size_t L = strlen(dir);
    while (L > 1 && dir[L - 1] == '/') L--;
    for (int k = 0; k < defer.n_folders; k++)
        if (strlen(defer.folders[k].path) == L && !strncmp(defer.folders[k].path, dir, L)) {
            *write_to = defer.folders[k].write;
            return 0;
        }
    if (defer.n_folders == (int)(sizeof(defer.folders) / sizeof(defer.folders[0])))
        return ps_diag_set(diag, -EMFILE, dir, "too many output folders");
    struct folder f = {.dirfd = -1, .slot = -1, .old_slot = -1};
    f.path = strndup(dir, L);
    if (!f.path) return ps_diag_set(diag, -ENOMEM, dir, "out of memory");
    const char *base;
    char *par = parent_of(f.path, &base);
    int rc = 0;
    if (!par) rc = ps_diag_set(diag, -ENOMEM, dir, "out of memory");
    if (rc == 0 && (!strcmp(base, "/") || !*base || !strcmp(base, ".") || !strcmp(base, "..")))
        rc = ps_diag_set(diag, -EINVAL, f.path, "cannot be an output folder (name it, e.g. out/run1)");
    if (rc == 0) rc = make_parents(par, diag);
    if (rc == 0) {
        f.name = strdup(base);
        f.dirfd = open(par, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (!f.name) rc = ps_diag_set(diag, -ENOMEM, dir, "out of memory");
        else if (f.dirfd < 0) rc = diag_errno(diag, errno, par, "cannot open the folder");
    }
    if (rc == 0) rc = check_replaceable(f.dirfd, f.name, f.path, diag);
    char tmp[NAME_MAX + 1];
    for (int tries = 0; rc == 0; tries++) {
        temp_name(f.name, tmp);
        sigset_t held;
        hold_signals(&held);
        int made = mkdirat(f.dirfd, tmp, 0700), e = errno;
        if (made == 0) f.slot = reg_add(R_TREE, f.dirfd, tmp);
        release_signals(&held);
        if (made == 0) break;
        errno = e;
        if (errno != EEXIST || tries > 100) {
            rc = diag_errno(diag, errno, f.path, "cannot create the folder");
            ps_diag_hint(diag, "check that its parent folder is writable");
        }
    }
    if (rc == 0) {
        f.tmp = strdup(tmp);
        size_t n = strlen(par) + strlen(tmp) + 2;
        f.write = malloc(n);
        if (!f.tmp) {
            unlinkat(f.dirfd, tmp, AT_REMOVEDIR);
            rc = ps_diag_set(diag, -ENOMEM, dir, "out of memory");
        } else if (!f.write) {
            rc = ps_diag_set(diag, -ENOMEM, dir, "out of memory");
        } else {
            snprintf(f.write, n, "%s/%s", par, tmp);
        }
    }
    if (rc == 0) {
        /* the marker, and the usual folder mode (mkdtemp's 0700 is for the name only) */
        int dfd = openat(f.dirfd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int mfd = dfd < 0 ? -1
                          : openat(dfd, PS_OUT_MARKER, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                                   0644);
        int e = mfd < 0 ? errno : -write_all(mfd, MARKER_TEXT, sizeof(MARKER_TEXT) - 1);
        if (mfd >= 0 && close(mfd) != 0 && !e) e = errno;
        if (!e && dfd >= 0 && fchmod(dfd, 0755) != 0) e = errno;
        if (dfd >= 0) close(dfd);
        if (e) rc = diag_errno(diag, e, f.path, "cannot write the folder");
    }
    free(par);
    if (rc) {
        if (f.tmp) remove_tree_at(f.dirfd, f.tmp);
        folder_free(&f);
        return rc;
    }
    defer.folders[defer.n_folders++] = f;
    *write_to = f.write;
    return 0;
}

static bool has_marker(int dirfd, const char *name)
{
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st;
    bool m = fstatat(fd, PS_OUT_MARKER, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
    close(fd);
    return m;
}

static int changed(const struct folder *f, struct ps_diag *diag)
{
    ps_diag_set(diag, -EEXIST, f->path, "the folder changed while pipescope ran; it was left as it is");
    ps_diag_hint(diag, "run the command again, or give another folder");
    return -EEXIST;
}

/* Puts folder f's twin in place of DIR, keeping what it replaces until folder_finish (O4, O5):
 * an absent DIR is renamed into; a folder of pipescope's is exchanged with the twin (DIR
 * exists at every instant); an empty folder of the user's is removed with rmdir, which fails
 * when a file appeared in it meanwhile, and the twin renamed in its place without replacing. */
static int folder_swap(struct folder *f, struct ps_diag *diag)
{
    struct stat st;
    for (int tries = 0; fstatat(f->dirfd, f->name, &st, AT_SYMLINK_NOFOLLOW) != 0; tries++) {
        if (errno != ENOENT) return diag_errno(diag, errno, f->path, "cannot use the folder");
        if (renameat2(f->dirfd, f->tmp, f->dirfd, f->name, RENAME_NOREPLACE) == 0) {
            f->state = F_NEW;
            return 0;
        }
        /* made meanwhile (another pipescope on the same folder): look at it again */
        if ((errno != EEXIST && errno != ENOTEMPTY) || tries == 3)
            return tries == 3 ? changed(f, diag) : diag_errno(diag, errno, f->path, "cannot create the folder");
    }
    if (!S_ISDIR(st.st_mode)) return changed(f, diag);
    f->mode = st.st_mode & 07777;
    if (!has_marker(f->dirfd, f->name)) {
        if (unlinkat(f->dirfd, f->name, AT_REMOVEDIR) != 0) {
            if (errno == ENOTEMPTY || errno == EEXIST) return changed(f, diag);
            return diag_errno(diag, errno, f->path, "cannot replace the folder");
        }
        if (renameat2(f->dirfd, f->tmp, f->dirfd, f->name, RENAME_NOREPLACE) != 0) {
            int e = errno;
            mkdirat(f->dirfd, f->name, f->mode); /* give the user's empty folder back */
            if (e == EEXIST || e == ENOTEMPTY) return changed(f, diag);
            return diag_errno(diag, e, f->path, "cannot replace the folder");
        }
        f->state = F_EMPTIED;
        return 0;
    }
    if (renameat2(f->dirfd, f->tmp, f->dirfd, f->name, RENAME_EXCHANGE) == 0) {
        /* the old DIR is now at f->tmp: still pipescope's, or swapped back */
        if (!has_marker(f->dirfd, f->tmp)) {
            renameat2(f->dirfd, f->tmp, f->dirfd, f->name, RENAME_EXCHANGE);
            return changed(f, diag);
        }
        f->state = F_EXCHANGED;
        return 0;
    }
    if (errno != EINVAL && errno != ENOSYS)
        return diag_errno(diag, errno, f->path, "cannot replace the folder");
    /* no RENAME_EXCHANGE here: move the old one aside, then rename */
    temp_name(f->name, f->old);
    if (renameat(f->dirfd, f->name, f->dirfd, f->old) != 0)
        return diag_errno(diag, errno, f->path, "cannot replace the folder");
    f->old_slot = reg_add(R_TREE, f->dirfd, f->old);
    if (renameat(f->dirfd, f->tmp, f->dirfd, f->name) != 0) {
        int e = errno;
        renameat(f->dirfd, f->old, f->dirfd, f->name);
        reg_del(f->old_slot);
        f->old_slot = -1;
        return diag_errno(diag, e, f->path, "cannot replace the folder");
    }
    f->state = F_MOVED;
    return 0;
}

/* Undoes folder_swap: the twin back at f->tmp, DIR as it was. */
static void folder_unswap(struct folder *f)
{
    if (f->state == F_EXCHANGED) {
        renameat2(f->dirfd, f->tmp, f->dirfd, f->name, RENAME_EXCHANGE);
    } else if (f->state != F_NONE) {
        renameat2(f->dirfd, f->name, f->dirfd, f->tmp, RENAME_NOREPLACE);
        if (f->state == F_MOVED) renameat(f->dirfd, f->old, f->dirfd, f->name);
        if (f->state == F_EMPTIED) mkdirat(f->dirfd, f->name, f->mode);
    }
    if (f->state == F_MOVED) reg_del(f->old_slot);
    f->state = F_NONE;
}

/* "/proc/self/fd/DIRFD" resolved, then "/NAME": where a file or folder is; false when too long. */
static bool where_at(int dirfd, const char *name, char out[PATH_MAX])
{
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
    ssize_t n = readlink(link, out, PATH_MAX - 1);
    if (n <= 0) return false;
    size_t m = strlen(name);
    if ((size_t)n + 1 + m >= PATH_MAX) return false;
    if (!(n == 1 && out[0] == '/')) out[n++] = '/';
    memcpy(out + n, name, m + 1);
    return true;
}

/* PATH is DIR or inside it */
static bool inside(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '/' || path[n] == '\0');
}

/* Before anything is renamed: no output replaces an input (by device and inode, so also
 * through a link), no two outputs share a name, no output file or input lies inside a folder
 * that is replaced whole, and every folder may still be replaced. */
static int precheck(struct ps_diag *diag)
{
    const struct ps_file_input *in;
    int n_in = ps_file_inputs(&in);
    for (int k = 0; k < defer.n; k++) {
        struct pending *p = &defer.files[k];
        struct stat st, a, b;
        if (fstatat(p->dirfd, p->name, &st, 0) == 0)
            for (int j = 0; j < n_in; j++)
                if (in[j].dev == (uint64_t)st.st_dev && in[j].ino == (uint64_t)st.st_ino) {
                    ps_diag_set(diag, -EEXIST, p->path, "input file is the same as output file");
                    ps_diag_hint(diag, "give the output another name; pipescope does not replace "
                                       "what it reads");
                    return -EEXIST;
                }
        for (int j = 0; j < k; j++) {
            struct pending *q = &defer.files[j];
            if (!strcmp(p->name, q->name) && fstat(p->dirfd, &a) == 0 && fstat(q->dirfd, &b) == 0 &&
                a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
                ps_diag_set(diag, -EEXIST, p->path, "is named by two outputs of this command (also "
                                                    "as '%s'); one would be lost", q->path);
                ps_diag_hint(diag, "give each output its own name");
                return -EEXIST;
            }
        }
    }
    for (int k = 0; k < defer.n_folders; k++) {
        struct folder *f = &defer.folders[k];
        char dir[PATH_MAX], at[PATH_MAX];
        if (!where_at(f->dirfd, f->name, dir)) continue;
        for (int j = 0; j < n_in; j++)
            if (in[j].real && inside(in[j].real, dir)) {
                ps_diag_set(diag, -EEXIST, f->path, "holds an input of this command (%s); pipescope "
                                                    "replaces the folder whole", in[j].real);
                ps_diag_hint(diag, "give the output folder another name");
                return -EEXIST;
            }
        for (int j = 0; j < defer.n; j++)
            if (where_at(defer.files[j].dirfd, defer.files[j].name, at) && inside(at, dir)) {
                ps_diag_set(diag, -EEXIST, defer.files[j].path,
                            "is inside the output folder %s, which pipescope replaces whole", f->path);
                ps_diag_hint(diag, "write it outside that folder");
                return -EEXIST;
            }
        int rc = check_replaceable(f->dirfd, f->name, f->path, diag);
        if (rc) return rc;
    }
    return 0;
}

/* Commits everything or nothing (O4): checks first, then swaps the folders in (each can be
 * swapped back), then renames the files; only then is what the folders replaced removed. */
static int commit_all(struct ps_diag *diag)
{
    int rc = precheck(diag), k = 0;
    for (; rc == 0 && k < defer.n_folders; k++) rc = folder_swap(&defer.folders[k], diag);
    if (rc) {
        while (k-- > 0) folder_unswap(&defer.folders[k]);
        return rc;
    }
    for (k = 0; k < defer.n; k++) {
        struct pending *p = &defer.files[k];
        if (renameat(p->dirfd, p->tmp, p->dirfd, p->name) != 0) {
            rc = diag_errno(diag, errno, p->path, "cannot write the file");
            for (int j = defer.n_folders - 1; j >= 0; j--) folder_unswap(&defer.folders[j]);
            return rc;
        }
        p->done = true;
    }
    return 0;
}

int ps_out_defer_end(bool commit, struct ps_diag *diag)
{
    int rc = commit ? commit_all(diag) : 0;
    for (int k = 0; k < defer.n; k++) {
        struct pending *p = &defer.files[k];
        if (!p->done) unlinkat(p->dirfd, p->tmp, 0);
        reg_del(p->slot);
        close(p->dirfd);
        free(p->tmp);
        free(p->name);
        free(p->path);
    }
    for (int k = 0; k < defer.n_folders; k++) {
        struct folder *f = &defer.folders[k];
        if (f->state == F_NONE || f->state == F_EXCHANGED)
            remove_tree_at(f->dirfd, f->tmp); /* the twin, or the old DIR exchanged with it */
        if (f->state == F_MOVED) {
            remove_tree_at(f->dirfd, f->old);
            reg_del(f->old_slot);
        }
        folder_free(f);
    }
    drop_parents();
    free(defer.files);
    memset(&defer, 0, sizeof(defer));
    return rc;
}

/* Takes over o's names; 0 or -ENOMEM. */
static int defer_add(struct ps_out *o)
{
    if (defer.n == defer.cap) {
        int nc = defer.cap ? defer.cap * 2 : 8;
        struct pending *p = realloc(defer.files, (size_t)nc * sizeof(*p));
        if (!p) return -ENOMEM;
        defer.files = p;
        defer.cap = nc;
    }
    defer.files[defer.n++] = (struct pending){o->dirfd, o->slot, o->tmp, o->name, o->path, false};
    return 0;
}

/* ---- files ------------------------------------------------------------------------------------ */

static void out_free(struct ps_out *o)
{
    if (o->dirfd > 0) close(o->dirfd);
    free(o->path);
    free(o->tmp);
    free(o->name);
    memset(o, 0, sizeof(*o));
}

/* What PATH is: fills *real (malloc'd: PATH, or a link's target) and *st (st_mode 0 when
 * absent). Refuses folders, block devices, dangling links and "name/". */
static int classify(const char *path, char **real, struct stat *st, struct ps_diag *diag)
{
    *real = NULL;
    memset(st, 0, sizeof(*st));
    size_t n = strlen(path);
    if (n == 0) return ps_diag_set(diag, -EINVAL, "output", "empty file name");
    if (path[n - 1] == '/')
        return ps_diag_set(diag, -EISDIR, path, "a file name cannot end with '/'");
    struct stat ls;
    if (lstat(path, &ls) != 0) {
        if (errno != ENOENT && errno != ENOTDIR) return diag_errno(diag, errno, path, "cannot write the file");
        *real = strdup(path);
        return *real ? 0 : ps_diag_set(diag, -ENOMEM, path, "out of memory");
    }
    if (S_ISLNK(ls.st_mode)) {
        char *r = realpath(path, NULL);
        if (!r) {
            ps_diag_set(diag, -ENOENT, path, "is a symbolic link to nothing (%s)", strerror(errno));
            ps_diag_hint(diag, "remove the link or give another name");
            return -ENOENT;
        }
        if (stat(r, st) != 0) {
            int e = errno;
            free(r);
            return diag_errno(diag, e, path, "cannot write the file");
        }
        *real = r;
    } else {
        *st = ls;
        *real = strdup(path);
        if (!*real) return ps_diag_set(diag, -ENOMEM, path, "out of memory");
    }
    if (S_ISDIR(st->st_mode) || S_ISBLK(st->st_mode)) {
        free(*real);
        *real = NULL;
        if (S_ISDIR(st->st_mode)) return ps_diag_set(diag, -EISDIR, path, "is a folder, not a file");
        return ps_diag_set(diag, -EINVAL, path, "is a block device; pipescope does not write to it");
    }
    return 0;
}

/* The descriptor a name stands for: /dev/stdin, /dev/stdout, /dev/stderr, /dev/fd/N,
 * /proc/self/fd/N (or a link to one of them). -1 for any other name. Such a name is the
 * descriptor the shell set up (`>> log` appends), never the file behind it to rename over. */
static int fd_alias(const char *path)
{
    static const char *const pre[] = {"/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/"};
    char cur[PATH_MAX], link[PATH_MAX];
    if (strlen(path) >= sizeof(cur)) return -1;
    strcpy(cur, path);
    for (int hop = 0; hop < 40; hop++) {
        if (!strcmp(cur, "/dev/stdin")) return 0;
        if (!strcmp(cur, "/dev/stdout")) return 1;
        if (!strcmp(cur, "/dev/stderr")) return 2;
        for (size_t k = 0; k < sizeof(pre) / sizeof(pre[0]); k++) {
            size_t n = strlen(pre[k]);
            if (strncmp(cur, pre[k], n) || !cur[n]) continue;
            char *end;
            long v = strtol(cur + n, &end, 10);
            if (*end == '\0' && v >= 0 && v < INT_MAX && cur[n] >= '0' && cur[n] <= '9') return (int)v;
        }
        ssize_t m = readlink(cur, link, sizeof(link) - 1);
        if (m <= 0) return -1;
        link[m] = '\0';
        if (link[0] == '/') {
            strcpy(cur, link);
        } else { /* relative to the link's folder */
            char *slash = strrchr(cur, '/');
            size_t keep = slash ? (size_t)(slash - cur) + 1 : 0;
            if (keep + (size_t)m >= sizeof(cur)) return -1;
            memcpy(cur + keep, link, (size_t)m + 1);
        }
    }
    return -1;
}

static bool straight_through(const struct stat *st)
{
    return S_ISCHR(st->st_mode) || S_ISFIFO(st->st_mode) || S_ISSOCK(st->st_mode);
}

int ps_out_open(struct ps_out *o, const char *path, struct ps_diag *diag)
{
    memset(o, 0, sizeof(*o));
    o->slot = -1;
    if (!path || strcmp(path, "-") == 0) {
        o->f = stdout;
        return 0;
    }
    int alias = fd_alias(path);
    if (alias >= 0) {
        int fd = fcntl(alias, F_DUPFD_CLOEXEC, 3);
        if (fd < 0 || !(o->f = fdopen(fd, "w"))) {
            int e = errno;
            if (fd >= 0) close(fd);
            return diag_errno(diag, e, path, "cannot open for writing");
        }
        o->path = strdup(path);
        o->direct = true;
        return 0;
    }
    char *real;
    struct stat st;
    int rc = classify(path, &real, &st, diag);
    if (rc) return rc;
    o->path = strdup(path);
    if (!o->path) {
        free(real);
        return ps_diag_set(diag, -ENOMEM, path, "out of memory");
    }
    if (straight_through(&st)) {
        /* a terminal, /dev/null, a FIFO: no temporary file, no rename (O3) */
        int fd = open(real, O_WRONLY | O_NOCTTY | O_CLOEXEC);
        free(real);
        if (fd < 0 || !(o->f = fdopen(fd, "w"))) {
            int e = errno;
            if (fd >= 0) close(fd);
            out_free(o);
            return diag_errno(diag, e, path, "cannot open for writing");
        }
        o->direct = true;
        return 0;
    }
    const char *base;
    char *par = parent_of(real, &base);
    o->name = par ? strdup(base) : NULL;
    if (!par || !o->name) rc = ps_diag_set(diag, -ENOMEM, path, "out of memory");
    if (rc == 0) rc = make_parents(par, diag);
    if (rc == 0 && (o->dirfd = open(par, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        o->dirfd = 0;
        rc = diag_errno(diag, errno, path, "cannot create the file");
    }
    char tmp[NAME_MAX + 1];
    int fd = -1;
    for (int tries = 0; rc == 0 && fd < 0; tries++) {
        temp_name(o->name, tmp);
        sigset_t held;
        hold_signals(&held);
        fd = openat(o->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        int e = errno;
        if (fd >= 0) o->slot = reg_add(R_FILE, o->dirfd, tmp);
        release_signals(&held);
        errno = e;
        if (fd < 0 && (errno != EEXIST || tries > 100)) {
            rc = diag_errno(diag, errno, path, "cannot create the file");
            ps_diag_hint(diag, "check that the folder is writable");
        }
    }
    free(par);
    free(real);
    if (rc) {
        out_free(o);
        return rc;
    }
    o->tmp = strdup(tmp);
    mode_t mode = 0644;
    if (S_ISREG(st.st_mode)) mode = st.st_mode & 07777;
    (void)fchmod(fd, mode);
    if (!o->tmp || !(o->f = fdopen(fd, "w"))) {
        int e = o->tmp ? errno : ENOMEM;
        close(fd);
        unlinkat(o->dirfd, tmp, 0);
        reg_del(o->slot);
        out_free(o);
        return diag_errno(diag, e, path, "cannot open the file");
    }
    return 0;
}

int ps_out_commit(struct ps_out *o, struct ps_diag *diag)
{
    if (!o->f) return ps_diag_set(diag, -EBADF, "output", "commit of a file that is not open");
    if (o->f == stdout) {
        memset(o, 0, sizeof(*o));
        return ps_out_stdout_check(diag);
    }
    int e = 0;
    errno = 0;
    if (fflush(o->f) != 0 || ferror(o->f)) e = errno ? errno : EIO;
    if (!e && o->sync && !o->direct && fsync(fileno(o->f)) != 0) e = errno;
    if (fclose(o->f) != 0 && !e) e = errno ? errno : EIO;
    o->f = NULL;
    if (o->direct) {
        char *p = o->path;
        o->path = NULL;
        out_free(o);
        int rc = e ? diag_errno(diag, e, p, "write error") : 0;
        free(p);
        return rc;
    }
    if (!e && defer.on) {
        if (defer_add(o) == 0) {
            o->dirfd = 0; /* owned by the deferral now */
            o->tmp = o->name = o->path = NULL;
            out_free(o);
            return 0;
        }
        e = ENOMEM;
    }
    if (!e && renameat(o->dirfd, o->tmp, o->dirfd, o->name) != 0) e = errno;
    if (e) {
        unlinkat(o->dirfd, o->tmp, 0);
        reg_del(o->slot);
        int rc = diag_errno(diag, e, o->path, "cannot write the file");
        out_free(o);
        return rc;
    }
    reg_del(o->slot);
    out_free(o);
    return 0;
}

void ps_out_abort(struct ps_out *o)
{
    if (!o) return;
    if (o->f == stdout) {
        fflush(stdout);
        memset(o, 0, sizeof(*o));
        return;
    }
    if (o->f) fclose(o->f);
    if (o->tmp) unlinkat(o->dirfd, o->tmp, 0);
    if (o->tmp) reg_del(o->slot);
    out_free(o);
}

int ps_out_write(const char *path, int (*write)(FILE *f, void *ctx, struct ps_diag *diag),
                 void *ctx, struct ps_diag *diag)
{
    struct ps_out o;
    int rc = ps_out_open(&o, path, diag);
    if (rc < 0) return rc;
    struct ps_diag wd;
    ps_diag_clear(&wd);
    errno = 0;
    rc = write(o.f, ctx, &wd);
    int e = errno;
    if (ferror(o.f)) {
        /* an I/O error (a full disk): name the file and say why, not the writer's "write error" */
        if (!e) {
            errno = 0;
            e = fflush(o.f) != 0 && errno ? errno : EIO;
        }
        ps_out_abort(&o);
        return diag_errno(diag, e, path && strcmp(path, "-") ? path : "stdout", "write error");
    }
    if (rc < 0) {
        if (diag && diag->code == 0) *diag = wd;
        else if (diag) diag->count++;
        ps_out_abort(&o);
        return rc;
    }
    return ps_out_commit(&o, diag);
}

int ps_out_check(const char *path, struct ps_diag *diag)
{
    if (!path || strcmp(path, "-") == 0) return 0;
    int alias = fd_alias(path);
    if (alias >= 0) {
        int fl = fcntl(alias, F_GETFL);
        if (fl < 0) return diag_errno(diag, errno, path, "cannot open for writing");
        if ((fl & O_ACCMODE) == O_RDONLY) return diag_errno(diag, EBADF, path, "cannot open for writing");
        return 0;
    }
    char *real;
    struct stat st;
    int rc = classify(path, &real, &st, diag);
    if (rc) return rc;
    if (straight_through(&st)) {
        rc = S_ISFIFO(st.st_mode) || access(real, W_OK) == 0
                 ? 0
                 : diag_errno(diag, errno, path, "cannot open for writing");
        free(real);
        return rc;
    }
    const char *base;
    char *par = parent_of(real, &base);
    if (!par) rc = ps_diag_set(diag, -ENOMEM, path, "out of memory");
    if (rc == 0) rc = make_parents(par, diag);
    int dirfd = -1;
    if (rc == 0 && (dirfd = open(par, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        rc = diag_errno(diag, errno, path, "cannot create the file");
    if (rc == 0) {
        /* the same temporary file the write will make, made and removed now */
        char tmp[NAME_MAX + 1];
        temp_name(base, tmp);
        sigset_t held;
        hold_signals(&held); /* the probe exists only while signals wait */
        int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        int e = errno;
        if (fd >= 0) {
            close(fd);
            unlinkat(dirfd, tmp, 0);
        }
        release_signals(&held);
        if (fd < 0) {
            rc = diag_errno(diag, e, path, "cannot create the file");
            ps_diag_hint(diag, "check that the folder is writable");
        }
    }
    if (dirfd >= 0) close(dirfd);
    free(par);
    free(real);
    return rc;
}

int ps_out_stdout_check(struct ps_diag *diag)
{
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        int e = errno ? errno : EIO;
        return diag_errno(diag, e, "stdout", "write error");
    }
    return 0;
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
