/* test_results.c - the ids a results file already holds (decode --resume):
 * whole lines only, string and integer ids, the cut-off last line left out,
 * a broken whole line an error naming file and line; the id set itself. */
#include "results.h"
#include "unit.h"

#include <unistd.h>

static char dir[] = "/tmp/kvp-results-XXXXXX";

static const char *put(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, strlen(text), f);
    fclose(f);
    return path;
}

static void test_idset(void)
{
    kvp_idset s;
    kvp_idset_init(&s);
    CHECK(!kvp_idset_has(&s, "a", 1));
    CHECK(kvp_idset_add(&s, "a", 1) == 1);
    CHECK(kvp_idset_add(&s, "a", 1) == 0);
    CHECK(kvp_idset_add(&s, "ab", 1) == 0); /* only the first len bytes count */
    char buf[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(buf, sizeof buf, "id-%d", i);
        kvp_idset_add(&s, buf, strlen(buf));
    }
    CHECK_EQ_U64(s.n, 5001);
    int all = 1;
    for (int i = 0; i < 5000; i++) {
        snprintf(buf, sizeof buf, "id-%d", i);
        all &= kvp_idset_has(&s, buf, strlen(buf));
    }
    CHECK(all);
    CHECK(!kvp_idset_has(&s, "id-5000", 7));
    kvp_idset_free(&s);
}

static void test_scan(void)
{
    kvp_idset s;
    kvp_err err = {0};
    uint64_t whole = 99;
    kvp_idset_init(&s);
    char missing[256];
    snprintf(missing, sizeof missing, "%s/none.jsonl", dir);
    CHECK(kvp_results_scan(missing, &s, &whole, &err) == 0);
    CHECK_EQ_U64(whole, 0);
    CHECK_EQ_U64(s.n, 0);

    const char *text = "{\"id\":\"a\",\"text\":\"x\"}\n\n{\"id\":7,\"text\":\"y\"}\n{\"id\":\"cut\",\"te";
    const char *p = put("out.jsonl", text);
    CHECK(kvp_results_scan(p, &s, &whole, &err) == 0);
    CHECK_EQ_U64(whole, strlen(text) - strlen("{\"id\":\"cut\",\"te"));
    CHECK_EQ_U64(s.n, 2);
    CHECK(kvp_idset_has(&s, "a", 1));
    CHECK(kvp_idset_has(&s, "7", 1));
    CHECK(!kvp_idset_has(&s, "cut", 3));
    kvp_idset_free(&s);

    /* a whole file ends where its last newline is */
    kvp_idset_init(&s);
    p = put("whole.jsonl", "{\"id\":\"z\"}\n");
    CHECK(kvp_results_scan(p, &s, &whole, &err) == 0);
    CHECK_EQ_U64(whole, 11);
    kvp_idset_free(&s);

    /* a broken whole line is an error naming the file and the line */
    kvp_idset_init(&s);
    p = put("bad.jsonl", "{\"id\":\"a\"}\n{\"text\":\"no id\"}\n");
    CHECK(kvp_results_scan(p, &s, &whole, &err) < 0);
    CHECK_MSG(strstr(err.msg, "bad.jsonl:2") != NULL, "%s", err.msg);
    CHECK_MSG(strstr(err.msg, "without an \"id\"") != NULL, "%s", err.msg);
    kvp_idset_free(&s);
    kvp_idset_init(&s);
    p = put("bad2.jsonl", "{\"id\":\"a\"}\n{\"id\":\n{\"id\":\"b\"}\n");
    CHECK(kvp_results_scan(p, &s, &whole, &err) < 0);
    CHECK_MSG(strstr(err.msg, "bad2.jsonl:2") != NULL, "%s", err.msg);
    kvp_idset_free(&s);
}

int main(void)
{
    if (!mkdtemp(dir))
        return 1;
    test_idset();
    test_scan();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        printf("note: could not remove %s\n", dir);
    printf("%d passed, %d failed\n", unit_passed, unit_failed);
    return unit_failed != 0;
}
