/* cli/progress: progress lines on stderr (see progress.h). Invariants: nothing is printed with
 * -q or before a phase has run for PS_PROGRESS_QUIET_S; on a terminal at most one line is showing
 * and it is cleared at the end of the phase, so stdout's findings never interleave with it. */
#include "src/cli/progress.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PS_PROGRESS_QUIET_S 1.0 /* phases shorter than this print nothing */
#define PS_PROGRESS_TTY_S 0.2   /* tty: redraw at most this often */
#define PS_PROGRESS_LINE_S 5.0  /* plain lines: at most one this often */

double ps_progress_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ps_progress_init(struct ps_progress *p, const struct ps_cli *cli)
{
    memset(p, 0, sizeof(*p));
    p->quiet = cli->verbosity < 0;
    p->tty = isatty(STDERR_FILENO) == 1;
    p->cmd = cli->cmd;
}

void ps_progress_begin(struct ps_progress *p, const char *phase)
{
    snprintf(p->phase, sizeof(p->phase), "%s", phase);
    p->t0 = ps_progress_now();
    p->last = 0;
    p->on_line = false;
}

static void fmt_s(char *buf, size_t len, double s)
{
    if (!isfinite(s) || s < 0) snprintf(buf, len, "?");
    else if (s < 60) snprintf(buf, len, "%.1f s", s);
    else snprintf(buf, len, "%d min %02d s", (int)(s / 60), (int)fmod(s, 60));
}

void ps_progress_update(struct ps_progress *p, double frac, int i, int n, const char *unit)
{
    if (p->quiet) return;
    double now = ps_progress_now(), el = now - p->t0;
    if (el < PS_PROGRESS_QUIET_S) return;
    if (p->last > 0 && now - p->last < (p->tty ? PS_PROGRESS_TTY_S : PS_PROGRESS_LINE_S)) return;
    p->last = now;
    char e[32], eta[32], count[64] = "";
    fmt_s(e, sizeof(e), el);
    fmt_s(eta, sizeof(eta), frac > 0 ? el * (1 - frac) / frac : NAN);
    if (n > 0) snprintf(count, sizeof(count), " %d/%d %s", i, n, unit ? unit : "");
    fprintf(stderr, "%s%s: %s%s, %.0f%%, %s, ETA %s%s", p->tty ? "\r\033[K" : "", p->cmd,
            p->phase, count, 100 * (frac < 0 ? 0 : frac > 1 ? 1 : frac), e, eta,
            p->tty ? "" : "\n");
    fflush(stderr);
    p->on_line = p->tty;
}

void ps_progress_end(struct ps_progress *p, const char *how)
{
    if (p->quiet) return;
    if (p->on_line) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    } else if (p->last > 0) {
        char e[32];
        fmt_s(e, sizeof(e), ps_progress_now() - p->t0);
        fprintf(stderr, "%s: %s %s after %s\n", p->cmd, p->phase, how ? how : "done", e);
    }
    p->on_line = false;
    p->last = 0;
}
