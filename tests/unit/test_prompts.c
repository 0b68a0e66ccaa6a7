/* test_prompts.c - prompt ids from a JSON Lines file: kept whole up to
 * KVP_NAME_MAX bytes (a sequence record's label), refused past it with the
 * line, never cut. */
#include "unit.h"
#include "prompts.h"
#include "tensor.h"

#include <unistd.h>

static int read_ids(const char *path, const char *id0, const char *id1, kvp_prompts *ps, kvp_err *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "{\"id\":\"%s\",\"prompt\":\"a\"}\n{\"id\":\"%s\",\"prompt\":\"b\"}\n{\"id\":7,\"prompt\":\"c\"}\n", id0,
            id1);
    fclose(f);
    kvp_prompts_init(ps, 0, NULL);
    return kvp_prompts_read_file(ps, path, err);
}

int main(void)
{
    char path[] = "/tmp/kvp-test-prompts.XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return unit_done();
    close(fd);
    char max[KVP_NAME_MAX + 1], over[KVP_NAME_MAX + 2];
    memset(max, 'm', KVP_NAME_MAX), max[KVP_NAME_MAX] = 0;
    memset(over, 'o', KVP_NAME_MAX + 1), over[KVP_NAME_MAX + 1] = 0;
    kvp_prompts ps;
    kvp_err err = {0};

    CHECK_EQ_I64(read_ids(path, "a", max, &ps, &err), 0);
    CHECK_EQ_U64(ps.n, 3);
    if (ps.n == 3) {
        CHECK_STR(ps.p[0].label, "a");
        CHECK_STR(ps.p[1].label, max);
        CHECK_STR(ps.p[2].label, "7");
    }
    kvp_prompts_free(&ps);

    CHECK_EQ_I64(read_ids(path, "a", over, &ps, &err), KVP_EFORMAT);
    char want[64];
    snprintf(want, sizeof want, ":2: \"id\" is %d bytes, longer than %d", KVP_NAME_MAX + 1, KVP_NAME_MAX);
    CHECK_MSG(strstr(err.msg, want) && strstr(err.msg, path), "%s", err.msg);
    kvp_prompts_free(&ps);

    kvp_prompts_init(&ps, 0, NULL);
    CHECK_EQ_I64(kvp_prompts_add_text(&ps, over, "x", 1, &err), KVP_EINVAL);
    CHECK_EQ_I64(kvp_prompts_add_text(&ps, max, "x", 1, &err), 0);
    CHECK_EQ_U64(ps.n, 1);
    kvp_prompts_free(&ps);
    unlink(path);
    return unit_done();
}
