/* io.c - mapped-or-streamed input and atomic output (see io.h). */
#define _POSIX_C_SOURCE 200809L
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* with the temporary files' table, below */
static void map_register(kvp_in *in);
static void map_unregister(kvp_in *in);

int kvp_in_from_fd(kvp_in *in, int fd, const char *name, kvp_err *err)
{
    memset(in, 0, sizeof *in);
    in->fd = fd;
    in->name = name;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return kvp_err_set(err, KVP_EIO, "%s: %s", name, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return kvp_err_set(err, KVP_EIO, "%s: is a directory", name);
    if (S_ISREG(st.st_mode)) {
        in->size = (uint64_t)st.st_size;
        in->size_known = 1;
        off_t here = lseek(fd, 0, SEEK_CUR);
        if (here == 0 && st.st_size > 0 && (uint64_t)st.st_size <= SIZE_MAX) {
            void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
            if (m != MAP_FAILED) {
                in->map = m;
                in->own_map = 1;
                map_register(in);
            } else if (errno == ENOMEM) /* no address space (ulimit -v): reading it into memory would not fit either */
                return kvp_err_set(err, KVP_ENOMEM, "%s: cannot map the file's %llu bytes: %s", name,
                                   (unsigned long long)st.st_size, strerror(errno));
        } else if (here > 0) { /* a redirected stdin already partly read */
            in->pos = (uint64_t)here;
        }
    }
    return 0;
}

static const volatile sig_atomic_t *in_interrupt;

void kvp_in_interrupt_on(const volatile sig_atomic_t *flag) { in_interrupt = flag; }

int kvp_in_open(kvp_in *in, const char *path, kvp_err *err)
{
    if (strcmp(path, "-") == 0)
        return kvp_in_from_fd(in, 0, "<stdin>", err);
    int fd;
    /* a FIFO waits here for its writer: a stop asked ends the wait, as it
     * ends a read's (kvp_in_interrupt_on); any other signal, again */
    while ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 && errno == EINTR)
        if (in_interrupt && *in_interrupt)
            return kvp_err_set(err, KVP_EINTR, "%s: opening stopped by a signal", path);
    if (fd < 0)
        return kvp_err_set(err, KVP_EIO, "%s: %s", path, strerror(errno));
    char *name = dupstr(path);
    if (!name) {
        close(fd);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    }
    int rc = kvp_in_from_fd(in, fd, name, err);
    in->own_fd = 1;
    in->name_owned = name;
    if (rc)
        kvp_in_close(in);
    return rc;
}

char *kvp_path_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    return slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
}

int kvp_in_kind(kvp_in *in, int *kind, kvp_err *err)
{
    static const uint8_t kvp_magic[4] = {0x89, 'K', 'V', 'P'};
    uint8_t head[4] = {0};
    int64_t n = kvp_in_peek(in, head, sizeof head, err);
    if (n < 0)
        return (int)n;
    *kind = KVP_FILE_SAFETENSORS;
    if (n == 4 && memcmp(head, "GGUF", 4) == 0)
        *kind = KVP_FILE_GGUF;
    else if (n == 4 && memcmp(head, kvp_magic, 4) == 0)
        *kind = KVP_FILE_KVP;
    return 0;
}

/* Every model file is 8 bytes at least (a safetensors header's length; a
 * GGUF or KVP header is longer): a shorter one is named as what it is, not
 * as a safetensors file whose header length is cut short (the reader any
 * file of neither magic goes to). */
static int model_long_enough(kvp_in *in, kvp_err *err)
{
    uint8_t head[8];
    int64_t n = kvp_in_peek(in, head, sizeof head, err);
    if (n < 0)
        return (int)n;
    if (n == 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s: the file is empty, not a model (GGUF, KVP or safetensors)",
                           in->name);
    if (n < (int64_t)sizeof head)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %lld byte%s, too short to be a model (GGUF, KVP or safetensors)",
                           in->name, (long long)n, n == 1 ? "" : "s");
    return 0;
}

