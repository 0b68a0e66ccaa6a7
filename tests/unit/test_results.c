/* test_results.c - the ids a results file already holds (decode --resume):
 * whole lines only, string and integer ids (7 and "7" one key), the cut-off
 * last line left out, a broken whole line or a bad id an error naming file
 * and line; the id set itself. */
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

/* Keys are the prompts reader's: 7 and "7" one id; an id decode never
 * writes (empty, a NUL in it, past int64, a fraction, another type) is an
 * error naming the file and line, not a key that matches no request. */
static void test_keys(void)
{
    kvp_idset s;
    kvp_err err = {0};
    uint64_t whole = 0;
    kvp_idset_init(&s);
    const char *p = put("keys.jsonl", "{\"id\":7}\n{\"id\":\"7\"}\n{\"id\":-2}\n{\"id\":9223372036854775807}\n{\"id\":4096.0}\n");
    CHECK_MSG(kvp_results_scan(p, &s, &whole, &err) == 0, "%s", err.msg);
    CHECK_EQ_U64(s.n, 4);
    CHECK(kvp_idset_has(&s, "7", 1));
    CHECK(kvp_idset_has(&s, "-2", 2));
    CHECK(kvp_idset_has(&s, "9223372036854775807", 19));
    CHECK(kvp_idset_has(&s, "4096", 4));
    kvp_idset_free(&s);
    static const char *const bad[][2] = {
        {"{\"id\":\"a\"}\n{\"id\":\"\"}\n", "bad-keys.jsonl:2: \"id\" is empty"},
        {"{\"id\":\"a\\u0000b\"}\n", "bad-keys.jsonl:1: \"id\" holds a NUL character"},
        {"{\"id\":9223372036854775808}\n",
         "bad-keys.jsonl:1: \"id\" must be a string or an integer in [-9223372036854775808, 9223372036854775807]"},
        {"{\"id\":1.5}\n", "bad-keys.jsonl:1: \"id\" must be a string or an integer in ["},
        {"{\"id\":[1]}\n", "bad-keys.jsonl:1: \"id\" must be a string or an integer in ["},
        {"{\"id\":null}\n", "bad-keys.jsonl:1: a result line without an \"id\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvp_idset_init(&s);
        p = put("bad-keys.jsonl", bad[i][0]);
        int rc = kvp_results_scan(p, &s, &whole, &err);
        CHECK_MSG(rc == KVP_EFORMAT && strstr(err.msg, bad[i][1]), "case %zu: %s", i, rc < 0 ? err.msg : "accepted");
        kvp_idset_free(&s);
    }
}

int main(void)
{
    if (!mkdtemp(dir))
        return 1;
    test_idset();
    test_scan();
    test_keys();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        printf("note: could not remove %s\n", dir);
    printf("%d passed, %d failed\n", unit_passed, unit_failed);
    return unit_failed != 0;
}
