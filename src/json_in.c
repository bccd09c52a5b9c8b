/* json_in: one JSON document, parsed with every surprise of cJSON turned into a located error
 * (json_in.h). Invariants: J1. success means exactly one value, no NUL byte in the text, no
 * "\u0000" in a string, at most PS_JSON_MAX_DEPTH levels, no key twice in an object. J2. syntax
 * errors name FILE:LINE:COL (columns in UTF-8 characters) of the culprit where one is recognised
 * (trailing comma, comment, single quote), else of where cJSON stopped. J3. a repeated key is
 * named by its JSON path; the first repeat in document order is the one reported.
 */
#include "src/json_in.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/file.h"

/* A key is written bare in a path when it looks like an identifier, else as ["..."]. */
void ps_json_path_key(char *buf, size_t n, const char *parent, const char *key)
{
    int plain = key[0] != '\0';
    for (const char *k = key; *k; k++) {
        unsigned char ch = (unsigned char)*k;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || ch == '-' ||
              (ch >= '0' && ch <= '9' && k != key)))
            plain = 0;
    }
    if (plain) {
        snprintf(buf, n, "%s%s%s", parent, parent[0] ? "." : "", key);
        return;
    }
    char esc[96];
    size_t o = 0;
    for (const char *k = key; *k && o + 7 < sizeof(esc); k++) {
        unsigned char ch = (unsigned char)*k;
        if (ch == '"' || ch == '\\')
            o += (size_t)snprintf(esc + o, sizeof(esc) - o, "\\%c", ch);
        else if (ch < 0x20)
            o += (size_t)snprintf(esc + o, sizeof(esc) - o, "\\u%04x", ch);
        else
            esc[o++] = (char)ch;
    }
    esc[o] = '\0';
    snprintf(buf, n, "%s[\"%s\"]", parent, esc);
}

void ps_json_path_index(char *buf, size_t n, const char *parent, int i)
{
    snprintf(buf, n, "%s[%d]", parent, i);
}

/* cJSON only says where it stopped. Look for the usual culprits before that point: a trailing
 * comma, a comment, a single-quoted string. Returns the offset of the culprit or `stop`. */
static size_t diagnose_syntax(const char *t, size_t stop, const char **what, const char **hint)
{
    bool in_str = false;
    size_t last_comma = (size_t)-1;
    for (size_t i = 0; t[i] && i <= stop; i++) {
        char ch = t[i];
        if (in_str) {
            if (ch == '\\' && t[i + 1])
                i++;
            else if (ch == '"')
                in_str = false;
            continue;
        }
        if (ch == '"') {
            in_str = true;
            last_comma = (size_t)-1;
        } else if (ch == ',') {
            last_comma = i;
        } else if ((ch == '}' || ch == ']') && last_comma != (size_t)-1) {
            *what = ch == '}' ? "trailing comma before '}'" : "trailing comma before ']'";
            *hint = "JSON does not allow a comma after the last element";
            return last_comma;
        } else if (ch == '/' && (t[i + 1] == '/' || t[i + 1] == '*')) {
            *what = "comment";
            *hint = "JSON has no comments";
            return i;
        } else if (ch == '\'') {
            *what = "single quote";
            *hint = "JSON strings use double quotes";
            return i;
        } else if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') {
            last_comma = ch == ',' ? i : (size_t)-1;
        }
    }
    *what = NULL;
    return stop;
}

static int parse(const char *json, size_t len, const char *file, const struct ps_json_doc *doc,
                 cJSON **out, struct ps_diag *diag)
{
    if (strlen(json) != len) {
        int line, col;
        ps_file_line_col(json, strlen(json), &line, &col);
        char where[PS_DIAG_WHERE_MAX];
        snprintf(where, sizeof(where), "%s:%d:%d", file, line, col);
        return ps_diag_set(diag, -EINVAL, where, "malformed JSON: NUL byte in the text");
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!root) {
        const char *ep = end ? end : cJSON_GetErrorPtr();
        const char *vend = NULL;
        cJSON *value = cJSON_ParseWithOpts(json, &vend, 0);
        if (value) { /* a complete value followed by more text */
            cJSON_Delete(value);
            size_t pos = (size_t)(vend - json);
            pos += strspn(json + pos, " \t\r\n");
            int line, col;
            ps_file_line_col(json, pos, &line, &col);
            char where[PS_DIAG_WHERE_MAX];
            snprintf(where, sizeof(where), "%s:%d:%d", file, line, col);
            ps_diag_set(diag, -EINVAL, where,
                        "malformed JSON: unexpected text after the top-level value");
            ps_diag_hint(diag, "%s is exactly one JSON %s", doc->kind, doc->example[0] == '[' ? "array" : "object");
            return -EINVAL;
        }
        size_t stop = ep && ep >= json && ep <= json + len ? (size_t)(ep - json) : len;
        const char *what = NULL, *hint = NULL;
        size_t pos = diagnose_syntax(json, stop, &what, &hint);
        size_t first = strspn(json, " \t\r\n");
        if (!what && first == len) {
            what = "empty document";
            hint = NULL; /* from doc, below */
        } else if (!what && stop >= len) {
            what = "unexpected end of input";
            hint = "an object, array or string is not closed";
        }
        if (what && first == len) pos = len;
        int line, col;
        ps_file_line_col(json, pos, &line, &col);
        char where[PS_DIAG_WHERE_MAX];
        snprintf(where, sizeof(where), "%s:%d:%d", file, line, col);
        if (what) {
            ps_diag_set(diag, -EINVAL, where, "malformed JSON: %s", what);
            if (hint) ps_diag_hint(diag, "%s", hint);
            else ps_diag_hint(diag, "%s is a JSON %s: %s", doc->kind, doc->example[0] == '[' ? "array" : "object", doc->example);
        } else {
            char near[24];
            size_t k = 0;
            for (const char *p = json + pos; *p && *p != '\n' && k + 1 < sizeof(near) - 4; p++)
                near[k++] = (*p == '\t' || (unsigned char)*p < 0x20) ? ' ' : *p;
            near[k] = '\0';
            ps_diag_set(diag, -EINVAL, where, "malformed JSON near '%s%s'", near,
                        strlen(json + pos) > k && json[pos + k] != '\n' ? "..." : "");
        }
        return -EINVAL;
    }
    *out = root;
    return 0;
}


