/* trace_names: recognising the profiler range names of pipescope, PyTorch pipelining and
 * fairscale (see trace_names.h).
 *
 * Every pattern must match the whole name, so "PP:0F3x" or "chunk1-part2-extra" are nobody's
 * task; numbers are plain decimal digits (no sign, at most 8 of them).
 */
#include "src/trace_names.h"

#include <string.h>

/* reads 1-8 decimal digits at *p; -1 when there are none or too many */
static int32_t number(const char **p)
{
    const char *s = *p;
    int32_t v = 0;
    int n = 0;
    while (*s >= '0' && *s <= '9') {
        if (++n > 8) return -1;
        v = v * 10 + (*s++ - '0');
    }
    if (!n) return -1;
    *p = s;
    return v;
}

static bool pipescope_name(const char *name, struct ps_tname *out)
{
    static const struct {
        const char *pre;
        char kind;
    } k[] = {{"Wg(", 'W'}, {"F(", 'F'}, {"B(", 'B'}, {"R(", 'R'}};
    char buf[64];
    size_t n = 0;
    for (const char *s = name; *s; s++) {
        if (*s == ' ' || *s == '\t') continue;
        if (n + 1 >= sizeof(buf)) return false;
        buf[n++] = *s;
    }
    buf[n] = '\0';
    for (size_t q = 0; q < sizeof(k) / sizeof(k[0]); q++) {
        size_t lp = strlen(k[q].pre);
        if (strncmp(buf, k[q].pre, lp) != 0) continue;
        const char *p = buf + lp;
        int32_t i = number(&p);
        if (i < 0 || *p++ != ',') return false;
        int32_t j = number(&p);
        if (j < 0 || *p++ != ')' || *p) return false;
        *out = (struct ps_tname){PS_TN_PIPESCOPE, k[q].kind, i, j};
        return true;
    }
    return false;
}

static bool pytorch_name(const char *name, struct ps_tname *out)
{
    if (strncmp(name, "PP:", 3) != 0) return false;
    const char *p = name + 3;
    if (*p == '(') { /* OVERLAP_F_B and other combined actions: "(0F1;1B0)OVERLAP_F_B" */
        const char *c = strchr(p, ')');
        if (!c || !c[1]) return false;
        *out = (struct ps_tname){PS_TN_PP_OTHER, 0, -1, -1};
        return true;
    }
    int32_t s = number(&p);
    if (s < 0) return false;
    static const char *const other[] = {"SEND_F", "RECV_F", "SEND_B", "RECV_B",
                                        "UNSHARD", "RESHARD", "REDUCE_GRAD"};
    for (size_t q = 0; q < sizeof(other) / sizeof(other[0]); q++) {
        size_t l = strlen(other[q]);
        if (strncmp(p, other[q], l) != 0) continue;
        const char *r = p + l;
        if (*r && (number(&r) < 0 || *r)) return false;
        *out = (struct ps_tname){PS_TN_PP_OTHER, 0, -1, s};
        return true;
    }
    char kind = *p;
    if (kind != 'F' && kind != 'I' && kind != 'W' && kind != 'B') return false;
    p++;
    int32_t mb = number(&p);
    if (mb < 0 || *p) return false;
    *out = (struct ps_tname){PS_TN_PP, kind, mb, s};
    return true;
}

static bool fairscale_name(const char *name, struct ps_tname *out)
{
    if (strncmp(name, "chunk", 5) != 0) return false;
    const char *p = name + 5;
    int32_t i = number(&p);
    if (i < 0 || strncmp(p, "-part", 5) != 0) return false;
    p += 5;
    int32_t j = number(&p);
    if (j < 0 || *p) return false;
    *out = (struct ps_tname){PS_TN_FAIRSCALE, 'F', i, j};
    return true;
}

bool ps_tname_parse(const char *name, struct ps_tname *out)
{
    *out = (struct ps_tname){PS_TN_NONE, 0, -1, -1};
    return pipescope_name(name, out) || pytorch_name(name, out) || fairscale_name(name, out);
}

const char *ps_tname_conv_name(enum ps_tname_conv c)
{
    switch (c) {
    case PS_TN_PIPESCOPE: return "pipescope";
    case PS_TN_PP:
    case PS_TN_PP_OTHER: return "pytorch";
    case PS_TN_FAIRSCALE: return "fairscale";
    case PS_TN_NONE: break;
    }
    return "none";
}