int kvp_in_open_kind(kvp_in *in, const char *path, int *kind, kvp_err *err)
{
    memset(in, 0, sizeof *in);
    in->fd = -1;
    struct stat sb;
    if (strcmp(path, "-") != 0 && stat(path, &sb) != 0)
        return kvp_err_set(err, KVP_EIO, "%s: %s", path, strerror(errno));
    if (strcmp(path, "-") != 0 && S_ISDIR(sb.st_mode)) {
        *kind = KVP_FILE_SAFETENSORS;
        return 0;
    }
    int rc = kvp_in_open(in, path, err);
    if (rc == 0 && (rc = kvp_in_kind(in, kind, err)) == 0)
        rc = model_long_enough(in, err);
    if (rc < 0)
        kvp_in_close(in);
    return rc;
}

int kvp_in_reopenable(const kvp_in *in)
{
    return in->own_fd && in->size_known; /* own_fd: opened by name, not stdin */
}

void kvp_in_from_memory(kvp_in *in, const void *p, size_t n, const char *name)
{
    memset(in, 0, sizeof *in);
    in->fd = -1;
    in->name = name;
    in->map = p;
    in->size = n;
    in->size_known = 1;
}

void kvp_in_unmap(kvp_in *in)
{
    if (!in->map || !in->own_map)
        return;
    map_unregister(in);
    munmap((void *)in->map, (size_t)in->size);
    in->map = NULL;
    lseek(in->fd, (off_t)in->pos, SEEK_SET);
}

uint64_t kvp_in_left(const kvp_in *in)
{
    if (!in->size_known)
        return UINT64_MAX;
    return in->pos >= in->size ? 0 : in->size - in->pos;
}

/* After EINTR: 1 to read again, else the error set (a stop was asked). */
static int retry_read(const kvp_in *in, uint64_t off, kvp_err *err)
{
    if (in_interrupt && *in_interrupt)
        return kvp_err_set(err, KVP_EINTR, "%s: reading stopped at offset %llu by a signal", in->name,
                           (unsigned long long)off);
    return 1;
}

/* n bytes from the descriptor into buf, fewer only at its end; off is
 * where they start in the input, for the messages.  The count, or an
 * error (a stop asked while it waited). */
static int64_t read_full(const kvp_in *in, void *buf, size_t n, uint64_t off, kvp_err *err)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(in->fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR) {
            int rc = retry_read(in, off + got, err);
            if (rc > 0)
                continue;
            return rc;
        }
        if (r < 0)
            return kvp_err_set(err, KVP_EIO, "%s: read at offset %llu: %s", in->name,
                               (unsigned long long)(off + got), strerror(errno));
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (int64_t)got;
}

/* Hand over up to n peeked bytes; the count. */
static size_t take_head(kvp_in *in, void *buf, size_t n)
{
    size_t k = n < in->head_n ? n : in->head_n;
    memcpy(buf, in->head, k);
    memmove(in->head, in->head + k, in->head_n - k);
    in->head_n -= (uint32_t)k;
    in->pos += k;
    return k;
}

int64_t kvp_in_peek(kvp_in *in, void *buf, size_t n, kvp_err *err)
{
    if (n > sizeof in->head)
        n = sizeof in->head;
    if (in->map) {
        uint64_t left = kvp_in_left(in);
        size_t k = n < left ? n : (size_t)left;
        memcpy(buf, in->map + in->pos, k);
        return (int64_t)k;
    }
    if (in->head_n < n) {
        int64_t r = read_full(in, in->head + in->head_n, n - in->head_n, in->pos + in->head_n, err);
        if (r < 0)
            return r;
        in->head_n += (uint32_t)r;
    }
    size_t k = n < in->head_n ? n : in->head_n;
    memcpy(buf, in->head, k);
    return (int64_t)k;
}

int64_t kvp_in_read(kvp_in *in, void *buf, size_t n, kvp_err *err)
{
    if (in->map) {
        uint64_t left = kvp_in_left(in);
        size_t k = n < left ? n : (size_t)left;
        memcpy(buf, in->map + in->pos, k);
        in->pos += k;
        return (int64_t)k;
    }
    size_t had = take_head(in, buf, n);
    int64_t got = read_full(in, (char *)buf + had, n - had, in->pos, err);
    if (got < 0)
        return got;
    in->pos += (uint64_t)got;
    return (int64_t)had + got;
}

int64_t kvp_in_read_some(kvp_in *in, void *buf, size_t n, kvp_err *err)
{
    if (in->map)
        return kvp_in_read(in, buf, n, err);
    if (in->head_n && n)
        return (int64_t)take_head(in, buf, n);
    for (;;) {
        ssize_t r = read(in->fd, buf, n);
        if (r < 0 && errno == EINTR) {
            int rc = retry_read(in, in->pos, err);
            if (rc > 0)
                continue;
            return rc;
        }
        if (r < 0)
            return kvp_err_set(err, KVP_EIO, "%s: read at offset %llu: %s", in->name, (unsigned long long)in->pos,
                               strerror(errno));
        in->pos += (uint64_t)r;
        return r;
    }
}

