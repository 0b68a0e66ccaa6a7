/* test_progress.c - decode --progress's parts: the line's text
 * (lib/engine/progress.c), a shard's share of the requests, and the count
 * of a prompts file's requests made without parsing it (lib/model/prompts.c),
 * checked against the reader on the same files. */
#include "unit.h"
#include "progress.h"
#include "prompts.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char dir[] = "/tmp/kvp_test_progress.XXXXXX";

static void line_of(char *buf, size_t cap, kvp_progress_state st) { kvp_progress_format(buf, cap, "decode", &st); }

static void test_format(void)
{
    char b[512];
    line_of(b, sizeof b,
            (kvp_progress_state){.elapsed = 83, .done = 4512, .total = 10000, .known = 1, .running = 64, .waiting = 120,
                                 .prompt_tokens = 83 * 5432, .generated = 83 * 3210});
    CHECK_STR(b, "decode: 4512 of 10000 requests (45.1%), 64 running, 120 waiting; 3210 tok/s out, 5432 tok/s "
                 "prompt; 1:23 elapsed, about 1:41 left");
    /* the total unknown (a stream, standard input): no share, no time left */
    line_of(b, sizeof b, (kvp_progress_state){.elapsed = 3725, .done = 7, .running = 2, .generated = 3725});
    CHECK_STR(b, "decode: 7 requests, 2 running, 0 waiting; 1 tok/s out, 0 tok/s prompt; 1:02:05 elapsed");
    /* nothing done yet: no rate to estimate from */
    line_of(b, sizeof b, (kvp_progress_state){.elapsed = 0.4, .total = 5, .known = 1, .running = 5});
    CHECK_STR(b, "decode: 0 of 5 requests (0.0%), 5 running, 0 waiting; 0 tok/s out, 0 tok/s prompt; 0:00 elapsed");
    /* all done: no time left shown */
    line_of(b, sizeof b, (kvp_progress_state){.elapsed = 10, .done = 5, .total = 5, .known = 1});
    CHECK(strstr(b, "5 of 5 requests (100.0%)") && !strstr(b, "left"));
    /* prefill's: prompts, no queue and nothing generated */
    line_of(b, sizeof b,
            (kvp_progress_state){.elapsed = 12, .done = 45, .total = 100, .known = 1, .prompt_tokens = 12 * 5432,
                                 .prompts_only = 1});
    CHECK_STR(b, "decode: 45 of 100 prompts (45.0%); 5432 tok/s prompt; 0:12 elapsed, about 0:15 left");
    /* a stopped job: no queue, no time left */
    line_of(b, sizeof b,
            (kvp_progress_state){.elapsed = 3, .done = 4, .total = 20, .known = 1, .generated = 300, .stopped = 1});
    CHECK_STR(b, "decode: 4 of 20 requests (20.0%), stopped; 100 tok/s out, 0 tok/s prompt; 0:03 elapsed");
    /* nothing to do (--resume found every request done): 0 of 0, not "unknown" */
    line_of(b, sizeof b, (kvp_progress_state){.elapsed = 1, .known = 1});
    CHECK(strncmp(b, "decode: 0 of 0 requests (100.0%), ", 34) == 0);
    /* one: singular */
    line_of(b, sizeof b, (kvp_progress_state){.elapsed = 1, .done = 1, .total = 1, .known = 1});
    CHECK(strncmp(b, "decode: 1 of 1 request (100.0%), ", 33) == 0);
    line_of(b, sizeof b, (kvp_progress_state){.elapsed = 1, .done = 1, .prompts_only = 1});
    CHECK(strncmp(b, "decode: 1 prompt; ", 18) == 0);
    /* a buffer too small is cut, NUL-terminated */
    char small[16];
    memset(small, 'x', sizeof small);
    line_of(small, sizeof small, (kvp_progress_state){.elapsed = 10, .done = 5, .total = 5, .known = 1});
    CHECK(memchr(small, 0, sizeof small) != NULL && strncmp(small, "decode: 5 of 5", 14) == 0);
}

static void test_shard(void)
{
    CHECK_EQ_U64(kvp_progress_shard_count(10, 0, 0), 10);
    CHECK_EQ_U64(kvp_progress_shard_count(10, 0, 1), 10);
    CHECK_EQ_U64(kvp_progress_shard_count(10, 0, 3), 4); /* 0 3 6 9 */
    CHECK_EQ_U64(kvp_progress_shard_count(10, 1, 3), 3); /* 1 4 7 */
    CHECK_EQ_U64(kvp_progress_shard_count(10, 2, 3), 3); /* 2 5 8 */
    CHECK_EQ_U64(kvp_progress_shard_count(2, 5, 8), 0);
    uint64_t sum = 0;
    for (uint32_t k = 0; k < 7; k++)
        sum += kvp_progress_shard_count(1000003, k, 7);
    CHECK_EQ_U64(sum, 1000003);
}

/* Write text to dir/name and return the path (static buffer). */
static const char *file_with(const char *name, const char *text, size_t n)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(text, 1, n, f) == n);
    if (f)
        fclose(f);
    return path;
}

/* The count of path, and the reader's number of prompts (-1 when it fails). */
static void counts(const char *path, uint64_t *counted, int64_t *read)
{
    kvp_err err = {0};
    CHECK(kvp_prompts_count_file(path, counted, &err) == 0);
    kvp_prompts ps;
    kvp_prompts_init(&ps);
    *read = kvp_prompts_read_file(&ps, path, &err) == 0 ? (int64_t)ps.n : -1;
    kvp_prompts_free(&ps);
}

