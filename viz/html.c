/* html: the diagnose report page (see html.h).
 *
 * The document is kept as two growing buffers of finished HTML: the summary list and the body
 * (sections). The table of contents is collected from the section calls. An open table is
 * closed by whatever element comes next, so callers never write closing tags.
 */
#include "viz/html.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "viz/viz.h"

struct buf {
    char *s;
    size_t n, cap;
};

struct ps_html {
    char *title, *subtitle;
    struct buf summary, body, toc;
    int table_cols; /* > 0 while a table is open */
    bool oom;
};

static void put(struct ps_html *h, struct buf *b, const char *s, size_t n)
{
    if (h->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 4096;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->s, c);
        if (!q) {
            h->oom = true;
            return;
        }
        b->s = q;
        b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void puts_(struct ps_html *h, struct buf *b, const char *s)
{
    put(h, b, s, strlen(s));
}

static void esc(struct ps_html *h, struct buf *b, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '<': puts_(h, b, "&lt;"); break;
        case '>': puts_(h, b, "&gt;"); break;
        case '&': puts_(h, b, "&amp;"); break;
        case '"': puts_(h, b, "&quot;"); break;
        default: put(h, b, s, 1); break;
        }
    }
}

static void close_table(struct ps_html *h)
{
    if (h->table_cols > 0) puts_(h, &h->body, "</tbody></table>\n");
    h->table_cols = 0;
}

struct ps_html *ps_html_create(const char *title)
{
    struct ps_html *h = calloc(1, sizeof(*h));
    if (!h) return NULL;
    if (!(h->title = strdup(title ? title : "pipescope report"))) {
        free(h);
        return NULL;
    }
    return h;
}

void ps_html_destroy(struct ps_html *h)
{
    if (!h) return;
    free(h->title);
    free(h->subtitle);
    free(h->summary.s);
    free(h->body.s);
    free(h->toc.s);
    free(h);
}

void ps_html_subtitle(struct ps_html *h, const char *text)
{
    free(h->subtitle);
    if (!(h->subtitle = strdup(text ? text : ""))) h->oom = true;
}

void ps_html_summary(struct ps_html *h, const char *line)
{
    puts_(h, &h->summary, "<li>");
    esc(h, &h->summary, line);
    puts_(h, &h->summary, "</li>\n");
}

void ps_html_section(struct ps_html *h, const char *id, const char *title)
{
    close_table(h);
    puts_(h, &h->body, "<h2 id=\"");
    esc(h, &h->body, id);
    puts_(h, &h->body, "\">");
    esc(h, &h->body, title);
    puts_(h, &h->body, "</h2>\n");
    puts_(h, &h->toc, "<li><a href=\"#");
    esc(h, &h->toc, id);
    puts_(h, &h->toc, "\">");
    esc(h, &h->toc, title);
    puts_(h, &h->toc, "</a></li>\n");
}