int kvp_in_would_block(const kvp_in *in)
{
    if (in->map || in->size_known || in->head_n)
        return 0;
    struct pollfd p = {.fd = in->fd, .events = POLLIN};
    return poll(&p, 1, 0) == 0;
}

int64_t kvp_in_skip(kvp_in *in, uint64_t n, kvp_err *err)
{
    if (in->map) {
        uint64_t left = kvp_in_left(in);
        uint64_t k = n < left ? n : left;
        in->pos += k;
        return (int64_t)k;
    }
    char tmp[65536];
    uint64_t done = 0;
    while (done < n) {
        size_t want = n - done < sizeof tmp ? (size_t)(n - done) : sizeof tmp;
        int64_t r = kvp_in_read(in, tmp, want, err);
        if (r < 0)
            return r;
        done += (uint64_t)r;
        if ((size_t)r < want)
            break;
    }
    return (int64_t)done;
}

void kvp_in_close(kvp_in *in)
{
    if (in->map && in->own_map) {
        map_unregister(in);
        munmap((void *)in->map, (size_t)in->size);
    }
    if (in->own_fd && in->fd >= 0)
        close(in->fd);
    free(in->name_owned);
    memset(in, 0, sizeof *in);
    in->fd = -1;
}

int kvp_in_read_all(kvp_in *in, uint64_t max, uint8_t **data, size_t *len, kvp_err *err)
{
    *data = NULL;
    *len = 0;
    if (in->size_known && kvp_in_left(in) > max)
        return kvp_err_set(err, KVP_ELIMIT, "%s: file is %llu bytes, more than the %llu allowed", in->name,
                           (unsigned long long)in->size, (unsigned long long)max);
    size_t cap = in->size_known ? (size_t)kvp_in_left(in) + 1 : 65536, n = 0;
    uint8_t *buf = malloc(cap);
    int rc = 0;
    for (;;) {
        if (!buf) {
            rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory reading the file", in->name);
            break;
        }
        if (n + 1 >= cap) {
            if (cap > max + 1) {
                rc = kvp_err_set(err, KVP_ELIMIT, "%s: input exceeds %llu bytes", in->name, (unsigned long long)max);
                break;
            }
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory reading the file", in->name);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        int64_t r = kvp_in_read(in, buf + n, cap - 1 - n, err);
        if (r < 0) {
            rc = (int)r;
            break;
        }
        n += (size_t)r;
        if (r == 0)
            break;
        if (n > max) {
            rc = kvp_err_set(err, KVP_ELIMIT, "%s: input exceeds %llu bytes", in->name, (unsigned long long)max);
            break;
        }
    }
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = 0;
    *data = buf;
    *len = n;
    return 0;
}

int kvp_read_file(const char *path, uint64_t max, uint8_t **data, size_t *len, kvp_err *err)
{
    kvp_in in;
    *data = NULL;
    *len = 0;
    int rc = kvp_in_open(&in, path, err);
    if (rc)
        return rc;
    rc = kvp_in_read_all(&in, max, data, len, err);
    kvp_in_close(&in);
    return rc;
}

/* ---- temporary files removed on a fatal signal or at exit ----
 *
 * The one piece of mutable global state in lib/, and why: a signal handler
 * gets no argument through which to find the kvp_out objects alive when
 * SIGINT or SIGTERM arrives, so the paths of their temporary files sit in this
 * small fixed table, which the handler can read.  Slots are claimed and freed
 * with lock-free atomics; the handler only loads pointers and calls unlink and
 * raise, which are async-signal-safe.  A slot is claimed before the file is
 * created and freed only after it is renamed or removed, so there is no moment
 * when the file exists and the handler does not know it.
 */
#define TMP_SLOTS 32
_Static_assert(ATOMIC_POINTER_LOCK_FREE == 2, "the signal handler needs lock-free pointers");
static _Atomic(const char *) tmp_slot[TMP_SLOTS];
static pthread_once_t handlers_once = PTHREAD_ONCE_INIT;
/* Every signal whose default action ends the process (a crash's too:
 * the handler re-raises it, so the core dump still comes), but SIGKILL
 * and SIGSTOP, which cannot be caught. */
static const int fatal_signals[] = {SIGHUP,  SIGINT,  SIGQUIT,   SIGTERM, SIGPIPE, SIGXFSZ, SIGXCPU, SIGUSR1,
                                    SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGABRT, SIGBUS,  SIGFPE,  SIGILL,
                                    SIGSEGV, SIGSYS};

/* A program that exits with an output still open (kvp_cli_die in the
 * middle of a job) leaves no temporary file either: what was not
 * committed is not an output. */
static void remove_tmp_files(void)
{
    for (int i = 0; i < TMP_SLOTS; i++) {
        const char *p = atomic_load(&tmp_slot[i]);
        if (p)
            unlink(p);
    }
    for (int i = 0; i < TMP_SLOTS; i++) { /* then folders (kvp_tmp_remember), emptied above */
        const char *p = atomic_load(&tmp_slot[i]);
        if (p)
            rmdir(p);
    }
}

void kvp_tmp_remove_all(void) { remove_tmp_files(); }

/* While kvp_out_commit_all renames a job's outputs into place, a fatal
 * signal (in whichever thread it lands) waits for the renames to end:
 * removing the temporary files between two renames would leave the first
 * output in place beside the second missing.  A fault is never held. */
static atomic_int committing, deferred_sig;

static int held_off(int sig)
{
    if (!atomic_load(&committing) || sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL ||
        sig == SIGABRT || sig == SIGSYS)
        return 0;
    atomic_store(&deferred_sig, sig);
    return 1;
}

static void on_fatal_signal(int sig)
{
    if (held_off(sig))
        return; /* SA_RESETHAND put back the default action: kvp_out_commit_all raises it */
    remove_tmp_files();
    /* SA_RESETHAND put back the default action: die of the same signal, so
     * the parent sees exactly what it would have without us. */
    raise(sig);
}

/* ---- mapped files, named when they fail under their mapping ----
 *
 * A mapped file cut short or rewritten in place while in use (a model
 * copied over by another job) raises SIGBUS at the next touch of a page
 * it lost, and the job died with "Bus error" and nothing else.  The
 * mappings alive sit in a small table, as the temporary files' paths do,
 * so the handler can name the file: it says what happened and exits 1, as
 * for any damaged input.  A slot is claimed by its name, then its range is
 * set, the start last; it is cleared start first, so the handler never
 * pairs a range with another mapping's name.
 */
#define MAP_SLOTS 16
static _Atomic(const char *) map_name[MAP_SLOTS];
static _Atomic(uintptr_t) map_start[MAP_SLOTS], map_end[MAP_SLOTS];

static const char *mapped_file_at(uintptr_t a)
{
    for (int i = 0; i < MAP_SLOTS; i++) {
        uintptr_t s = atomic_load(&map_start[i]), e = atomic_load(&map_end[i]);
        if (s && a >= s && a < e)
            return atomic_load(&map_name[i]);
    }
    return NULL;
}

static void say(const char *s)
{
    size_t n = strlen(s);
    while (n) {
        ssize_t w = write(2, s, n);
        if (w <= 0)
            return;
        s += w, n -= (size_t)w;
    }
}

static void on_bus_error(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    const char *name = si ? mapped_file_at((uintptr_t)si->si_addr) : NULL;
    remove_tmp_files();
    if (!name)
        raise(sig); /* not a mapped file's: the default action, as for any crash */
#ifdef __GLIBC__
    say(program_invocation_short_name); /* kvp_cli_init's name too: argv[0]'s last part */
#else
    say("kvpipe");
#endif
    say(": ");
    say(name);
    say(": the file was cut short or changed while in use (a bus error reading its mapping)\n");
    _exit(1);
}

static void install_handlers(void)
{
    atexit(remove_tmp_files);
    for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++) {
        struct sigaction old;
        /* A signal ignored by whoever started us (nohup, `trap '' XFSZ`, a
         * background job's SIGINT) stays ignored. */
        if (sigaction(fatal_signals[i], NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
            old.sa_handler != SIG_DFL)
            continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND | SA_RESTART;
        if (fatal_signals[i] == SIGBUS) {
            sa.sa_sigaction = on_bus_error;
            sa.sa_flags |= SA_SIGINFO;
        }
        sigaction(fatal_signals[i], &sa, NULL);
    }
}

/* Claim a slot for path: 1 + its index, or 0 when the table is full (that
 * file is then not removed on a signal). */
static int tmp_register(const char *path)
{
    pthread_once(&handlers_once, install_handlers);
    for (int i = 0; i < TMP_SLOTS; i++) {
        const char *none = NULL;
        if (atomic_compare_exchange_strong(&tmp_slot[i], &none, path))
            return i + 1;
    }
    return 0;
}

int kvp_tmp_remember(const char *path) { return tmp_register(path); }

/* in's mapping into the table a bus error reads (full: not named). */
static void map_register(kvp_in *in)
{
    pthread_once(&handlers_once, install_handlers);
    for (int i = 0; i < MAP_SLOTS; i++) {
        const char *none = NULL;
        if (atomic_compare_exchange_strong(&map_name[i], &none, in->name)) {
            atomic_store(&map_end[i], (uintptr_t)in->map + in->size);
            atomic_store(&map_start[i], (uintptr_t)in->map);
            in->map_slot = i + 1;
            return;
        }
    }
}

static void map_unregister(kvp_in *in)
{
    int i = in->map_slot - 1;
    if (i < 0 || i >= MAP_SLOTS)
        return;
    atomic_store(&map_start[i], 0);
    atomic_store(&map_end[i], 0);
    atomic_store(&map_name[i], NULL);
    in->map_slot = 0;
}

/* Only path's own entry: a stale or zeroed handle must not free another's slot. */
void kvp_tmp_forget(int handle, const char *path)
{
    const char *mine = path;
    if (handle > 0 && handle <= TMP_SLOTS && mine)
        atomic_compare_exchange_strong(&tmp_slot[handle - 1], &mine, NULL);
}

static void tmp_unregister(kvp_out *out)
{
    kvp_tmp_forget(out->sig_slot, out->tmp_path);
    out->sig_slot = 0;
}

/* ---- output ---- */

static int out_open_direct(kvp_out *out, const char *path, kvp_err *err)
{
    out->fd = open(path, O_WRONLY | O_CLOEXEC);
    if (out->fd < 0) {
        int e = errno;
        kvp_out_abort(out);
        return kvp_err_set(err, KVP_EIO, "%s: cannot open for writing: %s", path, strerror(e));
    }
    out->direct = 1;
    return 0;
}

/* The standard output or error (1, 2) whose file st is, when that is a
 * regular file (a shell's "> log" or ">> log" behind /dev/stdout,
 * /dev/stderr, /dev/fd/N, or the file's own name), else -1.  A new file
 * renamed over it would replace what the stream wrote and, appended to,
 * what was there before: it is written through the stream's descriptor
 * (its offset, its O_APPEND) instead. */
static int std_stream_of(const struct stat *st)
{
    for (int fd = 1; fd <= 2; fd++) {
        struct stat s;
        if (fstat(fd, &s) == 0 && S_ISREG(s.st_mode) && s.st_dev == st->st_dev && s.st_ino == st->st_ino)
            return fd;
    }
    return -1;
}

static int out_open_stream(kvp_out *out, int fd, const char *path, kvp_err *err)
{
    fflush(fd == 1 ? stdout : stderr); /* what the program wrote there first, first */
    out->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (out->fd < 0) {
        int e = errno;
        kvp_out_abort(out);
        return kvp_err_set(err, KVP_EIO, "%s: cannot write through standard %s: %s", path,
                           fd == 1 ? "output" : "error", strerror(e));
    }
    out->direct = 1;
    return 0;
}

/* The process's umask.  Linux says it in /proc/self/status (since 4.7);
 * elsewhere the only way to read it is to set it and set it back, and a
 * thread creating a file in between would get a umask of 0. */
static mode_t current_umask(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned mask;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "Umask: %o", &mask) == 1) {
            fclose(f);
            return (mode_t)(mask & 0777);
        }
    }
    if (f)
        fclose(f);
    mode_t m = umask(0);
    umask(m);
    return m;
}