static void test_count_file(void)
{
    static const struct {
        const char *text;
        uint64_t n;
    } cases[] = {
        {"{\"prompt\":\"a\"}\n{\"prompt\":\"b\"}\n", 2},
        {"{\"prompt\":\"a\"}\n{\"prompt\":\"b\"}", 2},            /* no final newline */
        {"\n \t\r\n{\"prompt\":\"a\"}\r\n\n\t\n{\"prompt\":\"b\"}\n \n", 2}, /* blank lines */
        {"\xef\xbb\xbf{\"prompt\":\"a\"}\n", 1},                  /* a byte order mark */
        {"Once upon a time\n{\"prompt\":\"b\"}\n\nthe end\n", 1}, /* plain text: one prompt */
        {"  \n  Tell me {a story}\n", 1},
        {"{\"id\":1,\"prompt\":\"a\"}\n{\"id\":2,\"prompt\":\"b\"}\n{\"id\":3,\"prompt\":\"c\"}\n", 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t counted = 99;
        int64_t read;
        counts(file_with("p.jsonl", cases[i].text, strlen(cases[i].text)), &counted, &read);
        CHECK_MSG(counted == cases[i].n && read == (int64_t)cases[i].n, "case %zu: counted %" PRIu64 ", read %" PRId64,
                  i, counted, read);
    }
    /* a bad line still counts (the job stops there): the reader fails */
    uint64_t counted = 0;
    int64_t read;
    const char *bad = "{\"prompt\":\"a\"}\n{\"prompt\":\n{\"prompt\":\"c\"}\n";
    counts(file_with("bad.jsonl", bad, strlen(bad)), &counted, &read);
    CHECK(counted == 3 && read == -1);
    /* a big file, past the count's 64 KiB reads: lines cut across them */
    size_t n_lines = 5000, len = 0;
    char *big = malloc(n_lines * 40);
    for (size_t i = 0; big && i < n_lines; i++)
        len += (size_t)sprintf(big + len, "{\"id\":\"r%zu\",\"prompt\":\"x\"}\n%s", i, i % 7 ? "" : "\n");
    if (big) {
        counts(file_with("big.jsonl", big, len), &counted, &read);
        CHECK(counted == n_lines && read == (int64_t)n_lines);
    }
    free(big);
    /* not known up front: standard input, a FIFO; a missing file is the reader's to report */
    kvp_err err = {0};
    counted = 7;
    CHECK(kvp_prompts_count_file("-", &counted, &err) == 0 && counted == 0);
    char fifo[4096];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    if (mkfifo(fifo, 0600) == 0) {
        counted = 7;
        CHECK(kvp_prompts_count_file(fifo, &counted, &err) == 0 && counted == 0);
        unlink(fifo);
    }
    counted = 7;
    CHECK(kvp_prompts_count_file("/nonexistent/p.jsonl", &counted, &err) == 0 && counted == 0);
    /* a file that cannot be read is named */
    const char *locked = file_with("locked.jsonl", "{}\n", 3);
    if (chmod(locked, 0) == 0 && access(locked, R_OK) != 0) { /* root reads it anyway */
        CHECK(kvp_prompts_count_file(locked, &counted, &err) == KVP_EIO);
        CHECK(strstr(err.msg, "locked.jsonl") != NULL);
    }
    unlink(locked);
}

/* The child of test_sigpipe: stderr the terminal, stdout a pipe nobody
 * reads, a line redrawn in place, then a write to stdout. */
static void sigpipe_child(int tty)
{
    int fds[2];
    if (dup2(tty, STDERR_FILENO) < 0 || pipe(fds) != 0 || dup2(fds[1], STDOUT_FILENO) < 0)
        _exit(90);
    close(fds[0]);
    signal(SIGPIPE, SIG_DFL);
    kvp_progress p;
    kvp_progress_init(&p, stderr, "decode", 0.001, 5, 1);
    nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
    kvp_batch_stats st = {0};
    kvp_progress_step(&p, &st, 5, 0);
    if (!p.in_place || !p.open_line)
        _exit(91);
    ssize_t w = write(STDOUT_FILENO, "x", 1);
    (void)w;
    _exit(92); /* not reached: SIGPIPE ends us */
}

/* `decode --progress | head -1` on a terminal: the reader goes, SIGPIPE
 * ends the process as without --progress, and the line being redrawn is
 * ended first so the shell's prompt does not land on it. */
static void test_sigpipe(void)
{
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    if (m < 0 || grantpt(m) != 0 || unlockpt(m) != 0) {
        printf("skip test_sigpipe: no pseudo-terminal (%s)\n", strerror(errno));
        if (m >= 0)
            close(m);
        return;
    }
    int tty = open(ptsname(m), O_RDWR | O_NOCTTY);
    CHECK(tty >= 0);
    if (tty < 0) {
        close(m);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(m);
        sigpipe_child(tty);
    }
    close(tty);
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGPIPE, "status %#x: not ended by SIGPIPE", status);
    char out[1024];
    size_t n = 0;
    for (;;) { /* the terminal's output, until EIO once the child's end is closed */
        ssize_t r = read(m, out + n, sizeof out - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    out[n] = 0;
    close(m);
    CHECK_MSG(strstr(out, "decode: 0 of 5 requests") != NULL, "terminal got \"%s\"", out);
    CHECK_MSG(n > 0 && out[n - 1] == '\n', "the line was left open: \"%s\"", out);
}

int main(void)
{
    if (!mkdtemp(dir)) {
        printf("cannot make a temporary folder: %s\n", strerror(errno));
        return 1;
    }
    test_format();
    test_shard();
    test_count_file();
    test_sigpipe();
    char path[4096];
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/bad.jsonl", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/big.jsonl", dir);
    unlink(path);
    rmdir(dir);
    return unit_done();
}
