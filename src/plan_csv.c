/* plan_csv: PyTorch pipelining's schedule CSV, both ways.
 *
 * The format of PipelineScheduleMulti._dump_csv / _load_csv (torch/distributed/pipelining/
 * schedules.py): one row per rank, one cell per step, each cell an _Action string
 *     <stage><kind><micro-batch>     kind F forward, I input gradient, W weight gradient,
 *                                    B full backward (input and weight gradient)
 *     (<a>;<b>)OVERLAP_F_B           DualPipeV's overlapped forward + backward pair
 *     <stage>SEND_F<mb>, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD
 *                                    communication and FSDP actions of the lowered format:
 *                                    accepted and skipped (the graph models every transfer
 *                                    as a copy between the stages' devices)
 * An empty cell is an idle step (skipped: dependencies make a rank wait). Cells may be quoted.
 *
 * Mapping onto a plan (schedule.h): row r is lane r, on the device of its lowest stage; F -> F,
 * I -> B of a split cell (its W must appear), B -> B of an unsplit cell (no W may appear),
 * W -> W. A cell is one (stage, micro-batch). The writer inverts this exactly: a B is written I
 * when its cell has a W, B otherwise, and overlap pairs as (a;b)OVERLAP_F_B, so a built-in
 * schedule written here loads unchanged in PyTorch and reads back into the same plan.
 *
 * ps_plan_csv writes each rank's actions back to back: the order _PipelineScheduleRuntime runs
 * (each rank in list order, waiting for its data). PipelineScheduleMulti's step-by-step executor
 * instead runs column t of every row in step t and exchanges tensors at the end of the step, so
 * its CSV is a timestep grid with idle (empty) cells: ps_plan_csv_grid places each rank's next
 * action in the first step after everything it reads was produced (F(i,s) after F(i,s-1); B or
 * I after F(i,s) and B(i,s+1); W after its I), as PyTorch's generators pad with None.
 */
#include "src/plan.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cell {
    int stage, mb;
    char kind; /* F I B W, or 0 for a skipped communication action */
};

static const char *const comm_kinds[] = {"UNSHARD", "RESHARD", "REDUCE_GRAD", "SEND_F",
                                         "RECV_F",  "SEND_B",  "RECV_B"};

/* one action "<stage><kind><mb>" in [s, e); returns 0 or -1 */
static int parse_one(const char *s, const char *e, struct cell *c)
{
    while (s < e && isspace((unsigned char)*s)) s++;
    while (e > s && isspace((unsigned char)e[-1])) e--;
    const char *p = s;
    long st = 0;
    if (p == e || !isdigit((unsigned char)*p)) return -1;
    while (p < e && isdigit((unsigned char)*p)) {
        st = st * 10 + (*p++ - '0');
        if (st > 1000000) return -1;
    }
    c->stage = (int)st;
    c->kind = 0;
    size_t rest = (size_t)(e - p);
    for (size_t k = 0; k < sizeof(comm_kinds) / sizeof(*comm_kinds); k++) {
        size_t n = strlen(comm_kinds[k]);
        if (rest >= n && memcmp(p, comm_kinds[k], n) == 0) {
            for (const char *q = p + n; q < e; q++)
                if (!isdigit((unsigned char)*q)) return -1;
            c->mb = -1;
            return 0;
        }
    }
    if (p == e || !strchr("FIBW", *p)) return -1;
    c->kind = *p++;
    long mb = 0;
    if (p == e) return -1;
    while (p < e && isdigit((unsigned char)*p)) {
        mb = mb * 10 + (*p++ - '0');
        if (mb > 100000000) return -1;
    }
    if (p != e) return -1;
    c->mb = (int)mb;
    return 0;
}

/* one cell: up to two actions (an OVERLAP_F_B pair); returns the count, or -1 */
static int parse_cell(const char *s, const char *e, struct cell out[2])
{
    while (s < e && isspace((unsigned char)*s)) s++;
    while (e > s && isspace((unsigned char)e[-1])) e--;
    if (e - s >= 2 && *s == '"' && e[-1] == '"') s++, e--;
    if (s == e) return 0;
    if (*s != '(') return parse_one(s, e, &out[0]) ? -1 : 1;
    const char *close = memchr(s, ')', (size_t)(e - s)), *semi = memchr(s, ';', (size_t)(e - s));
    static const char tag[] = "OVERLAP_F_B";
    if (!close || !semi || semi > close || (size_t)(e - close - 1) != strlen(tag) ||
        memcmp(close + 1, tag, strlen(tag)) != 0)
        return -1;
    if (parse_one(s + 1, semi, &out[0]) || parse_one(semi + 1, close, &out[1])) return -1;
    if (!out[0].kind || !out[1].kind) return -1;
    return 2;
}