void ps_html_para(struct ps_html *h, const char *fmt, ...)
{
    close_table(h);
    char tmp[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    puts_(h, &h->body, "<p>");
    esc(h, &h->body, tmp);
    puts_(h, &h->body, "</p>\n");
}

void ps_html_para_link(struct ps_html *h, const char *before, const char *href,
                       const char *label, const char *after)
{
    close_table(h);
    puts_(h, &h->body, "<p>");
    esc(h, &h->body, before ? before : "");
    puts_(h, &h->body, "<a href=\"");
    esc(h, &h->body, href);
    puts_(h, &h->body, "\">");
    esc(h, &h->body, label);
    puts_(h, &h->body, "</a>");
    esc(h, &h->body, after ? after : "");
    puts_(h, &h->body, "</p>\n");
}

/* id of a "## " heading: "## 7. BatchNorm ..." -> "s7", "## Checks (...)" -> "checks" */
static void heading_id(const char *t, char *id, size_t len)
{
    size_t k = 0;
    if (*t >= '0' && *t <= '9') {
        id[k++] = 's';
        while (*t >= '0' && *t <= '9' && k + 1 < len) id[k++] = *t++;
    } else {
        while (((*t >= 'a' && *t <= 'z') || (*t >= 'A' && *t <= 'Z')) && k + 1 < len) {
            id[k++] = (char)(*t >= 'A' && *t <= 'Z' ? *t - 'A' + 'a' : *t);
            t++;
        }
    }
    id[k] = '\0';
}

/* escaped text with `code` spans as <code> */
static void md_inline(struct ps_html *h, const char *t)
{
    bool code = false;
    while (*t) {
        const char *q = strchr(t, '`');
        size_t n = q ? (size_t)(q - t) : strlen(t);
        char part[4096];
        size_t m = n < sizeof(part) - 1 ? n : sizeof(part) - 1;
        memcpy(part, t, m);
        part[m] = '\0';
        esc(h, &h->body, part);
        if (!q) break;
        puts_(h, &h->body, code ? "</code>" : "<code>");
        code = !code;
        t = q + 1;
    }
    if (code) puts_(h, &h->body, "</code>");
}

static void md_cells(struct ps_html *h, const char *line, size_t n, const char *tag)
{
    puts_(h, &h->body, "<tr>");
    size_t a = 1; /* after the leading '|' */
    while (a < n) {
        size_t b = a;
        while (b < n && line[b] != '|') b++;
        if (b >= n) break;
        char cell[1024];
        size_t m = b - a < sizeof(cell) - 1 ? b - a : sizeof(cell) - 1;
        memcpy(cell, line + a, m);
        cell[m] = '\0';
        puts_(h, &h->body, tag[1] == 'h' ? "<th>" : "<td>");
        md_inline(h, cell);
        puts_(h, &h->body, tag[1] == 'h' ? "</th>" : "</td>");
        a = b + 1;
    }
    puts_(h, &h->body, "</tr>\n");
}

void ps_html_doc(struct ps_html *h, const char *md)
{
    close_table(h);
    enum { NONE, PARA, LIST, TABLE, CODE } st = NONE;
    bool head_row = false;
    static const char *const closing[] = {"", "</p>\n", "</ul>\n", "</tbody></table>\n",
                                          "</pre>\n"};
    for (const char *p = md; *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char line[4096];
        size_t m = n < sizeof(line) - 1 ? n : sizeof(line) - 1;
        memcpy(line, p, m);
        line[m] = '\0';
        p += n + (e ? 1 : 0);
        if (st == CODE) {
            if (!strncmp(line, "```", 3)) {
                puts_(h, &h->body, closing[CODE]);
                st = NONE;
            } else {
                esc(h, &h->body, line);
                puts_(h, &h->body, "\n");
            }
            continue;
        }
        bool is_table = line[0] == '|', is_item = !strncmp(line, "- ", 2);
        bool cont = line[0] == ' ' && line[1] == ' ' && (st == LIST || st == PARA);
        if (st != NONE && !cont && !(st == TABLE && is_table) && !(st == LIST && is_item) &&
            !(st == PARA && line[0] && !is_table && !is_item && line[0] != '#' &&
              strncmp(line, "```", 3))) {
            puts_(h, &h->body, closing[st]);
            st = NONE;
        }
        if (!line[0]) continue;
        if (!strncmp(line, "```", 3)) {
            puts_(h, &h->body, "<pre>");
            st = CODE;
        } else if (line[0] == '#') {
            int lv = 0;
            while (line[lv] == '#') lv++;
            const char *t = line + lv + (line[lv] == ' ');
            char id[32], tag[8];
            heading_id(t, id, sizeof(id));
            snprintf(tag, sizeof(tag), "h%d", lv < 2 ? 2 : lv > 4 ? 4 : lv);
            puts_(h, &h->body, "<");
            puts_(h, &h->body, tag);
            puts_(h, &h->body, " id=\"");
            esc(h, &h->body, id);
            puts_(h, &h->body, "\">");
            md_inline(h, t);
            puts_(h, &h->body, "</");
            puts_(h, &h->body, tag);
            puts_(h, &h->body, ">\n");
        } else if (is_table) {
            if (st != TABLE) {
                puts_(h, &h->body, "<table><tbody>\n");
                st = TABLE;
                head_row = true;
            }
            if (strspn(line, "|-: ") == strlen(line)) continue; /* |---|---| */
            md_cells(h, line, strlen(line), head_row ? "th" : "td");
            head_row = false;
        } else if (is_item) {
            if (st != LIST) puts_(h, &h->body, "<ul>\n");
            else puts_(h, &h->body, "</li>\n");
            st = LIST;
            puts_(h, &h->body, "<li>");
            md_inline(h, line + 2);
        } else {
            if (st == NONE) {
                puts_(h, &h->body, "<p>");
                st = PARA;
            } else {
                puts_(h, &h->body, " ");
            }
            md_inline(h, line + strspn(line, " "));
        }
    }
    if (st != NONE) puts_(h, &h->body, closing[st]);
}

void ps_html_pre(struct ps_html *h, const char *text)
{
    close_table(h);
    puts_(h, &h->body, "<pre>");
    esc(h, &h->body, text);
    puts_(h, &h->body, "</pre>\n");
}

void ps_html_table(struct ps_html *h, const char *caption, int n_cols, const char *const *head)
{
    close_table(h);
    puts_(h, &h->body, "<table>");
    if (caption) {
        puts_(h, &h->body, "<caption>");
        esc(h, &h->body, caption);
        puts_(h, &h->body, "</caption>");
    }
    puts_(h, &h->body, "<thead><tr>");
    for (int k = 0; k < n_cols; k++) {
        puts_(h, &h->body, "<th>");
        esc(h, &h->body, head[k]);
        puts_(h, &h->body, "</th>");
    }
    puts_(h, &h->body, "</tr></thead><tbody>\n");
    h->table_cols = n_cols;
}

/* a number, optionally followed by a unit, %, x or more text after a space ("656.1 us",
   "99.7%", "1.52x", "0.1 -0.2"), so it is right-aligned; "1f1b" is a name */
static bool numeric(const char *s)
{
    if (!s || !*s) return false;
    if (*s == '+' || *s == '-') s++;
    if (!(*s >= '0' && *s <= '9')) return false;
    while ((*s >= '0' && *s <= '9') || *s == '.') s++;
    if ((*s == 'e' || *s == 'E') && (s[1] == '-' || s[1] == '+' || (s[1] >= '0' && s[1] <= '9'))) {
        s += 2;
        while (*s >= '0' && *s <= '9') s++;
    }
    return !*s || *s == ' ' || *s == '%' || (*s == 'x' && !s[1]);
}

void ps_html_row(struct ps_html *h, const char *const *cells)
{
    if (h->table_cols <= 0) return;
    puts_(h, &h->body, "<tr>");
    for (int k = 0; k < h->table_cols; k++) {
        puts_(h, &h->body, numeric(cells[k]) ? "<td class=\"n\">" : "<td>");
        esc(h, &h->body, cells[k] ? cells[k] : "");
        puts_(h, &h->body, "</td>");
    }
    puts_(h, &h->body, "</tr>\n");
}

void ps_html_image(struct ps_html *h, const char *src, const char *alt, const char *caption)
{
    close_table(h);
    puts_(h, &h->body, "<figure><a href=\"");
    esc(h, &h->body, src);
    puts_(h, &h->body, "\"><img src=\"");
    esc(h, &h->body, src);
    puts_(h, &h->body, "\" alt=\"");
    esc(h, &h->body, alt);
    puts_(h, &h->body, "\"></a>");
    if (caption) {
        puts_(h, &h->body, "<figcaption>");
        esc(h, &h->body, caption);
        puts_(h, &h->body, "</figcaption>");
    }
    puts_(h, &h->body, "</figure>\n");
}

void ps_html_image_wide(struct ps_html *h, const char *src, const char *alt, const char *caption)
{
    close_table(h);
    puts_(h, &h->body, "<figure><div class=\"scroll\"><a href=\"");
    esc(h, &h->body, src);
    puts_(h, &h->body, "\"><img src=\"");
    esc(h, &h->body, src);
    puts_(h, &h->body, "\" alt=\"");
    esc(h, &h->body, alt);
    puts_(h, &h->body, "\"></a></div>");
    if (caption) {
        puts_(h, &h->body, "<figcaption>");
        esc(h, &h->body, caption);
        puts_(h, &h->body, "</figcaption>");
    }
    puts_(h, &h->body, "</figure>\n");
}

void ps_html_svg(struct ps_html *h, const char *svg, const char *caption)
{
    close_table(h);
    const char *p = strstr(svg, "<svg");
    puts_(h, &h->body, "<figure>");
    puts_(h, &h->body, p ? p : "");
    if (caption) {
        puts_(h, &h->body, "<figcaption>");
        esc(h, &h->body, caption);
        puts_(h, &h->body, "</figcaption>");
    }
    puts_(h, &h->body, "</figure>\n");
}

static const char *STYLE =
    "body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:0 auto;"
    "max-width:1200px;padding:16px 24px;color:#222;background:#fff;line-height:1.45}\n"
    "h1{font-size:26px;margin:8px 0 4px}h2{font-size:20px;margin:28px 0 8px;padding-top:8px;"
    "border-top:2px solid #4e79a7}\n"
    ".sub{color:#555;margin:0 0 12px}\n"
    ".summary{background:#f3f6fa;border-left:5px solid #4e79a7;padding:8px 16px 8px 28px;"
    "margin:12px 0}\n.summary li{margin:4px 0}\n"
    "nav ol{columns:3;font-size:14px}\n"
    "table{border-collapse:collapse;margin:10px 0 16px;font-size:14px}\n"
    "caption{text-align:left;font-weight:600;padding:4px 0}\n"
    "th,td{border:1px solid #ccd;padding:3px 8px;text-align:left}th{background:#e8edf4}\n"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}\n"
    "tbody tr:nth-child(even){background:#f8f9fb}\n"
    "figure{margin:12px 0}figure img,figure svg{max-width:100%;height:auto;border:1px solid #ddd}\n"
    ".scroll{overflow:auto;max-height:560px;border:1px solid #ddd}"
    ".scroll img{max-width:none;border:0}\n"
    "figcaption{font-size:13px;color:#555}\ncode{background:#f0f0f0;padding:0 2px}\npre{background:#f6f6f6;padding:8px;overflow:auto;"
    "font-size:13px}\n";

