/* test_results.c - the ids a results file already holds (decode --resume):
 * whole lines only, string and integer ids (7 and "7" one key), the cut-off
 * last line left out, a broken whole line or a bad id an error naming file
 * and line; the id set itself; the file read a line at a time. */
#include "results.h"
#include "unit.h"

#include <sys/resource.h>
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

/* The scan streams the file a line at a time: a results file far larger
 * than its longest line takes the memory of that line, not its own length
 * (decode --resume on a night's 300 MB of results held them all, and a
 * copy of every text); lines across reads and a line longer than the
 * buffer are whole lines still, a NUL anywhere named at its offset. */
static void test_stream(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/big.jsonl", dir);
    FILE *f = fopen(path, "wb");
    /* few long lines: what the scan allocates a line (and a sanitizer's
     * quarantine keeps of it) stays far below the file's length */
    static char text[32768];
    memset(text, 'x', sizeof text - 1);
    enum { LINES = 1024 };
    for (int i = 0; i < LINES; i++)
        fprintf(f, "{\"id\":\"r%d\",\"text\":\"%s\",\"tokens\":700}\n", i, text);
    fputs("{\"id\":\"long\",\"text\":\"", f); /* past the first buffer's 64 KiB */
    for (int i = 0; i < 6; i++)
        fputs(text, f);
    fputs("\"}\n{\"id\":\"cut\",\"text\":\"xx", f);
    long size = ftell(f);
    fclose(f);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long before = ru.ru_maxrss; /* KiB */
    kvp_idset s;
    kvp_err err = {0};
    uint64_t whole = 0;
    kvp_idset_init(&s);
    CHECK_MSG(kvp_results_scan(path, &s, &whole, &err) == 0, "%s", err.msg);
    getrusage(RUSAGE_SELF, &ru);
    CHECK_EQ_U64(s.n, LINES + 1);
    CHECK(kvp_idset_has(&s, "r1023", 5) && kvp_idset_has(&s, "long", 4) && !kvp_idset_has(&s, "cut", 3));
    CHECK_EQ_U64(whole, (uint64_t)size - strlen("{\"id\":\"cut\",\"text\":\"xx"));
    CHECK_MSG(ru.ru_maxrss - before < 8192, "the scan of %ld MiB grew the peak memory by %ld KiB", size >> 20,
              ru.ru_maxrss - before);
    kvp_idset_free(&s);

    /* a NUL in a later read, named at its offset in the file */
    f = fopen(path, "wb");
    for (int i = 0; i < 5; i++)
        fprintf(f, "{\"id\":\"r%d\",\"text\":\"%s\"}\n", i, text);
    long at = ftell(f) + 3;
    fputs("{\"i", f);
    fputc(0, f);
    fputs("d\":1}\n", f);
    fclose(f);
    kvp_idset_init(&s);
    char want[64];
    snprintf(want, sizeof want, "big.jsonl: byte %ld is NUL: a binary file", at);
    CHECK_MSG(kvp_results_scan(path, &s, &whole, &err) == KVP_EFORMAT && strstr(err.msg, want), "%s", err.msg);
    kvp_idset_free(&s);
    /* a broken line after the first read names its line */
    f = fopen(path, "wb");
    for (int i = 0; i < 5; i++)
        fprintf(f, "{\"id\":\"r%d\",\"text\":\"%s\"}\n", i, text);
    fputs("{\"id\":\"r5\",\"text\":\"a\"\n{\"id\":\"r6\"}\n", f);
    fclose(f);
    kvp_idset_init(&s);
    CHECK_MSG(kvp_results_scan(path, &s, &whole, &err) == KVP_EFORMAT && strstr(err.msg, "big.jsonl:6:"), "%s",
              err.msg);
    kvp_idset_free(&s);
}

int main(void)
{
    if (!mkdtemp(dir))
        return 1;
    test_idset();
    test_scan();
    test_keys();
    test_stream();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        printf("note: could not remove %s\n", dir);
    printf("%d passed, %d failed\n", unit_passed, unit_failed);
    return unit_failed != 0;
}