int ps_plan_csv_parse(const char *text, const char *name, const struct ps_spec *spec,
                          struct ps_plan *out, struct ps_diag *diag)
{
    memset(out, 0, sizeof(*out));
    int S = spec->n_partitions, m = spec->mb_count;
    /* rows (trailing blank lines aside) and room for the most actions one row can hold: two
       per cell (an overlapped pair) */
    size_t len = strlen(text);
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
        len--;
    int rows = len ? 1 : 0;
    uint32_t most = 2, here = 2;
    for (size_t k = 0; k < len; k++) {
        if (text[k] == ',') here += 2;
        if (text[k] == '\n') rows++, here = 2;
        if (here > most) most = here;
    }
    if (rows == 0) return ps_diag_set(diag, -EINVAL, name, "no rows: expected one row per rank");
    if (rows > S)
        return ps_diag_set(diag, -EINVAL, name,
                           "%d rows (ranks), but the spec has only %d partitions (stages)", rows, S);
    if (ps_plan_alloc(out, rows, S, m, most)) return ps_diag_set(diag, -ENOMEM, name, "out of memory");
    out->mixed = true;
    size_t cells = (size_t)S * (size_t)m;
    uint8_t *kinds = calloc(cells, 1); /* bit 1 I, 2 B, 4 W */
    int *low = malloc((size_t)rows * sizeof(int));
    int rc = 0;
    if (!kinds || !low) {
        rc = ps_diag_set(diag, -ENOMEM, name, "out of memory");
        goto out;
    }
    const char *p = text;
    for (int r = 0; r < rows; r++) low[r] = -1;
    for (int r = 0; r < rows && !rc; r++) {
        const char *eol = strchr(p, '\n');
        if (!eol) eol = p + strlen(p);
        const char *le = eol;
        if (le > p && le[-1] == '\r') le--;
        int step = 0;
        for (const char *c = p; c <= le && !rc; step++) {
            const char *ce = memchr(c, ',', (size_t)(le - c));
            if (!ce) ce = le;
            struct cell a[2];
            int n = parse_cell(c, ce, a);
            if (n < 0) {
                rc = ps_diag_set(diag, -EINVAL, name,
                                 "rank %d, step %d: \"%.*s\" is not an action (expected e.g. 2F0, "
                                 "1I3, 0W1, 3B2 or (0F7;7B3)OVERLAP_F_B)",
                                 r, step, (int)(ce - c > 40 ? 40 : ce - c), c);
                break;
            }
            for (int k = 0; k < n && !rc; k++) {
                if (!a[k].kind) {
                    out->ignored++;
                    continue;
                }
                if (a[k].stage >= S) {
                    rc = ps_diag_set(diag, -EINVAL, name,
                                     "rank %d, step %d: stage %d, but the spec has %d partitions "
                                     "(stages 0..%d)",
                                     r, step, a[k].stage, S, S - 1);
                    break;
                }
                if (a[k].mb >= m) {
                    rc = ps_diag_set(diag, -EINVAL, name,
                                     "rank %d, step %d: micro-batch %d, but the spec runs %d "
                                     "micro-batches (0..%d)",
                                     r, step, a[k].mb, m, m - 1);
                    ps_diag_hint(diag, "set pipeline.chunks (and batch) so that the spec has the "
                                       "schedule's micro-batch count");
                    break;
                }
                enum ps_action_kind kind = a[k].kind == 'F'   ? PS_ACT_F
                                           : a[k].kind == 'W' ? PS_ACT_W
                                                              : PS_ACT_B;
                size_t cl = (size_t)a[k].mb * S + a[k].stage;
                if (a[k].kind == 'I') kinds[cl] |= 1;
                if (a[k].kind == 'B') kinds[cl] |= 2;
                if (a[k].kind == 'W') kinds[cl] |= 4, out->split = true;
                ps_plan_push(out, r, kind, a[k].mb, a[k].stage);
                if (n == 2 && k == 0) out->act[r][out->len[r] - 1].overlap = 1;
                if (low[r] < 0 || a[k].stage < low[r]) low[r] = a[k].stage;
            }
            c = ce + 1;
        }
        p = *eol ? eol + 1 : eol;
    }
    for (size_t c = 0; c < cells && !rc; c++) {
        int st = (int)(c % (size_t)S), mb = (int)(c / (size_t)S);
        if ((kinds[c] & 1) && !(kinds[c] & 4))
            rc = ps_diag_set(diag, -EINVAL, name,
                             "stage %d: %dI%d (input gradient) has no %dW%d (weight gradient)", st,
                             st, mb, st, mb);
        else if ((kinds[c] & 2) && (kinds[c] & 4))
            rc = ps_diag_set(diag, -EINVAL, name,
                             "stage %d: %dB%d is a full backward, so %dW%d cannot also appear "
                             "(write %dI%d for the input gradient alone)",
                             st, st, mb, st, mb, st, mb);
        else if ((kinds[c] & 4) && !(kinds[c] & 3))
            rc = ps_diag_set(diag, -EINVAL, name, "stage %d: %dW%d has no %dI%d before it", st,
                             st, mb, st, mb);
    }
    for (int r = 0; r < rows && !rc; r++) {
        if (low[r] < 0) {
            rc = ps_diag_set(diag, -EINVAL, name, "rank %d has no compute action", r);
            break;
        }
        out->lane_device[r] = spec->device_id[low[r]];
    }
out:
    free(kinds);
    free(low);
    if (rc) ps_plan_finish(out);
    return rc;
}