int ps_html_write(const struct ps_html *h, FILE *f, struct ps_diag *diag)
{
    if (h->oom) return ps_diag_set(diag, -ENOMEM, "html", "out of memory building the page");
    struct ps_html tmp = {0}; /* for escaping the title into a scratch buffer */
    struct buf t = {0};
    esc(&tmp, &t, h->title);
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
               "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
               "<title>%s</title>\n<style>\n%s</style>\n</head>\n<body>\n<h1>%s</h1>\n",
            t.s ? t.s : "", STYLE, t.s ? t.s : "");
    free(t.s);
    if (h->subtitle) {
        struct buf s = {0};
        esc(&tmp, &s, h->subtitle);
        fprintf(f, "<p class=\"sub\">%s</p>\n", s.s ? s.s : "");
        free(s.s);
    }
    if (tmp.oom) return ps_diag_set(diag, -ENOMEM, "html", "out of memory");
    if (h->summary.n)
        fprintf(f, "<section id=\"summary\"><h2>Main findings</h2>\n<ul class=\"summary\">\n%s"
                   "</ul></section>\n",
                h->summary.s);
    if (h->toc.n) fprintf(f, "<nav><ol>\n%s</ol></nav>\n", h->toc.s);
    if (h->body.n) fputs(h->body.s, f);
    if (h->table_cols > 0) fputs("</tbody></table>\n", f);
    fputs("<footer><p class=\"sub\">written by pipescope diagnose</p></footer>\n</body>\n</html>\n", f);
    if (ferror(f)) return ps_diag_set(diag, -EIO, "html", "write error");
    return 0;
}

static int html_cb(FILE *f, void *ctx, struct ps_diag *diag)
{
    return ps_html_write(ctx, f, diag);
}

int ps_html_write_file(const struct ps_html *h, const char *path, struct ps_diag *diag)
{
    return ps_out_write(path, html_cb, (void *)h, diag);
}
