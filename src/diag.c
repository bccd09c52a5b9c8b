/* diag: keeps the first error of an operation (see diag.h).
 *
 * An error line quotes what the user gave (file names, spec values, .npy descr, CSV cells):
 * ps_diag_format writes it as one line of valid UTF-8 whatever those bytes are: control
 * characters (ESC, CR, newline, C1) and bytes that are not UTF-8 become \xNN, so no input can
 * forge a second line ("pipescope: check passed") or send terminal escapes. */
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

/* Length of the valid UTF-8 sequence at s (1-4) that is not a control character, or 0. */
static int printable_at(const unsigned char *s)
{
    unsigned c = s[0];
    if (c < 0x20 || c == 0x7f) return 0;
    if (c < 0x80) return 1;
    int n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (n == 0) return 0;
    for (int k = 1; k < n; k++)
        if ((s[k] & 0xc0) != 0x80) return 0;
    if (n == 2 && c == 0xc2 && s[1] < 0xa0) return 0;                 /* C1 controls */
    if (n == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))) return 0;
    if (n == 4 && ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))) return 0;
    return n;
}

void ps_diag_escape(const char *in, char *out, size_t len)
{
    size_t o = 0;
    const unsigned char *s = (const unsigned char *)in;
    while (*s) {
        int n = printable_at(s);
        if (n == 0) {
            if (o + 5 > len) break;
            snprintf(out + o, 5, "\\x%02x", *s);
            o += 4;
            s++;
        } else {
            if (o + (size_t)n + 1 > len) break;
            memcpy(out + o, s, (size_t)n);
            o += (size_t)n;
            s += n;
        }
    }
    if (len) out[o < len ? o : len - 1] = '\0';
}

const char *ps_diag_format(const struct ps_diag *d, char *buf, size_t len)
{
    char raw[PS_DIAG_WHERE_MAX + 2 * PS_DIAG_MSG_MAX + 16];
    if (!d->hint[0])
        snprintf(raw, sizeof(raw), "%s%s%s", d->where, d->where[0] ? ": " : "", d->msg);
    else
        snprintf(raw, sizeof(raw), "%s%s%s (hint: %s)", d->where, d->where[0] ? ": " : "", d->msg,
                 d->hint);
    ps_diag_escape(raw, buf, len);
    return buf;
}
