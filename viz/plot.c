/* plot: pipescope's own SVG pictures (no Graphviz): Gantt timelines and line plots.
 *
 * Gantt: one lane per (device, stream) that has records, ordered by device then stream id (host
 * last); a box per record, coloured by category (forward, backward, recompute, copy, wait ...),
 * with the micro-batch number inside when the box is wide enough and the task name, start and
 * duration as its tooltip (<title>). A second trace (measured vs simulated) is drawn as a second
 * block of lanes below the first: on the same time axis when their spans are within a factor 2,
 * else each block on its own axis, so neither is drawn as an empty strip. An axis starts at
 * min(0, first start) and is labelled in us, ms or s according to its range. Lanes name what ran
 * them (a CPU run's lanes are "cpu (cuda:0 tasks) ...", a measured task with attributed GPU work is
 * on the real CUDA stream it ran on: "cuda:1 CUDA stream 7 (measured)"); a simulated trace with issue times gets a
 * "launches" lane per device with the host's launch of every node, so a launch-bound timeline
 * shows where its time goes; zero-length events are drawn 1.5 px wide.
 *
 *     title
 *     simulated: makespan 1.234 ms
 *       cuda:0 compute |[0][1][2]   [2][1][0]
 *        cuda:0 copy.. |   [0][1][2]
 *     measured: ...
 *                      +----+----+----+----+   time (ms)
 *                      legend
 *
 * Line plots (sweeps, drift): x values, linear or log2 axis, several named series with markers
 * (a NaN leaves a gap), nice ticks (1, 2, 5 x 10^k), axis labels, legend on the right, title.
 *
 * Output is valid standalone SVG 1.1; text is XML-escaped; every number is printed in a fixed
 * format (coordinates %.2f), so the same input gives the same bytes.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "viz/viz.h"

/* ---- SVG primitives -------------------------------------------------------------------- */

/* "%.2f" without "-0.00"; buffers rotate so several can appear in one printf */
static const char *n2(double v)
{
    static _Thread_local char bufs[8][40];
    static _Thread_local int k;
    char *b = bufs[k++ & 7];
    if (!isfinite(v)) v = 0;
    snprintf(b, 40, "%.2f", v);
    if (strcmp(b, "-0.00") == 0) snprintf(b, 40, "0.00");
    return b;
}

static void esc(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; p && *p; p++) {
        switch (*p) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if (*p < 0x20 && *p != '\n' && *p != '\t')
                fputc('?', f); /* not allowed in XML 1.0 */
            else
                fputc(*p, f);
        }
    }
}

static void svg_begin(FILE *f, double w, double h)
{
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%s\" "
            "height=\"%s\" viewBox=\"0 0 %s %s\" font-family=\"Helvetica, Arial, sans-serif\">\n"
            "<rect x=\"0\" y=\"0\" width=\"%s\" height=\"%s\" fill=\"#ffffff\"/>\n",
            n2(w), n2(h), n2(w), n2(h), n2(w), n2(h));
}

static void text(FILE *f, double x, double y, const char *anchor, int size, const char *fill,
                 const char *extra, const char *s)
{
    fprintf(f, "<text x=\"%s\" y=\"%s\" text-anchor=\"%s\" font-size=\"%d\" fill=\"%s\"%s%s>",
            n2(x), n2(y), anchor, size, fill, extra ? " " : "", extra ? extra : "");
    esc(f, s);
    fputs("</text>\n", f);
}

static void line(FILE *f, double x1, double y1, double x2, double y2, const char *stroke,
                 double width)
{
    fprintf(f,
            "<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"%s\" stroke-width=\"%s\"/>\n",
            n2(x1), n2(y1), n2(x2), n2(y2), stroke, n2(width));
}

static double nice_step(double raw)
{
    if (!(raw > 0) || !isfinite(raw)) return 1;
    double e = floor(log10(raw)), p = pow(10, e), fr = raw / p;
    double nf = fr <= 1 ? 1 : fr <= 2 ? 2 : fr <= 5 ? 5 : 10;
    return nf * p;
}

static void tick_label(char *buf, size_t len, double v, double step)
{
    if (fabs(v) < step * 1e-9) v = 0;
    if (fabs(v) >= 1e6 || (fabs(v) > 0 && fabs(v) < 1e-4)) {
        snprintf(buf, len, "%.6g", v);
        return;
    }
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (dec > 9) dec = 9;
    snprintf(buf, len, "%.*f", dec, v);
    if (buf[0] == '-' && strspn(buf + 1, "0.") == strlen(buf + 1)) memmove(buf, buf + 1, strlen(buf));
}

