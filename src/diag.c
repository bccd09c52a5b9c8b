/* diag: keeps the first error of an operation (see diag.h). */
#include "src/diag.h"

#include <stdio.h>
#include <string.h>

void ps_diag_clear(struct ps_diag *d)
{
    if (d) memset(d, 0, sizeof(*d));
}

int ps_diag_vset(struct ps_diag *d, int code, const char *where, const char *fmt, va_list ap)
{
    if (!d) return code;
    d->count++;
    if (d->count > 1) return code;
    d->code = code;
    snprintf(d->where, sizeof(d->where), "%s", where ? where : "");
    vsnprintf(d->msg, sizeof(d->msg), fmt, ap);
    d->hint[0] = '\0';
    return code;
}

int ps_diag_set(struct ps_diag *d, int code, const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ps_diag_vset(d, code, where, fmt, ap);
    va_end(ap);
    return code;
}

void ps_diag_hint(struct ps_diag *d, const char *fmt, ...)
{
    if (!d || d->hint[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->hint, sizeof(d->hint), fmt, ap);
    va_end(ap);
}

const char *ps_diag_format(const struct ps_diag *d, char *buf, size_t len)
{
    if (!d->hint[0])
        snprintf(buf, len, "%s%s%s", d->where, d->where[0] ? ": " : "", d->msg);
    else
        snprintf(buf, len, "%s%s%s (hint: %s)", d->where, d->where[0] ? ": " : "", d->msg,
                 d->hint);
    return buf;
}