/* A relative link is relative to its own folder; 40 links are as many as
 * the kernel follows. */
char *kvp_path_link_end(const char *path)
{
    char *cur = strdup(path);
    for (int hops = 0; cur && hops < 40; hops++) {
        struct stat lst;
        if (lstat(cur, &lst) != 0 || !S_ISLNK(lst.st_mode))
            return cur; /* what cannot be created there, mkstemp says */
        char to[PATH_MAX];
        ssize_t k = readlink(cur, to, sizeof to - 1);
        char *dir = k < 0 ? NULL : kvp_path_dir(cur);
        char *next = dir ? malloc(strlen(dir) + (size_t)k + 2) : NULL;
        if (next) {
            to[k] = '\0';
            if (to[0] == '/')
                strcpy(next, to);
            else
                sprintf(next, "%s/%s", dir, to);
        }
        int e = errno;
        free(dir);
        free(cur);
        errno = e;
        cur = next;
    }
    if (cur) {
        free(cur);
        errno = ELOOP;
    }
    return NULL;
}

/* A symlink's file is what the user means to replace, not the link, as
 * with a shell's redirection: out->target, the file the link ends at, left
 * NULL when out->path is no link.  0, or -1 with errno when the chain
 * cannot be followed. */
static int out_follow_link(kvp_out *out)
{
    struct stat lst;
    if (lstat(out->path, &lst) != 0 || !S_ISLNK(lst.st_mode))
        return 0;
    out->target = kvp_path_link_end(out->path);
    return out->target ? 0 : -1;
}