/* ---- Gantt ----------------------------------------------------------------------------- */

struct cat {
    const char *name, *fill, *ink;
};

static const struct cat cats[] = {
    {"forward", "#4e79a7", "#ffffff"},   {"backward", "#f28e2b", "#ffffff"},
    {"recompute", "#b07aa1", "#ffffff"}, {"copy", "#59a14f", "#ffffff"},
    {"wait", "#7f7f7f", "#ffffff"},      {"fork", "#9c755f", "#ffffff"},
    {"join", "#9c755f", "#ffffff"},      {"loss", "#edc948", "#000000"},
    {"optimizer", "#e15759", "#ffffff"}, {"kernel", "#76b7b2", "#000000"},
    {"memcpy", "#8cd17d", "#000000"},    {"launch", "#ff9da7", "#000000"},
    {"other", "#79706e", "#ffffff"},
};
#define N_CATS ((int)(sizeof(cats) / sizeof(cats[0])))
#define CAT_LAUNCH (N_CATS - 2)

static int cat_of(const struct ps_graph *g, const struct ps_trace *t, const struct ps_trace_rec *r)
{
    const char *name;
    if (g && r->node != UINT32_MAX && r->node < g->n_nodes)
        name = ps_node_category(&g->nodes[r->node]);
    else
        name = t->source == PS_TRACE_CUDA ? "kernel" : "other";
    for (int k = 0; k < N_CATS; k++)
        if (strcmp(cats[k].name, name) == 0) return k;
    return N_CATS - 1;
}

struct glane {
    int32_t device, stream;
};

static int cmp_glane(const void *a, const void *b)
{
    const struct glane *x = a, *y = b;
    if (x->device != y->device) return x->device < y->device ? -1 : 1;
    /* host (-1) after the streams */
    uint32_t sx = (uint32_t)x->stream, sy = (uint32_t)y->stream;
    return sx < sy ? -1 : sx > sy;
}

/* The copy streams of a device (one per partition and micro-batch, as torchgpipe has) share one
 * lane in the picture; the Chrome trace keeps them apart. The host's launches of a device's
 * nodes (simulated traces with issue times) get a lane of their own below its streams. */
#define COPY_LANE (INT32_MAX - 1)
#define LAUNCH_LANE (INT32_MAX - 2)

static int32_t lane_key(const struct ps_graph *g, int32_t stream)
{
    if (g && stream >= 0 && stream < g->n_streams && g->streams[stream].kind == PS_STREAM_COPY)
        return COPY_LANE;
    return stream;
}

/* A measured task with GPU work (src/trace_read.h) is drawn on the real CUDA stream its kernels
 * ran on, under its device: keys -2, -3, ... (stream 0, 1, ...), sorted after the graph's. */
#define CUDA_LANE(s) (-2 - (int32_t)(s))
#define IS_CUDA_LANE(k) ((k) <= -2)
#define CUDA_STREAM(k) (-2 - (k))

static int32_t rec_lane(const struct ps_graph *g, const struct ps_trace_rec *r)
{
    if (r->lane_stream >= 0 && r->lane_stream < 1000000000) return CUDA_LANE(r->lane_stream);
    return lane_key(g, r->stream);
}

struct block {
    const struct ps_graph *g;
    const struct ps_trace *t;
    const double *issue; /* per node, or NULL */
    double launch;
    struct glane *lanes;
    uint32_t n_lanes;
    double y0;     /* top of the first lane */
    double y_axis; /* its time axis (blocks on separate axes) */
    double lo, hi; /* time range */
    const char *label;
};

static bool rec_ok(const struct ps_trace_rec *r)
{
    return isfinite(r->start_us) && isfinite(r->dur_us);
}

/* the launch of record r's node, when the block draws launches */
static bool launch_of(const struct block *b, const struct ps_trace_rec *r, double *at)
{
    if (!b->issue || !(b->launch > 0) || !b->g || r->node == UINT32_MAX ||
        r->node >= b->g->n_nodes || r->device < 0)
        return false;
    *at = b->issue[r->node];
    return isfinite(*at) && *at >= 0;
}

