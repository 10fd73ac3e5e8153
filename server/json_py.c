/* Python-style JSON printing (see json_py.h). */
#include "server/json_py.h"

#include <stdlib.h>

static void newline(kvs_buf *b, int indent, int depth)
{
    kvs_buf_add(b, "\n");
    for (int i = 0; i < indent * depth; i++)
        kvs_buf_add(b, " ");
}

static void print(kvs_buf *b, const cJSON *j, int indent, int depth)
{
    if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        bool obj = cJSON_IsObject(j);
        kvs_buf_add(b, obj ? "{" : "[");
        const cJSON *it;
        bool first = true;
        cJSON_ArrayForEach(it, j)
        {
            kvs_buf_add(b, first ? "" : indent ? "," : ", ");
            if (indent)
                newline(b, indent, depth + 1);
            first = false;
            if (obj) {
                cJSON *key = cJSON_CreateString(it->string);
                print(b, key, indent, depth + 1);
                cJSON_Delete(key);
                kvs_buf_add(b, ": ");
            }
            print(b, it, indent, depth + 1);
        }
        if (indent && !first)
            newline(b, indent, depth);
        kvs_buf_add(b, obj ? "}" : "]");
        return;
    }
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    if (!s)
        b->oom = true;
    else
        kvs_buf_add(b, s);
    free(s);
}

void srv_json_py(kvs_buf *b, const cJSON *j, int indent)
{
    print(b, j, indent, 0);
}