static char kind_char(const struct ps_action *a, const uint8_t *has_w, int S)
{
    return a->kind == PS_ACT_F   ? 'F'
           : a->kind == PS_ACT_W ? 'W'
           : has_w[(size_t)a->mb * S + a->stage] ? 'I'
                                                 : 'B';
}

/* cells with a W (their B is PyTorch's I); NULL on out of memory */
static uint8_t *cells_with_w(const struct ps_plan *p)
{
    size_t cells = (size_t)p->n_stages * (size_t)p->m;
    uint8_t *has_w = calloc(cells ? cells : 1, 1);
    for (int l = 0; l < p->n_lanes && has_w; l++)
        for (uint32_t k = 0; k < p->len[l]; k++)
            if (p->act[l][k].kind == PS_ACT_W)
                has_w[(size_t)p->act[l][k].mb * p->n_stages + p->act[l][k].stage] = 1;
    return has_w;
}

/* the cell of lane l's action k (and its overlap partner) at buf + n; returns the actions used */
static uint32_t put_cell(const struct ps_plan *p, int l, uint32_t k, const uint8_t *has_w,
                         char *buf, size_t cap, size_t *n)
{
    const struct ps_action *a = &p->act[l][k];
    bool pair = a->overlap && k + 1 < p->len[l];
    if (pair) buf[(*n)++] = '(';
    *n += (size_t)snprintf(buf + *n, cap - *n, "%d%c%d", a->stage, kind_char(a, has_w, p->n_stages),
                           a->mb);
    if (!pair) return 1;
    const struct ps_action *b = &p->act[l][k + 1];
    *n += (size_t)snprintf(buf + *n, cap - *n, ";%d%c%d)OVERLAP_F_B", b->stage,
                           kind_char(b, has_w, p->n_stages), b->mb);
    return 2;
}

char *ps_plan_csv(const struct ps_plan *p)
{
    size_t n = 0, cap = 64;
    for (int l = 0; l < p->n_lanes; l++) cap += (size_t)p->len[l] * 48 + 2;
    uint8_t *has_w = cells_with_w(p);
    char *buf = malloc(cap);
    if (!buf || !has_w) {
        free(buf);
        free(has_w);
        return NULL;
    }
    for (int l = 0; l < p->n_lanes; l++) {
        for (uint32_t k = 0; k < p->len[l];) {
            if (k) buf[n++] = ',';
            k += put_cell(p, l, k, has_w, buf, cap, &n);
        }
        buf[n++] = '\n';
    }
    buf[n] = 0;
    free(has_w);
    return buf;
}

/* ---- the timestep grid ------------------------------------------------------------------------ */