static int block_lanes(struct block *b)
{
    const struct ps_trace *t = b->t;
    b->lanes = malloc((2 * (size_t)t->n + 1) * sizeof(*b->lanes));
    if (!b->lanes) return -ENOMEM;
    uint32_t n = 0;
    double at;
    for (uint32_t k = 0; k < t->n; k++) {
        if (!rec_ok(&t->r[k])) continue;
        b->lanes[n++] = (struct glane){t->r[k].device, rec_lane(b->g, &t->r[k])};
        if (launch_of(b, &t->r[k], &at)) b->lanes[n++] = (struct glane){t->r[k].device, LAUNCH_LANE};
    }
    qsort(b->lanes, n, sizeof(*b->lanes), cmp_glane);
    uint32_t w = 0;
    for (uint32_t k = 0; k < n; k++)
        if (!w || cmp_glane(&b->lanes[k], &b->lanes[w - 1]) != 0) b->lanes[w++] = b->lanes[k];
    b->n_lanes = w;
    return 0;
}

static uint32_t lane_index(const struct block *b, int32_t device, int32_t key)
{
    struct glane k = {device, key};
    const struct glane *p = bsearch(&k, b->lanes, b->n_lanes, sizeof(k), cmp_glane);
    return p ? (uint32_t)(p - b->lanes) : 0;
}

/* "cuda:0 compute"; a CPU run's lanes say what ran them: "cpu (cuda:0 tasks) compute" */
static const char *lane_label(const struct ps_graph *g, const struct ps_trace *t,
                              const struct glane *l, char *buf, size_t len)
{
    char dev[64], st[96];
    if (l->device >= 0)
        ps_viz_device_name(g, l->device, dev, (int)sizeof(dev));
    else
        snprintf(dev, sizeof(dev), "host");
    if (IS_CUDA_LANE(l->stream))
        snprintf(st, sizeof(st), "CUDA stream %" PRId32 " (measured)", CUDA_STREAM(l->stream));
    else if (l->stream < 0)
        snprintf(st, sizeof(st), "host");
    else if (l->stream == COPY_LANE)
        snprintf(st, sizeof(st), "copies");
    else if (l->stream == LAUNCH_LANE)
        snprintf(st, sizeof(st), "launches");
    else if (g && l->stream < g->n_streams)
        ps_stream_name(g, l->stream, st, (int)sizeof(st));
    else
        snprintf(st, sizeof(st), "stream %" PRId32, l->stream);
    if (t->source == PS_TRACE_CPU && l->device >= 0 && strcmp(dev, "cpu") != 0)
        snprintf(buf, len, "cpu (%s tasks) %s", dev, st);
    else
        snprintf(buf, len, "%s %s", dev, st);
    return buf;
}

#define LANE_H 20.0
#define LANE_GAP 4.0
#define AXIS_H 44.0

static void time_unit(double span, const char **unit, double *ud)
{
    *unit = "us";
    *ud = 1;
    if (span >= 1e6) {
        *unit = "s";
        *ud = 1e6;
    } else if (span >= 1e3) {
        *unit = "ms";
        *ud = 1e3;
    }
}

static void draw_axis(FILE *f, double L, double PW, double y_top, double y_axis, double lo,
                      double hi)
{
    char buf[64];
    double span = hi - lo > 0 ? hi - lo : 1, ud;
    const char *unit;
    time_unit(span, &unit, &ud);
    double step = nice_step(span / ud / 8);
    double first = ceil(lo / ud / step - 1e-9) * step;
    line(f, L, y_axis, L + PW, y_axis, "#000000", 1);
    for (int k = 0;; k++) {
        double tv = first + k * step;
        if (tv > hi / ud + step * 1e-9 || k > 1000) break;
        double x = L + (tv * ud - lo) / span * PW;
        line(f, x, y_top, x, y_axis, "#e6e6e6", 1);
        line(f, x, y_axis, x, y_axis + 5, "#000000", 1);
        tick_label(buf, sizeof(buf), tv, step);
        text(f, x, y_axis + 18, "middle", 11, "#000000", NULL, buf);
    }
    snprintf(buf, sizeof(buf), "time (%s)", unit);
    text(f, L + PW / 2, y_axis + 36, "middle", 12, "#000000", NULL, buf);
}

static void draw_bar(FILE *f, const struct block *bk, double L, double PW, double ly, double start,
                     double dur, const struct cat *c, const char *name, int mb)
{
    char buf[256];
    double span = bk->hi - bk->lo > 0 ? bk->hi - bk->lo : 1;
    double x = L + (start - bk->lo) / span * PW;
    double w = dur / span * PW;
    /* a zero-length event (a wait, a launch-bound task) still shows as a thin bar */
    if (w < 1.5) w = 1.5;
    fprintf(f, "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"%s\"", n2(x), n2(ly),
            n2(w), n2(LANE_H), c->fill);
    if (w >= 4) fputs(" stroke=\"#ffffff\" stroke-width=\"0.50\"", f);
    fputs("><title>", f);
    snprintf(buf, sizeof(buf), "%s (%s) start %.3f us, duration %.3f us", name, c->name, start,
             dur);
    esc(f, buf);
    fputs("</title></rect>\n", f);
    if (mb >= 0) {
        snprintf(buf, sizeof(buf), "%d", mb);
        if (w >= 6.5 * (double)strlen(buf) + 4)
            text(f, x + w / 2, ly + LANE_H / 2 + 4, "middle", 10, c->ink,
                 "pointer-events=\"none\"", buf);
    }
}