int kvp_out_in_place(const char *path)
{
    struct stat st;
    return strcmp(path, "-") != 0 && stat(path, &st) == 0 && !S_ISDIR(st.st_mode) &&
           (!S_ISREG(st.st_mode) || std_stream_of(&st) > 0);
}

int kvp_out_open(kvp_out *out, const char *path, kvp_err *err)
{
    memset(out, 0, sizeof *out);
    out->fd = -1;
    if (strcmp(path, "-") == 0) {
        out->fd = 1;
        out->is_stdout = 1;
        return 0;
    }
    struct stat st;
    int exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode))
        return kvp_err_set(err, KVP_EIO, "%s: is a directory", path);
    size_t n = strlen(path);
    out->path = dupstr(path);
    if (!out->path) {
        kvp_out_abort(out);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    }
    if (exists && !S_ISREG(st.st_mode))
        return out_open_direct(out, path, err);
    int std_fd = exists ? std_stream_of(&st) : -1;
    if (std_fd > 0)
        return out_open_stream(out, std_fd, path, err);
    if (out_follow_link(out) != 0) {
        int e = errno;
        kvp_out_abort(out);
        return kvp_err_set(err, e == ENOMEM ? KVP_ENOMEM : KVP_EIO, "%s: cannot follow the symlink: %s", path,
                           strerror(e));
    }
    if (out->target)
        n = strlen(out->target);
    const char *dest = out->target ? out->target : path;
    out->tmp_path = malloc(n + 16);
    if (!out->tmp_path) {
        kvp_out_abort(out);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    }
    /* Same directory as the target so rename(2) is atomic. */
    snprintf(out->tmp_path, n + 16, "%s.tmp.XXXXXX", dest);
    out->sig_slot = tmp_register(out->tmp_path);
    out->fd = mkstemp(out->tmp_path);
    if (out->fd < 0) {
        int e = errno;
        tmp_unregister(out);
        free(out->tmp_path);
        out->tmp_path = NULL;
        kvp_out_abort(out);
        return kvp_err_set(err, KVP_EIO, "%s: cannot create: %s", path, strerror(e));
    }
    fchmod(out->fd, exists ? st.st_mode & 07777 : 0666 & ~current_umask());
    return 0;
}

