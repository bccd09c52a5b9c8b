/* diag: the first error of an operation, with where it happened and what to do.
 *
 * Library code never prints or exits. A failing function returns a negative errno and fills a
 * struct ps_diag: `where` is "file: json.path" or "file:line" or a CLI argument, `msg` says
 * what was expected and what was found, `hint` (optional) says what to do. Only the first error
 * is kept (SQLite's rule); later ones only bump `count`. The CLI prints it as one line:
 *     spec.json: pipeline.balance: sums to 6 layers but model.layers has 7 (hint: ...)
 */
#ifndef PS_DIAG_H
#define PS_DIAG_H

#include <stdarg.h>
#include <stddef.h>

#define PS_DIAG_WHERE_MAX 512
#define PS_DIAG_MSG_MAX 1024

struct ps_diag {
    char where[PS_DIAG_WHERE_MAX];
    char msg[PS_DIAG_MSG_MAX];
    char hint[PS_DIAG_MSG_MAX];
    int code;   /* negative errno of the first error, 0 when none */
    int count;  /* number of errors reported, first one kept */
};

void ps_diag_clear(struct ps_diag *d);
/* Records an error (first one wins) and returns `code` (a negative errno) for `return ps_diag_set(...)`. */
int ps_diag_set(struct ps_diag *d, int code, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int ps_diag_vset(struct ps_diag *d, int code, const char *where, const char *fmt, va_list ap);
/* Adds a hint to the recorded first error (ignored when a hint is already set). */
void ps_diag_hint(struct ps_diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Formats "where: msg (hint: hint)" into buf. */
const char *ps_diag_format(const struct ps_diag *d, char *buf, size_t len);
/* Copies `in` into out (len bytes, NUL-terminated) with every byte that is not part of printable
 * UTF-8 (invalid sequences, C0 and C1 controls, DEL) written as \xNN; never cuts a sequence or
 * an escape in half. 4 x strlen(in) + 1 bytes always suffice. */
void ps_diag_escape(const char *in, char *out, size_t len);

#endif
