/* memlimit: the memory limit every proportional allocation is checked against (memlimit.h).
 *
 * Invariant: the limit never exceeds 3/4 of RLIMIT_AS or RLIMIT_DATA, so a refused estimate is
 * an error message, and an estimate that slips through still meets a malloc that fails (and an
 * ENOMEM path) rather than the OOM killer.
 */
#include "src/memlimit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0)) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return -1;
    v *= mul;
    if (v < 1 || v > 1.8e19) return -1;
    *out = (uint64_t)v;
    return 0;
}

static void cap_rlimit(int which, uint64_t *limit)
{
    struct rlimit rl;
    if (getrlimit(which, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
    uint64_t cap = (uint64_t)rl.rlim_cur / 4 * 3;
    if (cap < *limit) *limit = cap;
}

int ps_memlimit_get(uint64_t *bytes, struct ps_diag *d)
{
    uint64_t limit = PS_MEMLIMIT_DEFAULT;
    const char *env = getenv(PS_MEMLIMIT_ENV);
    if (env && *env) {
        if (parse_size(env, &limit)) {
            *bytes = PS_MEMLIMIT_DEFAULT;
            ps_diag_set(d, -EINVAL, PS_MEMLIMIT_ENV,
                        "'%.64s' is not a size (expected bytes with an optional K, M, G or T "
                        "suffix, e.g. 64G)",
                        env);
            return -EINVAL;
        }
    } else {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0) {
            uint64_t phys = (uint64_t)pages * (uint64_t)page / 4 * 3;
            if (phys < limit) limit = phys;
        }
    }
    cap_rlimit(RLIMIT_AS, &limit);
    cap_rlimit(RLIMIT_DATA, &limit);
    *bytes = limit;
    return 0;
}

const char *ps_memlimit_format(double b, char *buf, int len)
{
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int k = 0;
    while (b >= 1024 && k < 6) {
        b /= 1024;
        k++;
    }
    snprintf(buf, (size_t)len, k ? "%.3g %s" : "%.0f %s", b, unit[k]);
    return buf;
}

int ps_memlimit_check(double need, const char *where, const char *what, const char *smaller,
                      struct ps_diag *d)
{
    uint64_t limit;
    int rc = ps_memlimit_get(&limit, d);
    if (rc) return rc;
    if (!(need > (double)limit)) return 0;
    char nb[32], lb[32];
    ps_diag_set(d, -E2BIG, where, "%s would need %s of memory; the limit is %s", what,
                ps_memlimit_format(need, nb, sizeof(nb)),
                ps_memlimit_format((double)limit, lb, sizeof(lb)));
    ps_diag_hint(d, "%s, or raise the limit with %s=SIZE (e.g. 64G)", smaller, PS_MEMLIMIT_ENV);
    return -E2BIG;
}