const char *kvp_out_name(const kvp_out *out) { return out->is_stdout ? "<stdout>" : out->path; }

int kvp_out_write(kvp_out *out, const void *p, size_t n, kvp_err *err)
{
    const char *b = p;
    while (n > 0) {
        ssize_t w = write(out->fd, b, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EPIPE)
                return kvp_err_set(err, KVP_EPIPE, "%s: broken pipe", kvp_out_name(out));
            return kvp_err_set(err, KVP_EIO, "%s: write failed at offset %llu: %s", kvp_out_name(out),
                               (unsigned long long)out->pos, strerror(errno));
        }
        b += w;
        n -= (size_t)w;
        out->pos += (uint64_t)w;
    }
    return 0;
}

static void out_release(kvp_out *out)
{
    tmp_unregister(out); /* before the path's memory goes */
    free(out->tmp_path);
    free(out->path);
    free(out->target);
    out->tmp_path = out->path = out->target = NULL;
}

int kvp_fsync(int fd)
{
    if (fsync(fd) == 0)
        return 0;
    /* "this file system cannot sync" (some FUSE and network ones): nothing
     * to wait for there, not a failed write */
    return errno == EINVAL || errno == ENOTSUP || errno == EOPNOTSUPP || errno == ENOSYS ? 0 : -1;
}