/* Nesting depth and "\u0000" inside strings, before cJSON sees the text (J1). */
static int prescan(const char *t, size_t len, const char *file, struct ps_diag *diag)
{
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char ch = t[i];
        const char *what = NULL;
        size_t at = i;
        if (in_str) {
            if (ch == '\\' && i + 1 < len) {
                if (t[i + 1] == 'u' && i + 5 < len && !strncmp(t + i + 2, "0000", 4))
                    what = "a string holds \\u0000 (a NUL character), which would cut it short";
                i++;
            } else if (ch == '"') {
                in_str = false;
            }
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '{' || ch == '[') {
            if (++depth > PS_JSON_MAX_DEPTH) what = "nesting deeper than 1000 levels";
        } else if (ch == '}' || ch == ']') {
            depth--;
        }
        if (what) {
            int line, col;
            ps_file_line_col(t, at, &line, &col);
            char where[PS_DIAG_WHERE_MAX];
            snprintf(where, sizeof(where), "%s:%d:%d", file, line, col);
            return ps_diag_set(diag, -EINVAL, where, "%s", what);
        }
    }
    return 0;
}

struct keyat {
    const char *key;
    int at;
};

static int cmp_keyat(const void *x, const void *y)
{
    const struct keyat *a = x, *b = y;
    int c = strcmp(a->key, b->key);
    return c ? c : (a->at > b->at) - (a->at < b->at);
}

/* cJSON keeps every member of an object, repeated keys included (J3): per object, the keys
 * sorted, the earliest second occurrence reported; O(k log k) per object. */
static int duplicates(const cJSON *v, const char *file, const char *path, struct ps_diag *diag)
{
    char sub[PS_DIAG_WHERE_MAX];
    if (cJSON_IsObject(v)) {
        int n = 0;
        for (const cJSON *a = v->child; a; a = a->next) n++;
        if (n > 1) {
            struct keyat *k = malloc((size_t)n * sizeof(*k));
            if (!k) return ps_diag_set(diag, -ENOMEM, file, "out of memory");
            int i = 0;
            for (const cJSON *a = v->child; a; a = a->next, i++) k[i] = (struct keyat){a->string, i};
            qsort(k, (size_t)n, sizeof(*k), cmp_keyat);
            int first = -1;
            const char *key = NULL;
            for (i = 1; i < n; i++)
                if (!strcmp(k[i].key, k[i - 1].key) && (first < 0 || k[i].at < first) &&
                    (i < 2 || strcmp(k[i - 1].key, k[i - 2].key))) { /* the run's second */
                    first = k[i].at;
                    key = k[i].key;
                }
            if (key) {
                ps_json_path_key(sub, sizeof(sub), path, key);
                char where[2 * PS_DIAG_WHERE_MAX + 4];
                snprintf(where, sizeof(where), "%s: %s", file, sub);
                free(k);
                return ps_diag_set(diag, -EINVAL, where,
                                   "duplicate key (an object may name each key only once)");
            }
            free(k);
        }
        for (const cJSON *a = v->child; a; a = a->next) {
            ps_json_path_key(sub, sizeof(sub), path, a->string);
            int rc = duplicates(a, file, sub, diag);
            if (rc) return rc;
        }
    } else if (cJSON_IsArray(v)) {
        int i = 0;
        for (const cJSON *a = v->child; a; a = a->next, i++) {
            ps_json_path_index(sub, sizeof(sub), path, i);
            int rc = duplicates(a, file, sub, diag);
            if (rc) return rc;
        }
    }
    return 0;
}

int ps_json_parse_doc(const char *text, size_t len, const char *file, const struct ps_json_doc *doc,
                      cJSON **root, struct ps_diag *diag)
{
    *root = NULL;
    static const struct ps_json_doc any = {"a document", "{...}"};
    if (!doc) doc = &any;
    int rc = strlen(text) == len ? prescan(text, len, file, diag) : 0;
    if (rc == 0) rc = parse(text, len, file, doc, root, diag);
    if (rc == 0 && (rc = duplicates(*root, file, "", diag))) {
        cJSON_Delete(*root);
        *root = NULL;
    }
    return rc;
}