int ps_plot_gantt(const struct ps_graph *g, const struct ps_trace *t, const struct ps_trace *t2,
                  const struct ps_gantt_opts *o, FILE *f, struct ps_diag *diag)
{
    static const struct ps_gantt_opts defaults = {0};
    if (!o) o = &defaults;
    struct block blk[2] = {{.g = g, .t = t, .issue = o->issue_us, .launch = o->launch_us},
                           {.g = g, .t = t2, .issue = o->issue2_us, .launch = o->launch2_us}};
    int nb = t2 ? 2 : 1;
    for (int b = 0; b < nb; b++) {
        if (block_lanes(&blk[b]) < 0) {
            free(blk[0].lanes);
            return ps_diag_set(diag, -ENOMEM, "gantt", "out of memory");
        }
    }
    blk[0].label = o->label ? o->label : ps_trace_source_name(t->source);
    if (t2) blk[1].label = o->label2 ? o->label2 : ps_trace_source_name(t2->source);
    bool headers = t2 || o->label;

    /* time range of each block, categories present, label width */
    bool present[N_CATS] = {0};
    size_t maxlab = 8;
    char buf[256], buf2[128];
    double at;
    for (int b = 0; b < nb; b++) {
        struct block *bk = &blk[b];
        const struct ps_trace *tr = bk->t;
        bk->lo = bk->hi = 0;
        for (uint32_t k = 0; k < tr->n; k++) {
            const struct ps_trace_rec *r = &tr->r[k];
            if (!rec_ok(r)) continue;
            if (r->start_us < bk->lo) bk->lo = r->start_us;
            if (r->start_us + r->dur_us > bk->hi) bk->hi = r->start_us + r->dur_us;
            present[cat_of(g, tr, r)] = true;
            if (launch_of(bk, r, &at)) {
                present[CAT_LAUNCH] = true;
                if (at < bk->lo) bk->lo = at;
                if (at + bk->launch > bk->hi) bk->hi = at + bk->launch;
            }
        }
        if (!(bk->hi - bk->lo > 0)) bk->hi = bk->lo + 1;
        for (uint32_t l = 0; l < bk->n_lanes; l++) {
            size_t n = strlen(lane_label(g, tr, &bk->lanes[l], buf, sizeof(buf)));
            if (n > maxlab) maxlab = n;
        }
    }
    /* one shared axis when the spans are comparable, else one axis per block */
    bool shared = true;
    if (nb == 2) {
        double s0 = blk[0].hi - blk[0].lo, s1 = blk[1].hi - blk[1].lo;
        shared = fmax(s0, s1) <= 2 * fmin(s0, s1);
        if (shared) {
            double lo = fmin(blk[0].lo, blk[1].lo), hi = fmax(blk[0].hi, blk[1].hi);
            blk[0].lo = blk[1].lo = lo;
            blk[0].hi = blk[1].hi = hi;
        }
    }

    double W = o->width > 0 ? o->width : 1200;
    double L = 16 + 6.2 * (double)maxlab, R = 24;
    if (L < 100) L = 100;
    if (W < L + R + 200) W = L + R + 200;
    double PW = W - L - R;
    double y = 10;
    if (o->title) y += 26;
    for (int b = 0; b < nb; b++) {
        if (headers) y += 20;
        blk[b].y0 = y;
        y += (double)blk[b].n_lanes * (LANE_H + LANE_GAP) + 8;
        if (!shared || b == nb - 1) {
            blk[b].y_axis = y;
            y += AXIS_H;
        }
    }
    int n_present = 0;
    for (int k = 0; k < N_CATS; k++) n_present += present[k];
    int per_row = (int)(PW / 110);
    if (per_row < 1) per_row = 1;
    int rows = n_present ? (n_present + per_row - 1) / per_row : 0;
    double y_leg = y + 4;
    double H = y_leg + rows * 18 + 10;

    svg_begin(f, W, H);
    if (o->title) text(f, W / 2, 26, "middle", 16, "#000000", "font-weight=\"bold\"", o->title);

    fputs("<g id=\"axis\">\n", f);
    for (int b = 0; b < nb; b++)
        if (!shared || b == nb - 1)
            draw_axis(f, L, PW, (shared ? blk[0].y0 : blk[b].y0) - 4, blk[b].y_axis, blk[b].lo,
                      blk[b].hi);
    fputs("</g>\n", f);

    for (int b = 0; b < nb; b++) {
        const struct block *bk = &blk[b];
        const struct ps_trace *tr = bk->t;
        fprintf(f, "<g id=\"trace%d\" data-x0=\"%s\" data-x1=\"%s\">\n", b, n2(L), n2(L + PW));
        if (headers) {
            const char *unit;
            double ud, ms = ps_trace_makespan(tr);
            time_unit(bk->hi - bk->lo, &unit, &ud);
            snprintf(buf, sizeof(buf), "%s: makespan %.3f %s%s", bk->label, ms / ud, unit,
                     shared ? "" : " (own time axis)");
            text(f, 6, bk->y0 - 6, "start", 12, "#000000", "font-weight=\"bold\"", buf);
        }
        for (uint32_t l = 0; l < bk->n_lanes; l++) {
            double ly = bk->y0 + (double)l * (LANE_H + LANE_GAP);
            fprintf(f,
                    "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"#f7f7f7\"/>\n",
                    n2(L), n2(ly), n2(PW), n2(LANE_H));
            text(f, L - 6, ly + LANE_H / 2 + 4, "end", 11, "#000000", NULL,
                 lane_label(g, tr, &bk->lanes[l], buf, sizeof(buf)));
        }
        for (uint32_t k = 0; k < tr->n; k++) {
            const struct ps_trace_rec *r = &tr->r[k];
            if (!rec_ok(r)) continue;
            bool has = g && r->node != UINT32_MAX && r->node < g->n_nodes;
            const char *name = r->name;
            if (!name && has) name = ps_node_name(g, r->node, buf2, (int)sizeof(buf2));
            if (!name) name = "?";
            int mb = has ? g->nodes[r->node].mb : -1;
            double ly = bk->y0 + (double)lane_index(bk, r->device, rec_lane(g, r)) *
                                     (LANE_H + LANE_GAP);
            draw_bar(f, bk, L, PW, ly, r->start_us, r->dur_us, &cats[cat_of(g, tr, r)], name, mb);
            if (launch_of(bk, r, &at)) {
                char lname[160];
                snprintf(lname, sizeof(lname), "launch of %s", name);
                double lly = bk->y0 + (double)lane_index(bk, r->device, LAUNCH_LANE) *
                                          (LANE_H + LANE_GAP);
                draw_bar(f, bk, L, PW, lly, at, bk->launch, &cats[CAT_LAUNCH], lname, mb);
            }
        }
        fputs("</g>\n", f);
    }

    /* legend */
    fputs("<g id=\"legend\">\n", f);
    int i = 0;
    for (int k = 0; k < N_CATS; k++) {
        if (!present[k]) continue;
        double lx = L + (double)(i % per_row) * 110, ly = y_leg + 10 + (double)(i / per_row) * 18;
        fprintf(f, "<rect x=\"%s\" y=\"%s\" width=\"12\" height=\"12\" fill=\"%s\"/>\n",
                n2(lx), n2(ly - 10), cats[k].fill);
        text(f, lx + 16, ly, "start", 11, "#000000", NULL,
             k == CAT_LAUNCH ? "host launch" : cats[k].name);
        i++;
    }
    fputs("</g>\n</svg>\n", f);
    free(blk[0].lanes);
    free(blk[1].lanes);
    if (ferror(f)) return ps_diag_set(diag, -EIO, "gantt", "write error");
    return 0;
}

