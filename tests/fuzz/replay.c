/* replay.c - run a fuzz harness over every file of its corpus folder
 * (tests/fuzz/corpus/NAME/, and its model-like seeds in
 * tests/golden/fuzz-seeds/NAME/), so `make check` replays seeds and every
 * crash ever found, without libFuzzer.  Usage: test_fuzz_NAME [DIR] */
#define _POSIX_C_SOURCE 200809L
#include "io.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

/* Every file of dir through the harness; -1 when dir cannot be opened. */
static int replay_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int passed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        uint8_t *data;
        size_t n;
        kvp_err err;
        if (kvp_read_file(path, 64u << 20, &data, &n, &err)) {
            printf("%s\n", err.msg);
            continue;
        }
        LLVMFuzzerTestOneInput(data, n); /* a crash fails the test run */
        free(data);
        passed++;
    }
    closedir(d);
    return passed;
}

int main(int argc, char **argv)
{
    const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    if (strncmp(name, "test_fuzz_", 10) == 0)
        name += 10;
    const char *tests = getenv("KVP_TESTS");
    if (!tests)
        tests = "tests";
    char dir[1024], models[1024];
    if (argc > 1)
        snprintf(dir, sizeof dir, "%s", argv[1]);
    else
        snprintf(dir, sizeof dir, "%s/fuzz/corpus/%s", tests, name);
    /* GGUF and safetensors seeds sit with the tests' other model files */
    snprintf(models, sizeof models, "%s/golden/fuzz-seeds/%s", tests, name);
    int a = replay_dir(dir), b = argc > 1 ? -1 : replay_dir(models);
    if (a < 0 && b < 0) {
        printf("%s: cannot open corpus folder (nor %s)\n0 passed, 1 failed\n", dir, models);
        return 1;
    }
    printf("%d passed, 0 failed\n", (a > 0 ? a : 0) + (b > 0 ? b : 0));
    return 0;
}
