/* json_in: the one front door for JSON documents pipescope reads (spec, costs, --actions plan):
 * exactly one value, located errors, no silent surprises.
 *
 * cJSON accepts what a user did not mean: text after the value (with cJSON_Parse), repeated keys
 * (both kept, the first one wins on lookup), "\u0000" inside a string (the string is cut there),
 * and it stops at 1000 levels of nesting with a bare failure. Here every one of those is an
 * error naming the file and the line:column, or the JSON path for a repeated key:
 *
 *   FILE:LINE:COL: malformed JSON: trailing comma before '}' (hint: ...)
 *   FILE:LINE:COL: malformed JSON: unexpected text after the top-level value (hint: ...)
 *   FILE:LINE:COL: nesting deeper than 1000 levels
 *   FILE:LINE:COL: a string holds \u0000 (a NUL character), which would cut it short
 *   FILE: model.layers[0].out: duplicate key (an object may name each key only once)
 */
#ifndef PS_JSON_IN_H
#define PS_JSON_IN_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "src/diag.h"

#define PS_JSON_MAX_DEPTH 1000 /* cJSON's CJSON_NESTING_LIMIT */

/* What the document is, for hints: kind "a spec", example "{\"pipescope\": 1, ...}". */
struct ps_json_doc {
    const char *kind;
    const char *example;
};

/* Parses text (len bytes, NUL-terminated at len) as one JSON value. On success *root owns the
 * tree (cJSON_Delete); on failure *root is NULL and diag says where. Returns 0 or -EINVAL
 * (-ENOMEM when cJSON runs out of memory on a valid text). */
int ps_json_parse_doc(const char *text, size_t len, const char *file, const struct ps_json_doc *doc,
                      cJSON **root, struct ps_diag *diag);

/* JSON paths as pipescope prints them: parent.key, or parent["odd key"] for a key that is not
 * an identifier; parent[i]. Truncated to n bytes, never overflowed. */
void ps_json_path_key(char *buf, size_t n, const char *parent, const char *key);
void ps_json_path_index(char *buf, size_t n, const char *parent, int i);

#endif
