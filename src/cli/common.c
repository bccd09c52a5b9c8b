/* cli/common: loading a spec into a context, shared option parsing, messages. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "src/cli/cli.h"

/* Prints "PREFIX" and the formatted text as one line, escaped as an error line is
 * (src/diag.c: no control character or invalid UTF-8 from a user's value reaches stderr raw). */
static void print_line(const char *prefix, const char *fmt, va_list ap, const char *suffix)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    vsnprintf(d.msg, sizeof(d.msg), fmt, ap);
    char buf[4 * PS_DIAG_MSG_MAX];
    fprintf(stderr, "%s%s%s\n", prefix, ps_diag_format(&d, buf, sizeof(buf)), suffix);
}

/* Output folders' temporary twins and the names the user gave them, for the error lines. */
static struct { char *twin, *user; } aliases[8];
static int n_aliases;

void ps_cli_alias_folder(const char *twin, const char *user)
{
    for (int k = 0; k < n_aliases; k++)
        if (twin && !strcmp(aliases[k].twin, twin)) return;
    if (!twin || !user || n_aliases == (int)(sizeof(aliases) / sizeof(aliases[0]))) return;
    /* copies: the twin's name is freed when the outputs are committed, before the last error */
    char *t = strdup(twin), *u = strdup(user);
    if (!t || !u) {
        free(t);
        free(u);
        return;
    }
    aliases[n_aliases].twin = t;
    aliases[n_aliases++].user = u;
}

/* s (len bytes of room) with every twin's name replaced by the user's */
static void unalias(char *s, size_t len)
{
    for (int k = 0; k < n_aliases; k++) {
        size_t tl = strlen(aliases[k].twin), ul = strlen(aliases[k].user);
        char *p = s;
        while ((p = strstr(p, aliases[k].twin))) {
            size_t rest = strlen(p + tl);
            if ((size_t)(p - s) + ul + rest + 1 > len) break;
            memmove(p + ul, p + tl, rest + 1);
            memcpy(p, aliases[k].user, ul);
            p += ul;
        }
    }
}

int ps_cli_fail(const struct ps_diag *d, int code)
{
    char buf[4 * (PS_DIAG_WHERE_MAX + 2 * PS_DIAG_MSG_MAX + 32)];
    struct ps_diag named = *d; /* errors name DIR, never its temporary twin */
    unalias(named.where, sizeof(named.where));
    unalias(named.msg, sizeof(named.msg));
    unalias(named.hint, sizeof(named.hint));
    fprintf(stderr, "pipescope: %s\n", ps_diag_format(&named, buf, sizeof(buf)));
    return code ? code : PS_EXIT_INPUT;
}

int ps_cli_usage(const struct ps_cli *cli, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char prefix[64], suffix[64];
    snprintf(prefix, sizeof(prefix), "pipescope %s: ", cli->cmd);
    snprintf(suffix, sizeof(suffix), " (see 'pipescope help %s')", cli->cmd);
    print_line(prefix, fmt, ap, suffix);
    va_end(ap);
    return PS_EXIT_INPUT;
}

void ps_cli_warn(const struct ps_cli *cli, const char *fmt, ...)
{
    if (cli->verbosity < 0) return;
    va_list ap;
    va_start(ap, fmt);
    print_line("pipescope: warning: ", fmt, ap, "");
    va_end(ap);
}

void ps_cli_info(const struct ps_cli *cli, const char *fmt, ...)
{
    if (cli->verbosity < 1) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int ps_ctx_rebuild(struct ps_ctx *ctx, const struct ps_variant *opts, struct ps_diag *d)
{
    ps_order_finish(&ctx->order);
    ps_graph_destroy(ctx->graph);
    ctx->graph = NULL;
    struct ps_variant o;
    if (!opts) {
        ps_variant_from_spec(ctx->spec, &o);
        opts = &o;
    }
    int rc = ps_schedule_build(ctx->spec, ctx->model, opts, &ctx->graph, d);
    if (rc) return rc;
    rc = ps_schedule_order(ctx->graph, &ctx->order, d);
    return rc == -EDEADLK ? 0 : rc;
}

int ps_ctx_load(struct ps_ctx *ctx, const struct ps_cli *cli, const struct ps_variant *opts)
{
    memset(ctx, 0, sizeof(*ctx));
    struct ps_diag d;
    ps_diag_clear(&d);
    if (!cli->spec_path) return ps_cli_usage(cli, "missing SPEC");
    if (ps_spec_load(cli->spec_path, &ctx->spec, &d)) return ps_cli_fail(&d, PS_EXIT_INPUT);
    for (int k = 0; k < ctx->spec->n_warnings; k++)
        ps_cli_warn(cli, "%s", ctx->spec->warnings[k]);
    if (ps_model_build(ctx->spec, &ctx->model, &d)) {
        ps_ctx_finish(ctx);
        return ps_cli_fail(&d, PS_EXIT_INPUT);
    }
    if (ps_ctx_rebuild(ctx, opts, &d)) {
        ps_ctx_finish(ctx);
        return ps_cli_fail(&d, PS_EXIT_INPUT);
    }
    return 0;
}

int ps_ctx_use_plan(struct ps_ctx *ctx, const char *path, char **cycle, struct ps_diag *d)
{
    *cycle = NULL;
    struct ps_plan plan;
    struct ps_variant var;
    ps_variant_from_spec(ctx->spec, &var);
    int rc = ps_plan_load(path, ctx->spec, &plan, d);
    if (rc) return rc;
    struct ps_graph *g = NULL;
    rc = ps_plan_build(ctx->spec, ctx->model, &var, &plan, &g, d);
    ps_plan_finish(&plan);
    if (rc) return rc;
    ps_order_finish(&ctx->order);
    ps_graph_destroy(ctx->graph);
    ctx->graph = g;
    rc = ps_plan_order(g, &ctx->order, d);
    if (rc == -EDEADLK) *cycle = ps_plan_cycle(g, &ctx->order);
    return rc;
}

void ps_ctx_finish(struct ps_ctx *ctx)
{
    ps_order_finish(&ctx->order);
    ps_graph_destroy(ctx->graph);
    ps_model_destroy(ctx->model);
    ps_spec_destroy(ctx->spec);
    memset(ctx, 0, sizeof(*ctx));
}

const char *ps_cli_arg(struct ps_cli *cli, int *k, const char *name)
{
    const char *a = cli->argv[*k];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != '\0') return NULL;
    if (*k + 1 >= cli->argc) return "";
    return cli->argv[++*k];
}

bool ps_cli_flag(struct ps_cli *cli, int k, const char *name)
{
    return strcmp(cli->argv[k], name) == 0;
}

int ps_cli_int_list(const char *s, int **out)
{
    int n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    int *v = calloc((size_t)n, sizeof(int));
    if (!v) return -1;
    int k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 1 || x > 1000000 || (*end && *end != ',')) {
            free(v);
            return -1;
        }
        v[k++] = (int)x;
        p = *end ? end + 1 : end;
    }
    if (k == 0) {
        free(v);
        return -1;
    }
    *out = v;
    return k;
}