struct gantt_args {
    const struct ps_graph *g;
    const struct ps_trace *t, *t2;
    const struct ps_gantt_opts *o;
};

static int gantt_cb(FILE *f, void *ctx, struct ps_diag *diag)
{
    struct gantt_args *a = ctx;
    return ps_plot_gantt(a->g, a->t, a->t2, a->o, f, diag);
}

int ps_plot_gantt_file(const struct ps_graph *g, const struct ps_trace *t,
                       const struct ps_trace *t2, const struct ps_gantt_opts *o,
                       const char *path, struct ps_diag *diag)
{
    struct gantt_args a = {g, t, t2, o};
    return ps_out_write(path, gantt_cb, &a, diag);
}

/* ---- line plots ------------------------------------------------------------------------ */

static const char *const palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                      "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
#define N_PALETTE ((int)(sizeof(palette) / sizeof(palette[0])))

static void marker(FILE *f, int shape, double x, double y, const char *color)
{
    switch (shape & 3) {
    case 0:
        fprintf(f, "<circle cx=\"%s\" cy=\"%s\" r=\"3.50\" fill=\"%s\"/>\n", n2(x), n2(y), color);
        break;
    case 1:
        fprintf(f, "<rect x=\"%s\" y=\"%s\" width=\"7\" height=\"7\" fill=\"%s\"/>\n", n2(x - 3.5),
                n2(y - 3.5), color);
        break;
    case 2:
        fprintf(f, "<polygon points=\"%s,%s %s,%s %s,%s\" fill=\"%s\"/>\n", n2(x), n2(y - 4.5),
                n2(x + 4.5), n2(y + 3.5), n2(x - 4.5), n2(y + 3.5), color);
        break;
    default:
        fprintf(f, "<polygon points=\"%s,%s %s,%s %s,%s %s,%s\" fill=\"%s\"/>\n", n2(x),
                n2(y - 4.5), n2(x + 4.5), n2(y), n2(x), n2(y + 4.5), n2(x - 4.5), n2(y), color);
        break;
    }
}