/* Make a rename into path's folder durable.  Best effort: the file's own
 * data are already on disk, and some file systems cannot sync a folder. */
static void sync_dir(const char *path)
{
    char *dir = kvp_path_dir(path);
    if (!dir)
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

int kvp_out_seal(kvp_out *out, kvp_err *err)
{
    if (out->is_stdout || out->sealed || out->fd < 0)
        return 0;
    int rc = 0;
    /* The data reach the disk before the name does: without it, a crash or
     * power loss soon after the rename can leave an empty or short file
     * under the final name, the one thing the temporary name exists to
     * prevent.  A device or FIFO written in place has nothing to sync. */
    if (!out->direct && kvp_fsync(out->fd) != 0)
        rc = kvp_err_set(err, KVP_EIO, "%s: cannot flush to disk: %s", out->path, strerror(errno));
    if (close(out->fd) != 0 && !rc) /* NFS and friends report a full disk here */
        rc = kvp_err_set(err, KVP_EIO, "%s: close failed: %s", out->path, strerror(errno));
    out->fd = -1;
    if (rc) {
        kvp_out_abort(out);
        return rc;
    }
    out->sealed = 1;
    return 0;
}

/* Rename a sealed out into place (its folder not yet synced): 0, or
 * KVP_EIO with its temporary file removed. */
static int out_rename(kvp_out *out, kvp_err *err)
{
    if (out->direct || rename(out->tmp_path, out->target ? out->target : out->path) == 0)
        return 0;
    int rc = kvp_err_set(err, KVP_EIO, "%s: cannot rename into place: %s", out->path, strerror(errno));
    unlink(out->tmp_path);
    return rc;
}

int kvp_out_commit_all(kvp_out *const *outs, size_t n, kvp_err *err)
{
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = kvp_out_seal(outs[i], err);
    if (rc < 0) {
        for (size_t i = 0; i < n; i++)
            kvp_out_abort(outs[i]);
        return rc;
    }
    atomic_store(&committing, 1);
    const char *renamed = NULL; /* the last one in place, for a later one's failure */
    for (size_t i = 0; i < n; i++) {
        kvp_out *o = outs[i];
        if (o->is_stdout || !o->sealed) /* standard output, or committed already */
            continue;
        o->sealed = 0;
        if (rc < 0) {
            kvp_out_abort(o);
        } else if ((rc = out_rename(o, err)) < 0) {
            if (renamed) { /* it cannot be taken back: say so */
                char why[sizeof err->msg];
                snprintf(why, sizeof why, "%s", err->msg);
                kvp_err_set(err, KVP_EIO, "%s (%s was written; this was not)", why, renamed);
            }
        } else if (!o->direct) {
            renamed = o->path;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (outs[i]->path && !outs[i]->direct && outs[i]->tmp_path && rc == 0)
            sync_dir(outs[i]->target ? outs[i]->target : outs[i]->path);
        if (!outs[i]->is_stdout)
            out_release(outs[i]);
    }
    atomic_store(&committing, 0);
    int sig = atomic_exchange(&deferred_sig, 0);
    if (sig) { /* a signal came during the renames: the outputs are whole, it takes its course now */
        remove_tmp_files();
        raise(sig);
    }
    return rc;
}

int kvp_out_commit(kvp_out *out, kvp_err *err)
{
    if (out->is_stdout) {
        out->fd = -1;
        return 0;
    }
    if (!out->sealed && out->fd < 0) /* committed or aborted already */
        return 0;
    int rc = kvp_out_seal(out, err);
    if (rc < 0)
        return rc;
    out->sealed = 0;
    if ((rc = out_rename(out, err)) == 0 && !out->direct)
        sync_dir(out->target ? out->target : out->path);
    out_release(out);
    return rc;
}

void kvp_out_abort(kvp_out *out)
{
    if (!out->is_stdout && out->fd >= 0)
        close(out->fd);
    out->fd = -1;
    out->sealed = 0;
    if (out->tmp_path && !out->direct)
        unlink(out->tmp_path);
    out_release(out);
}