/* step at which each cell's F and B (or I) ran, INT32_MAX before */
struct grid_state {
    int32_t *f, *b;
    int S;
};

static bool ready(const struct grid_state *g, const struct ps_action *a, int t)
{
    size_t c = (size_t)a->mb * g->S + a->stage;
    if (a->kind == PS_ACT_F) return a->stage == 0 || g->f[c - 1] < t;
    if (a->kind == PS_ACT_W) return g->b[c] < t;
    return g->f[c] < t && (a->stage == g->S - 1 || g->b[c + 1] < t);
}

/* step[l][k] for every action: each step every lane runs its next cell when everything it reads
   was produced in an earlier step, and idles otherwise */
static int grid_steps(const struct ps_plan *p, uint32_t **step, int *n_steps)
{
    size_t cells = (size_t)p->n_stages * (size_t)p->m;
    struct grid_state g = {malloc((cells + 1) * sizeof(int32_t)),
                           malloc((cells + 1) * sizeof(int32_t)), p->n_stages};
    uint32_t *pos = calloc((size_t)p->n_lanes + 1, sizeof(uint32_t)),
             *took = calloc((size_t)p->n_lanes + 1, sizeof(uint32_t));
    int rc = g.f && g.b && pos && took ? 0 : -ENOMEM;
    for (size_t c = 0; !rc && c < cells; c++) g.f[c] = g.b[c] = INT32_MAX;
    uint64_t left = 0;
    for (int l = 0; l < p->n_lanes; l++) left += p->len[l];
    int t = 0;
    for (; !rc && left; t++) {
        bool moved = false;
        for (int l = 0; l < p->n_lanes; l++) {
            took[l] = 0;
            if (pos[l] >= p->len[l]) continue;
            const struct ps_action *a = &p->act[l][pos[l]];
            uint32_t w = a->overlap && pos[l] + 1 < p->len[l] ? 2 : 1;
            bool ok = true;
            for (uint32_t k = 0; k < w; k++) ok = ok && ready(&g, a + k, t);
            if (ok) took[l] = w, moved = true;
        }
        if (!moved) rc = -EDEADLK;
        for (int l = 0; l < p->n_lanes && !rc; l++)
            for (uint32_t k = 0; k < took[l]; k++, pos[l]++, left--) {
                const struct ps_action *a = &p->act[l][pos[l]];
                size_t c = (size_t)a->mb * g.S + a->stage;
                if (a->kind == PS_ACT_F) g.f[c] = t;
                else if (a->kind == PS_ACT_B) g.b[c] = t;
                step[l][pos[l]] = (uint32_t)t;
            }
    }
    *n_steps = t;
    free(g.f), free(g.b), free(pos), free(took);
    return rc;
}

int ps_plan_csv_grid(const struct ps_plan *p, char **out)
{
    *out = NULL;
    uint32_t **step = calloc((size_t)p->n_lanes + 1, sizeof(*step));
    int rc = step ? 0 : -ENOMEM, T = 0;
    for (int l = 0; l < p->n_lanes && !rc; l++)
        if (!(step[l] = malloc(((size_t)p->len[l] + 1) * sizeof(uint32_t)))) rc = -ENOMEM;
    if (!rc) rc = grid_steps(p, step, &T);
    size_t n = 0, cap = 64 + (size_t)p->n_lanes * ((size_t)T + 2);
    for (int l = 0; l < p->n_lanes; l++) cap += (size_t)p->len[l] * 48;
    uint8_t *has_w = rc ? NULL : cells_with_w(p);
    char *buf = rc ? NULL : malloc(cap);
    if (!rc && (!has_w || !buf)) rc = -ENOMEM;
    for (int l = 0; l < p->n_lanes && !rc; l++) {
        uint32_t t = 0;
        for (uint32_t k = 0; k < p->len[l];) {
            for (; t < step[l][k]; t++)
                if (t) buf[n++] = ',';
            if (t++) buf[n++] = ',';
            k += put_cell(p, l, k, has_w, buf, cap, &n);
        }
        buf[n++] = '\n';
    }
    if (!rc) buf[n] = 0, *out = buf;
    else free(buf);
    for (int l = 0; step && l < p->n_lanes; l++) free(step[l]);
    free(step);
    free(has_w);
    return rc;
}