static bool x_ok(const struct ps_line_plot *p, uint32_t i)
{
    return isfinite(p->x[i]) && (!p->log2_x || p->x[i] > 0);
}

/* dash pattern of series s: a new pattern each time the palette's colours repeat */
static const char *const dashes[] = {"", " stroke-dasharray=\"7,3\"", " stroke-dasharray=\"2,2\"",
                                     " stroke-dasharray=\"9,3,2,3\""};

/* the look (colour, dash, marker) of series s: its fixed slot when it has one, else its place */
static uint32_t look(const struct ps_line_plot *p, uint32_t s)
{
    return p->series[s].style > 0 ? (uint32_t)(p->series[s].style - 1) : s;
}

static const char *series_dash(uint32_t s)
{
    return dashes[(s / (uint32_t)N_PALETTE) % 4];
}

/* divisor and name of the unit for values up to `top` */
static double plot_unit(enum ps_plot_unit u, double top, const char **name)
{
    static const char *const bytes[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    static const char *const times[] = {"us", "ms", "s"};
    double div = 1;
    int k = 0;
    *name = NULL;
    if (u == PS_UNIT_BYTES) {
        while (top / div >= 1024 && k < 4) div *= 1024, k++;
        *name = bytes[k];
    } else if (u == PS_UNIT_US) {
        while (top / div >= 1000 && k < 2) div *= 1000, k++;
        *name = times[k];
    }
    return div;
}

/* the series before s whose every point equals s's (one line hides the other), or -1 */
static int same_as(const struct ps_line_plot *p, uint32_t s)
{
    for (uint32_t t = 0; t < s; t++) {
        bool same = true;
        for (uint32_t i = 0; i < p->n && same; i++) {
            double a = p->series[s].y[i], b = p->series[t].y[i];
            same = (isnan(a) && isnan(b)) || a == b;
        }
        if (same) return (int)t;
    }
    return -1;
}

/* a series' legend text: its name, and the earlier series it coincides with, if any */
static const char *legend_name(const struct ps_line_plot *p, uint32_t s, char *buf, size_t len)
{
    const char *name = p->series[s].name ? p->series[s].name : "";
    int t = same_as(p, s);
    if (t < 0) return name;
    snprintf(buf, len, "%s (= %s: the lines coincide)", name,
             p->series[t].name ? p->series[t].name : "");
    return buf;
}

int ps_plot_lines(const struct ps_line_plot *p, FILE *f, struct ps_diag *diag)
{
    char buf[128];
    /* legend as wide as its longest name, and tall enough for every series */
    size_t longest = 0;
    char lname[512];
    for (uint32_t s = 0; s < p->n_series; s++) {
        size_t n = strlen(legend_name(p, s, lname, sizeof(lname)));
        if (n > longest) longest = n;
    }
    double W = p->width > 0 ? p->width : 720, H = p->height > 0 ? p->height : 440;
    double L = 70, R = 14 + 30 + 6.6 * (double)longest + 10, T = p->title ? 40 : 20, B = 60;
    if (R < 120) R = 120;
    if (W < L + R + 360) W = L + R + 360;
    if (H < T + B + 100) H = T + B + 100;
    if (H < T + 12 + 18.0 * p->n_series + B) H = T + 12 + 18.0 * p->n_series + B;

    /* x domain */
    bool any = false;
    double xlo = 0, xhi = 1;
    for (uint32_t i = 0; i < p->n; i++) {
        if (!x_ok(p, i)) continue;
        double v = p->log2_x ? log2(p->x[i]) : p->x[i];
        if (!any || v < xlo) xlo = v;
        if (!any || v > xhi) xhi = v;
        any = true;
    }
    if (!any) {
        xlo = 0;
        xhi = 1;
    }
    double xstep;
    if (p->log2_x) {
        xlo = floor(xlo);
        xhi = ceil(xhi);
        if (xhi <= xlo) xhi = xlo + 1;
        xstep = ceil((xhi - xlo) / 10);
    } else {
        if (xhi <= xlo) {
            xlo -= 1;
            xhi += 1;
        }
        xstep = nice_step((xhi - xlo) / 8);
        xlo = floor(xlo / xstep + 1e-9) * xstep;
        xhi = ceil(xhi / xstep - 1e-9) * xstep;
    }
    /* y domain */
    any = false;
    double ylo = 0, yhi = 1;
    for (uint32_t s = 0; s < p->n_series; s++)
        for (uint32_t i = 0; i < p->n; i++) {
            double v = p->series[s].y[i];
            if (!x_ok(p, i) || !isfinite(v)) continue;
            if (!any || v < ylo) ylo = v;
            if (!any || v > yhi) yhi = v;
            any = true;
        }
    if (!any) {
        ylo = 0;
        yhi = 1;
    }
    if (p->y_zero) {
        if (ylo > 0) ylo = 0;
        if (yhi < 0) yhi = 0;
    }
    if (yhi <= ylo) {
        double d = fabs(ylo) > 0 ? fabs(ylo) * 0.1 : 1;
        ylo -= d;
        yhi += d;
    }
    /* a log axis when one point would flatten the rest (drift at 2 samples per micro-batch) */
    bool log_y = false;
    if (p->log_y_auto && any) {
        double minpos = INFINITY, maxv = -INFINITY;
        bool neg = false;
        for (uint32_t s = 0; s < p->n_series; s++)
            for (uint32_t i = 0; i < p->n; i++) {
                double v = p->series[s].y[i];
                if (!x_ok(p, i) || !isfinite(v)) continue;
                neg |= v < 0;
                if (v > 0 && v < minpos) minpos = v;
                if (v > maxv) maxv = v;
            }
        if (!neg && isfinite(minpos) && maxv >= 100 * minpos) {
            log_y = true;
            ylo = floor(log10(minpos));
            yhi = ceil(log10(maxv));
            if (yhi <= ylo) yhi = ylo + 1;
        }
    }
    const char *uname = NULL;
    double ydiv = 1, ystep = 1;
    if (!log_y) {
        ydiv = plot_unit(p->y_unit, fmax(fabs(ylo), fabs(yhi)), &uname);
        ylo /= ydiv;
        yhi /= ydiv;
        ystep = nice_step((yhi - ylo) / 6);
        ylo = floor(ylo / ystep + 1e-9) * ystep;
        yhi = ceil(yhi / ystep - 1e-9) * ystep;
        if (yhi <= ylo) yhi = ylo + ystep;
    } else {
        ystep = yhi - ylo > 8 ? ceil((yhi - ylo) / 8) : 1;
    }
    /* room for the widest tick label left of the axis, and the y label left of that */
    size_t widest = 1;
    for (int k = 0;; k++) {
        double v = ylo + k * ystep;
        if (v > yhi + ystep * 1e-9 || k > 1000) break;
        if (log_y) snprintf(buf, sizeof(buf), "%g", pow(10, v));
        else tick_label(buf, sizeof(buf), v, ystep);
        if (strlen(buf) > widest) widest = strlen(buf);
    }
    if (L < 36 + 6.6 * (double)widest) L = 36 + 6.6 * (double)widest;
    double PW = W - L - R, PH = H - T - B;

#define PX(v) (L + ((v) - xlo) / (xhi - xlo) * PW)
#define YV(v) (log_y ? ((v) > 0 ? log10(v) : NAN) : (v) / ydiv)
#define PY(v) (T + PH - (YV(v) - ylo) / (yhi - ylo) * PH)

    svg_begin(f, W, H);
    if (p->title) text(f, L + PW / 2, 24, "middle", 15, "#000000", "font-weight=\"bold\"", p->title);
    fputs("<g id=\"axes\">\n", f);
    for (int k = 0;; k++) {
        double v = ylo + k * ystep;
        if (v > yhi + ystep * 1e-9 || k > 1000) break;
        double raw = log_y ? pow(10, v) : v * ydiv;
        line(f, L, PY(raw), L + PW, PY(raw), "#e6e6e6", 1);
        if (log_y) snprintf(buf, sizeof(buf), "%g", raw);
        else tick_label(buf, sizeof(buf), v, ystep);
        text(f, L - 6, PY(raw) + 4, "end", 11, "#000000", NULL, buf);
    }
    for (int k = 0;; k++) {
        double v = xlo + k * xstep;
        if (v > xhi + xstep * 1e-9 || k > 1000) break;
        line(f, PX(v), T + PH, PX(v), T + PH + 5, "#000000", 1);
        if (p->log2_x) {
            double xv = ldexp(1.0, (int)v);
            if (v >= 0)
                snprintf(buf, sizeof(buf), "%.0f", xv);
            else
                snprintf(buf, sizeof(buf), "%.6g", xv);
        } else {
            tick_label(buf, sizeof(buf), v, xstep);
        }
        text(f, PX(v), T + PH + 18, "middle", 11, "#000000", NULL, buf);
    }
    fprintf(f,
            "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"none\" stroke=\"#000000\" "
            "stroke-width=\"1.00\"/>\n",
            n2(L), n2(T), n2(PW), n2(PH));
    if (p->xlabel) {
        snprintf(buf, sizeof(buf), "%s%s", p->xlabel, p->log2_x ? " (log2 scale)" : "");
        text(f, L + PW / 2, T + PH + 40, "middle", 12, "#000000", NULL, buf);
    }
    if (p->ylabel) {
        char tr[96], lab[160];
        snprintf(tr, sizeof(tr), "transform=\"rotate(-90 %s %s)\"", n2(18), n2(T + PH / 2));
        if (uname) snprintf(lab, sizeof(lab), "%s (%s)", p->ylabel, uname);
        else if (log_y) snprintf(lab, sizeof(lab), "%s (log scale, 0 not shown)", p->ylabel);
        else snprintf(lab, sizeof(lab), "%s", p->ylabel);
        text(f, 18, T + PH / 2, "middle", 12, "#000000", tr, lab);
    }
    fputs("</g>\n", f);

    for (uint32_t s = 0; s < p->n_series; s++) {
        const char *color = palette[look(p, s) % N_PALETTE];
        fprintf(f, "<g id=\"series%" PRIu32 "\">\n", s);
        /* polylines broken at missing points */
        bool open = false;
        for (uint32_t i = 0; i < p->n; i++) {
            double v = p->series[s].y[i];
            bool ok = x_ok(p, i) && isfinite(v) && isfinite(YV(v));
            if (!ok) {
                if (open)
                    fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.50\"%s/>\n", color,
                            series_dash(look(p, s)));
                open = false;
                continue;
            }
            double xv = p->log2_x ? log2(p->x[i]) : p->x[i];
            if (!open) fputs("<polyline points=\"", f);
            fprintf(f, "%s%s,%s", open ? " " : "", n2(PX(xv)), n2(PY(v)));
            open = true;
        }
        if (open)
            fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.50\"%s/>\n", color,
                    series_dash(look(p, s)));
        for (uint32_t i = 0; i < p->n; i++) {
            double v = p->series[s].y[i];
            if (!x_ok(p, i) || !isfinite(v) || !isfinite(YV(v))) continue;
            double xv = p->log2_x ? log2(p->x[i]) : p->x[i];
            marker(f, (int)look(p, s), PX(xv), PY(v), color);
        }
        fputs("</g>\n", f);
    }
    fputs("<g id=\"legend\">\n", f);
    for (uint32_t s = 0; s < p->n_series; s++) {
        const char *color = palette[look(p, s) % N_PALETTE];
        double lx = L + PW + 14, ly = T + 12 + (double)s * 18;
        fprintf(f,
                "<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"%s\" "
                "stroke-width=\"1.50\"%s/>\n",
                n2(lx), n2(ly), n2(lx + 24), n2(ly), color, series_dash(look(p, s)));
        marker(f, (int)look(p, s), lx + 12, ly, color);
        text(f, lx + 30, ly + 4, "start", 11, "#000000", NULL,
             legend_name(p, s, lname, sizeof(lname)));
    }
    fputs("</g>\n</svg>\n", f);
#undef PX
#undef PY
#undef YV
    if (ferror(f)) return ps_diag_set(diag, -EIO, "plot", "write error");
    return 0;
}

static int lines_cb(FILE *f, void *ctx, struct ps_diag *diag)
{
    return ps_plot_lines(ctx, f, diag);
}

int ps_plot_lines_file(const struct ps_line_plot *p, const char *path, struct ps_diag *diag)
{
    return ps_out_write(path, lines_cb, (void *)p, diag);
}
