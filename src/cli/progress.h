/* progress: what a long command is doing, on stderr, for phases longer than a second.
 *
 *   diagnose: cpu run 3/8 tasks ... 35%, 12.3 s, ETA 22 s
 *
 * On a terminal it is one line rewritten in place (and cleared when the phase ends); otherwise
 * (a pipe, a log file, CI) plain lines, at most one every 5 s, so logs stay short. Nothing is
 * printed for a phase until it has run for a second, and nothing at all with -q. The ETA is the
 * elapsed time scaled by the work left (linear in the fraction done).
 */
#ifndef PS_CLI_PROGRESS_H
#define PS_CLI_PROGRESS_H

#include <stdbool.h>

#include "src/cli/cli.h"

struct ps_progress {
    bool quiet, tty;
    const char *cmd;   /* "diagnose" */
    char phase[96];    /* "cpu run" */
    double t0;         /* start of the phase, s */
    double last;       /* last line printed, s (0 = none yet) */
    bool on_line;      /* a tty line is showing */
};

double ps_progress_now(void); /* monotonic seconds */
void ps_progress_init(struct ps_progress *p, const struct ps_cli *cli);
void ps_progress_begin(struct ps_progress *p, const char *phase);
/* frac in [0, 1]; i/n (n > 0) names the step counted ("3/8 settings"), unit its noun. */
void ps_progress_update(struct ps_progress *p, double frac, int i, int n, const char *unit);
/* Ends the phase: clears a tty line; a plain-line phase that printed says how it ended
 * ("done", "stopped"). */
void ps_progress_end(struct ps_progress *p, const char *how);

#endif
