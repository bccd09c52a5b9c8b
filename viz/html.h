/* html: the static report page of `pipescope diagnose` (index.html), a writer only.
 *
 * The caller assembles the page from what it computed: a title, a short summary (one finding per
 * line), then sections in order, each with paragraphs, tables, preformatted text and images
 * (links to SVG files next to the page, or inline SVG text). The writer escapes every string,
 * adds a table of contents and a stylesheet, and emits no JavaScript, so the page opens from
 * the file system in any browser and prints as it looks.
 *
 * Building never fails half-way: an allocation failure is remembered and reported by the write.
 */
#ifndef PS_HTML_H
#define PS_HTML_H

#include <stdio.h>

#include "src/diag.h"

struct ps_html;

struct ps_html *ps_html_create(const char *title); /* NULL when out of memory */
void ps_html_destroy(struct ps_html *h);           /* accepts NULL */

void ps_html_subtitle(struct ps_html *h, const char *text);
void ps_html_summary(struct ps_html *h, const char *line);
/* Starts a section: <h2 id=id>title</h2>; later elements belong to it. */
void ps_html_section(struct ps_html *h, const char *id, const char *title);
void ps_html_para(struct ps_html *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A paragraph: before, a link to href labelled label, after (all escaped). */
void ps_html_para_link(struct ps_html *h, const char *before, const char *href,
                       const char *label, const char *after);
void ps_html_pre(struct ps_html *h, const char *text);
/* A page of Markdown as the repository's docs use it: headings ("## 7. X" gets id "s7", "## Word
 * ..." id "word"), paragraphs, "- " lists, | tables |, ``` code blocks; inline text escaped as is. */
void ps_html_doc(struct ps_html *h, const char *markdown);
/* A table with n_cols columns; rows follow with ps_html_row (n_cols cells each, NULL = empty).
 * Cells that look like numbers are right-aligned. */
void ps_html_table(struct ps_html *h, const char *caption, int n_cols, const char *const *head);
void ps_html_row(struct ps_html *h, const char *const *cells);
/* <figure><img src=src alt=alt><figcaption>caption</figcaption></figure>; src relative to the
 * page. */
void ps_html_image(struct ps_html *h, const char *src, const char *alt, const char *caption);
/* The same for a large picture: shown at its natural size in a scrolling box, so its labels are
 * readable, and linked to the file. */
void ps_html_image_wide(struct ps_html *h, const char *src, const char *alt, const char *caption);
/* An SVG document inlined (its XML prolog dropped). */
void ps_html_svg(struct ps_html *h, const char *svg, const char *caption);

int ps_html_write(const struct ps_html *h, FILE *f, struct ps_diag *diag);
int ps_html_write_file(const struct ps_html *h, const char *path, struct ps_diag *diag);

#endif
