/* JSON printed the way chat templates print it: Jinja's `tojson` in Hugging Face's renderer is
 * Python's json.dumps(x, ensure_ascii=False), whose separators are ", " and ": " (and with
 * indent=N, newlines and N spaces per level). Models were trained on those bytes, so the tools
 * and calls kvserve writes into a prompt use them too. Keys keep their order; strings and
 * numbers are cJSON's (its escapes are json.dumps's with ensure_ascii=False). Any thread. */
#ifndef KVS_SERVER_JSON_PY_H
#define KVS_SERVER_JSON_PY_H

#include <cjson/cJSON.h>

#include "common/buf.h"

/* Appends j to b; indent 0 prints on one line. NULL j or an allocation failure marks b oom. */
void srv_json_py(kvs_buf *b, const cJSON *j, int indent);

#endif
