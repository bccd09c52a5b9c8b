/* docs: the repository's user documentation compiled into the binary (viz/embed_docs.py writes
 * the table at build time from src/SEMANTICS.md, src/SPEC.md and viz/REPORT.md), so a report can
 * carry the pages it cites. */
#ifndef PS_DOCS_H
#define PS_DOCS_H

struct ps_doc {
    const char *path; /* "src/SEMANTICS.md" */
    const char *text; /* its Markdown */
};

extern const struct ps_doc ps_docs[]; /* ends with {0, 0} */

#endif
