/* svg: the task graph as SVG, laid out and drawn by Graphviz itself (gvc), never by hand.
 *
 * The graph is the one dot.c builds (same clusters, names, styles, filters); gvLayout runs the
 * "dot" engine and gvRenderData the core "svg" renderer.
 *
 * One GVC context for the whole process, created on first use (before any graph, as gvc
 * expects) and kept, as the `dot` program does. It is made with gvContextPlugins from exactly
 * two plugins, core (the svg renderer) and dot_layout, dlopen'ed from Graphviz's plugin folder
 * next to libgvc, and so without the pango text-layout plugin, for two reasons:
 *   1. Graphviz 2.43's pango plugin caches a pointer to the last font name, which dies with
 *      the graph that used it: the next layout reads freed memory (ASan: heap-use-after-free
 *      in textspan_size). Without a text-layout plugin gvc estimates text sizes itself.
 *   2. Estimated text sizes do not depend on the fonts installed, so the same graph gives the
 *      same SVG bytes on every machine, not only across runs.
 * When the plugins cannot be found that way, gvContext() (every installed plugin) is the
 * fallback. Graphviz 2.43 leaks about 11-13 KB inside each layout: tests that render SVG run
 * without the leak checker. Graphviz is not thread-safe; neither is this file.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <graphviz/gvc.h>

#include "viz/viz_gv.h"

/* gvplugin_NAME_LTX_library of DIR/libgvplugin_NAME.so.6, or NULL */
static void *plugin_library(const char *dir, const char *name)
{
    char path[4200], sym[96];
    void *h = NULL;
    static const char *const sfx[] = {".so.6", ".so"};
    for (int k = 0; k < 2 && !h; k++) {
        snprintf(path, sizeof(path), "%s/libgvplugin_%s%s", dir, name, sfx[k]);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) return NULL;
    snprintf(sym, sizeof(sym), "gvplugin_%s_LTX_library", name);
    void *lib = dlsym(h, sym);
    if (!lib) dlclose(h); /* on success the handle stays open for the process */
    return lib;
}

static GVC_t *context(void)
{
    static GVC_t *gvc;
    static lt_symlist_t syms[3];
    if (gvc) return gvc;
    GVC_t *(*fn)(const lt_symlist_t *, int) = gvContextPlugins;
    void *addr;
    memcpy(&addr, &fn, sizeof(addr)); /* the function's address, for dladdr */
    Dl_info info;
    char dir[4096];
    if (dladdr(addr, &info) && info.dli_fname && strrchr(info.dli_fname, '/')) {
        snprintf(dir, sizeof(dir), "%.*s/graphviz",
                 (int)(strrchr(info.dli_fname, '/') - info.dli_fname), info.dli_fname);
        syms[0] = (lt_symlist_t){"gvplugin_core_LTX_library", plugin_library(dir, "core")};
        syms[1] = (lt_symlist_t){"gvplugin_dot_layout_LTX_library",
                                 plugin_library(dir, "dot_layout")};
        syms[2] = (lt_symlist_t){NULL, NULL};
        if (syms[0].address && syms[1].address) gvc = gvContextPlugins(syms, 0);
    }
    if (!gvc) gvc = gvContext();
    return gvc;
}

#define PS_SVG_MAX_NODES 2000

int ps_svg_render(const struct ps_graph *g, const struct ps_dot_opts *o, char **data,
                  size_t *len, struct ps_diag *diag)
{
    *data = NULL;
    *len = 0;
    ps_gv_capture_begin();
    GVC_t *gvc = context();
    const char *msg = ps_gv_capture_end();
    if (!gvc) return ps_diag_set(diag, -ENOMEM, "graphviz", "cannot create a context: %s", msg);
    Agraph_t *G;
    int rc = ps_dot_build(g, o, &G, diag);
    if (rc < 0) return rc;
    char *buf = NULL;
    unsigned int n = 0;
    /* dot's network simplex (ranks, then x positions) is superlinear: chunks 32 of a
       3-partition model (1508 nodes) took over 2 minutes. Bounding its iterations brings that
       to 5 s (3044 nodes: 60 s); small graphs keep the exact layout, and above
       PS_SVG_MAX_NODES the layout is refused rather than left running for many minutes. */
    if (agnnodes(G) > PS_SVG_MAX_NODES) {
        rc = ps_diag_set(diag, -E2BIG, "svg",
                         "the picture would have %d nodes; laying out more than %d takes minutes",
                         agnnodes(G), PS_SVG_MAX_NODES);
        ps_diag_hint(diag, "draw the tasks only (graph --tasks), or write --dot FILE for another "
                           "layout tool");
        agclose(G);
        return rc;
    }
    if (agnnodes(G) > 400) {
        agsafeset(G, (char *)"nslimit", (char *)"2", (char *)"");
        agsafeset(G, (char *)"nslimit1", (char *)"2", (char *)"");
    }
    ps_gv_capture_begin();
    if (gvLayout(gvc, G, "dot") != 0) {
        msg = ps_gv_capture_end();
        agclose(G);
        rc = ps_diag_set(diag, -EINVAL, "graphviz", "layout failed%s%s", msg[0] ? ": " : "",
                         msg);
        ps_diag_hint(diag, "check that Graphviz's dot_layout plugin is installed (libgvc6)");
        return rc;
    }
    if (gvRenderData(gvc, G, "svg", &buf, &n) != 0 || !buf) {
        msg = ps_gv_capture_end();
        if (buf) gvFreeRenderData(buf);
        gvFreeLayout(gvc, G);
        agclose(G);
        rc = ps_diag_set(diag, -EINVAL, "graphviz", "SVG rendering failed%s%s",
                         msg[0] ? ": " : "", msg);
        ps_diag_hint(diag, "check that Graphviz's core plugin is installed (libgvc6)");
        return rc;
    }
    ps_gv_capture_end();
    char *copy = malloc((size_t)n + 1);
    if (copy) {
        memcpy(copy, buf, n);
        copy[n] = '\0';
    }
    gvFreeRenderData(buf);
    gvFreeLayout(gvc, G);
    agclose(G);
    if (!copy) return ps_diag_set(diag, -ENOMEM, "svg", "out of memory");
    *data = copy;
    *len = n;
    return 0;
}

int ps_svg_write(const struct ps_graph *g, const struct ps_dot_opts *o, FILE *f,
                 struct ps_diag *diag)
{
    char *data;
    size_t len;
    int rc = ps_svg_render(g, o, &data, &len, diag);
    if (rc < 0) return rc;
    size_t w = fwrite(data, 1, len, f);
    free(data);
    if (w != len || ferror(f)) return ps_diag_set(diag, -EIO, "svg", "write error");
    return 0;
}

int ps_svg_write_file(const struct ps_graph *g, const struct ps_dot_opts *o, const char *path,
                      struct ps_diag *diag)
{
    return ps_graph_format_write_file(ps_graph_format_find("svg"), g, o, path, diag);
}
