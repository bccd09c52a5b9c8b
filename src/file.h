/* file: the one reader of pipescope's input files (spec, costs, --actions plan, traces, npy,
 * csv), bounded by the memory limit whatever the path names.
 *
 * A path may name a regular file, a character device (/dev/zero never ends), a FIFO or a gzip
 * stream whose decompressed size nobody knows in advance. Every reader goes through here, so
 * every byte taken in counts against PIPESCOPE_MEM_LIMIT (memlimit.h) and a refusal is one
 * error line naming the file, and the line and column where reading stopped.
 *
 *   ps_file_read        whole file -> NUL-terminated text (JSON, npy)
 *   ps_file_open/fill   the same in steps: read what a header needs, decide, read the rest
 *   ps_file_lines_*     line by line (csv), each line bounded by the limit
 */
#ifndef PS_FILE_H
#define PS_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/diag.h"

struct ps_file_opts {
    /* errors on open say "cannot read NOUN: ..." ("the spec"); NULL: "cannot open: ..." */
    const char *noun;
    /* bytes of memory the caller needs per byte read (the text plus, for JSON, cJSON's tree);
     * the file is refused when factor x its size exceeds the memory limit. 0 means 1. */
    double factor;
    /* a hard cap on the size in bytes independent of the memory limit (0: none) */
    size_t max_bytes;
    /* decompress a gzip stream (recognised by its magic bytes 1f 8b); else read bytes as-is */
    bool gzip;
    /* the caller consumes the text as it reads (src/trace_json.c): it drops what it has used by
     * moving the rest to the front of text and lowering len. The buffer then starts small and a
     * regular file is not refused for its size (what the caller keeps is its own to count);
     * F1 still bounds the text held at any time. */
    bool stream;
};

/* An input being read. `text` holds what was read so far, always NUL-terminated (len bytes
 * plus the NUL). Zero-initialise, or let ps_file_open do it. */
struct ps_file_in {
    char *text;
    size_t len, cap;
    bool eof;
    /* private */
    int fd;
    const char *path;
    struct ps_file_opts opts;
    uint64_t limit; /* bytes of text the memory limit allows (limit / factor) */
    bool regular;
    size_t line_from; /* positions in errors count lines from text + line_from, */
    long base_line;   /* after base_line lines (ps_file_lines: those already returned) */
    void *z;        /* z_stream while decompressing */
    unsigned char *zin;
    size_t zin_len, zin_pos;
};

/* Opens `path` (a folder is -EISDIR "cannot read: Is a directory"); a regular file is checked
 * against the limit at once. Returns 0 or a negative errno with diag; on failure nothing is
 * left open. */
int ps_file_open(struct ps_file_in *in, const char *path, const struct ps_file_opts *o,
                 struct ps_diag *d);
/* Reads until in->len >= want or the end of the input (in->eof). Returns 0 (check in->len: it
 * is short only at the end), or a negative errno with diag: -E2BIG past the memory limit or
 * max_bytes ("FILE:LINE:COL: ..."), -EIO for a read error or a corrupt gzip stream. */
int ps_file_fill(struct ps_file_in *in, size_t want, struct ps_diag *d);
/* Closes the input; keeps in->text unless `keep_text` is false. Accepts a zeroed struct. */
void ps_file_close(struct ps_file_in *in, bool keep_text);

/* The whole file: *text (malloc'd, NUL-terminated, free with free()) and *len. Returns 0 or a
 * negative errno with diag; *text is NULL on failure. */
int ps_file_read(const char *path, const struct ps_file_opts *o, char **text, size_t *len,
                 struct ps_diag *d);

/* 1-based line and column (in UTF-8 characters) of byte `pos` of `text`. */
void ps_file_line_col(const char *text, size_t pos, int *line, int *col);

/* ---- line by line (csv; gzip decompressed) ------------------------------------------------ */

struct ps_file_lines {
    struct ps_file_in in;
    size_t start;    /* offset in in.text of the next line */
    long lineno;     /* number of the line last returned (1-based) */
};

int ps_file_lines_open(struct ps_file_lines *l, const char *path, struct ps_diag *d);
/* The next line, without its "\n" (a "\r" before it stays), NUL-terminated in place: returns 1
 * with *line and *len, 0 at the end of the file, or a negative errno with diag ("FILE:LINE: a
 * NUL byte in the line", a line longer than the memory limit allows, a corrupt gzip stream).
 * *line stays valid until the next call. */
int ps_file_lines_next(struct ps_file_lines *l, char **line, size_t *len, struct ps_diag *d);
void ps_file_lines_close(struct ps_file_lines *l);

/* ---- the inputs read so far ----------------------------------------------------------------- */

/* Every regular file ps_file_open opened, by identity (device and inode) and by its resolved
 * name, so that no output replaces an input (viz/out.c): `simulate S.json --json S.json`. */
struct ps_file_input {
    uint64_t dev, ino;
    char *real; /* realpath of the name given, NULL when it could not be resolved */
};
int ps_file_inputs(const struct ps_file_input **list);

#endif
