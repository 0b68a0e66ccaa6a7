/* cli.c - shared program behaviour (see cli.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "io.h"
#include "unicode.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Set once at startup and only read after: program-wide state, like
 * getopt's own. */
static const char *prog_name = "kvpipe";
/* Called before each message (NULL: none): a progress line redrawn in
 * place on the terminal ends first (lib/engine/progress.c). */
static void (*before_message)(void);

void kvp_cli_before_message(void (*fn)(void)) { before_message = fn; }

/* A standard descriptor the caller closed (`2>&-`, `<&-`) is held on the
 * null device, opened the other way round so that writing to it (or
 * reading it) still fails with EBADF as on a closed one: left free, the
 * next file opened took its number, and decode's messages went into the
 * --resume results file opened as descriptor 2, or the model was read as
 * the prompts of `-f -`. */
static void hold_closed_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        int h = open("/dev/null", fd == 0 ? O_WRONLY : O_RDONLY);
        if (h >= 0 && h != fd) { /* the lowest free number is fd's: only if another thread took it */
            dup2(h, fd);
            close(h);
        }
    }
}

void kvp_cli_init(const char *argv0)
{
    hold_closed_std_fds();
    if (argv0 && *argv0) {
        const char *slash = strrchr(argv0, '/');
        prog_name = slash ? slash + 1 : argv0;
    }
    signal(SIGPIPE, SIG_DFL);
    opterr = 0;
}

const char *kvp_cli_prog(void) { return prog_name; }

__attribute__((format(printf, 1, 0))) static void vmsg(const char *fmt, va_list ap)
{
    fflush(stdout);
    if (before_message)
        before_message();
    fprintf(stderr, "%s: ", prog_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void kvp_cli_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
}

void kvp_cli_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
    exit(KVP_EXIT_FAIL);
}

void kvp_cli_die_err(const kvp_err *err)
{
    if (err->code == KVP_EPIPE)
        exit(KVP_EXIT_OK);
    kvp_cli_die("%s", err->msg[0] ? err->msg : kvp_strerror(err->code));
}

static int usage_quiet;

void kvp_cli_set_usage_quiet(int quiet) { usage_quiet = quiet; }

void kvp_cli_usage_error(const char *fmt, ...)
{
    if (usage_quiet) {
        /* A launched rank other than 0: rank 0 meets the same error in the
         * same arguments and says it. Exiting first let mpirun abort the job
         * before rank 0 had printed anything (seen in CI), so this rank waits
         * for mpirun to end it, which it does once rank 0 exits non-zero;
         * the wait is bounded in case rank 0 never gets here. */
        sleep(30);
        exit(KVP_EXIT_USAGE);
    }
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
    fprintf(stderr, "Try '%s --help' for more information.\n", prog_name);
    exit(KVP_EXIT_USAGE);
}

/* The operand that followed an optional-value option, and that option
 * (its long form, and the short one when it was written short). */
static const char *split_word, *split_opt;
static char split_short[3];

/* Whether word names optional-value option o: "--name", or "-c" for its
 * short letter. */
static int names_optional(const char *word, const struct option *o)
{
    if (o->has_arg != optional_argument)
        return 0;
    if (strncmp(word, "--", 2) == 0)
        return strcmp(word + 2, o->name) == 0;
    return !o->flag && o->val > ' ' && o->val < 127 && word[0] == '-' && word[1] == o->val && !word[2];
}

void kvp_cli_note_optional_values(int argc, char *const argv[], const struct option *longopts)
{
    split_word = split_opt = NULL;
    split_short[0] = '\0';
    for (int i = 1; i + 1 < argc && !split_word; i++) {
        if (strcmp(argv[i], "--") == 0)
            return;
        if (argv[i][0] != '-' || strchr(argv[i], '=') || argv[i + 1][0] == '-')
            continue;
        for (const struct option *o = longopts; o->name && !split_word; o++)
            if (names_optional(argv[i], o)) {
                split_opt = o->name, split_word = argv[i + 1];
                if (argv[i][1] != '-')
                    snprintf(split_short, sizeof split_short, "%s", argv[i]);
            }
    }
}

const char *kvp_cli_operand_hint(int argc, char *const argv[], int first)
{
    static char hint[512];
    for (int i = first; split_word && i < argc; i++)
        if (argv[i] == split_word) { /* the same word, wherever getopt moved it */
            if (split_short[0])
                snprintf(hint, sizeof hint,
                         " ('%.200s' follows %s, whose value is given as %sVALUE or --%.100s=VALUE)", split_word,
                         split_short, split_short, split_opt);
            else
                snprintf(hint, sizeof hint, " ('%.200s' follows --%.100s, whose value is given as --%.100s=VALUE)",
                         split_word, split_opt, split_opt);
            return hint;
        }
    return "";
}

/* The long options name (n bytes, no dashes) begins, when two or more:
 * "--top-k, --top-p" into buf; 0 when fewer. */
static int ambiguous_matches(const struct option *longopts, const char *name, size_t n, char *buf, size_t cap)
{
    int k = 0;
    size_t at = 0;
    buf[0] = '\0';
    for (const struct option *o = longopts; o && o->name; o++)
        if (strncmp(o->name, name, n) == 0 && at + strlen(o->name) + 5 < cap) {
            at += (size_t)snprintf(buf + at, cap - at, "%s--%s", k ? ", " : "", o->name);
            k++;
        }
    return k >= 2 ? k : 0;
}

void kvp_cli_bad_option(char *const argv[], const char *optstring, const struct option *longopts)
{
    int c = optopt;
    /* An unknown short option; argv[optind - 1] may not hold it (getopt
     * stays on a cluster like -qc until its end), optopt does. */
    if (c > 0 && c < 256 && (c == ':' || !strchr(optstring, c))) {
        if (c > 32 && c < 127)
            kvp_cli_usage_error("unknown option '-%c'", c);
        kvp_cli_usage_error("unknown option (byte %d)", c);
    }
    /* A long option, or a known short one missing its value (only at the end
     * of argv, so getopt has moved past it): the argument just consumed. */
    const char *arg = optind > 0 && argv[optind - 1] ? argv[optind - 1] : "";
    int is_long = strncmp(arg, "--", 2) == 0 && arg[2];
    const char *eq = is_long ? strchr(arg, '=') : NULL;
    int name_len = eq ? (int)(eq - arg) : (int)strlen(arg);
    char matches[512];
    if (c == 0 && is_long && ambiguous_matches(longopts, arg + 2, (size_t)name_len - 2, matches, sizeof matches))
        kvp_cli_usage_error("option '%.*s' is ambiguous: %s", name_len, arg, matches);
    if (c == 0)
        kvp_cli_usage_error("unknown option '%.*s'", name_len, arg);
    if (!is_long)
        kvp_cli_usage_error("option '-%c' needs a value", c);
    if (eq)
        kvp_cli_usage_error("option '%.*s' takes no value", name_len, arg);
    kvp_cli_usage_error("option '%s' needs a value", arg);
}

void kvp_cli_version(void)
{
    printf("%s (kvpipe) %s\n", prog_name, KVP_VERSION);
    exit(kvp_cli_close_stdout());
}

/* round(f * m / d) for f < d < 2^62 and m < 2^62, exactly: m's bits from
 * the top, value = q + r / d doubled and f / d added a bit that is set. */
static uint64_t frac_times(uint64_t f, uint64_t m, uint64_t d)
{
    uint64_t q = 0, r = 0;
    for (int bit = 63; bit >= 0; bit--) {
        q <<= 1, r <<= 1;
        if (m >> bit & 1)
            r += f;
        while (r >= d)
            r -= d, q++;
    }
    return q + (r >= d - r); /* half a byte or more rounds up */
}

int kvp_cli_parse_size(const char *s, uint64_t *out)
{
    /* Decimal digits and an optional fraction, as documented ("1.5G"):
     * strtod would also take a sign, leading space, an exponent and hex
     * ("0x50G" was 80 GB), and its binary product is not the decimal one
     * ("16.4GB" came out 16399999999.999998 and was refused). */
    if (!s)
        return -1;
    size_t n = strspn(s, "0123456789");
    if (!n)
        return -1;
    uint64_t whole = 0, frac = 0, den = 1;
    for (size_t i = 0; i < n; i++) {
        if (whole > (UINT64_MAX - 9) / 10)
            return -1;
        whole = whole * 10 + (uint64_t)(s[i] - '0');
    }
    const char *p = s + n;
    if (*p == '.' && p[1] >= '0' && p[1] <= '9') {
        size_t nf = strspn(++p, "0123456789");
        /* 18 places at most count (10^18 < 2^62): the rest is below a
         * byte in any unit here */
        for (size_t i = 0; i < nf && i < 18; i++)
            frac = frac * 10 + (uint64_t)(p[i] - '0'), den *= 10;
        p += nf;
    }
    uint64_t mult = 1;
    static const char units[] = "KMGTP";
    const char *u = *p ? strchr(units, *p >= 'a' ? *p - 32 : *p) : NULL;
    if (u && *p) {
        int power = (int)(u - units) + 1;
        p++;
        uint64_t base = 1000;
        if (*p == 'i' || *p == 'I') { /* any case, as the prefix: "80gib" is no other size */
            base = 1024;
            p++;
        }
        for (int i = 0; i < power; i++)
            mult *= base;
    }
    if (*p == 'B' || *p == 'b') /* bytes: "80gb" is 80 GB too (a size is never in bits) */
        p++;
    if (*p)
        return -1;
    /* A fraction of a byte given as bytes ("1.5") is no size; in a unit
     * (79.65GiB, as --list-gpus prints) it rounds to the nearest byte. */
    if (mult == 1 && frac)
        return -1;
    uint64_t part = frac ? frac_times(frac, mult, den) : 0;
    if (whole > (UINT64_MAX - part) / mult)
        return -1;
    *out = whole * mult + part;
    return 0;
}

/* strtoll and strtod also take leading space, a '+', and (strtod) hex
 * ("0x1p3"), infinity and nan: an option's number is written plainly, so
 * " 5" or "0x10" is a typo to report, not a value. */
static int plain_number(const char *s)
{
    const char *p = s + (*s == '-');
    return (*p >= '0' && *p <= '9') || (*p == '.' && p[1] >= '0' && p[1] <= '9');
}

int kvp_cli_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    if (!s || !plain_number(s))
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || end == s || errno || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int kvp_cli_parse_f64(const char *s, double min, double max, double *out)
{
    if (!s || !plain_number(s) || strpbrk(s, "xXpP"))
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* an underflow is rounded toward 0, as any rounding (1e-400 is 0):
     * only overflow is an error */
    if (errno == ERANGE && fabs(v) <= DBL_MIN)
        errno = 0;
    if (*end || end == s || errno || !isfinite(v) || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

uint64_t kvp_cli_opt_size(const char *opt, const char *s)
{
    uint64_t v;
    if (kvp_cli_parse_size(s, &v))
        kvp_cli_usage_error("%s: '%s' is not a size (e.g. 512M, 4GiB, 1000000)", opt, s);
    return v;
}

int64_t kvp_cli_opt_i64(const char *opt, const char *s, int64_t min, int64_t max)
{
    int64_t v;
    if (kvp_cli_parse_i64(s, min, max, &v))
        kvp_cli_usage_error("%s: '%s' is not a whole number from %lld to %lld", opt, s, (long long)min,
                            (long long)max);
    return v;
}

double kvp_cli_opt_f64(const char *opt, const char *s, double min, double max)
{
    double v;
    if (kvp_cli_parse_f64(s, min, max, &v))
        kvp_cli_usage_error("%s: '%s' is not a number from %g to %g", opt, s, min, max);
    return v;
}

const char *kvp_cli_opt_path(const char *opt, const char *s)
{
    if (!s[0])
        kvp_cli_usage_error("%s: an empty file name", opt);
    return s;
}

int kvp_cli_progress_enabled(void) { return isatty(2); }

/* Length of the valid UTF-8 sequence at s (n bytes available), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    unsigned cp = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

/* Bytes from s (not a valid character) that one U+FFFD replaces: the
 * maximal subpart of an ill-formed sequence (Unicode 3.9, what Python's
 * and HF's decode with errors="replace" do): the lead and the
 * continuation bytes a valid sequence could have had after it, so a
 * character cut short (E5 BA) is one U+FFFD, not one a byte. */
static size_t utf8_bad_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0], lo = 0x80, hi = 0xbf;
    size_t want;
    if (c >= 0xc2 && c <= 0xdf)
        want = 2;
    else if (c >= 0xe0 && c <= 0xef)
        want = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
        want = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else
        return 1;
    size_t i = 1;
    for (; i < want && i < n && s[i] >= lo && s[i] <= hi; i++)
        lo = 0x80, hi = 0xbf;
    return i;
}

void kvp_cli_json_str(FILE *f, const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc((int)c, f);
            i++;
        } else if (c < 0x20) {
            switch (c) {
            case '\n': fputs("\\n", f); break;
            case '\t': fputs("\\t", f); break;
            case '\r': fputs("\\r", f); break;
            default: fprintf(f, "\\u%04x", c);
            }
            i++;
        } else if (c < 0x80) {
            fputc((int)c, f);
            i++;
        } else {
            size_t len = utf8_len(s + i, n - i);
            if (len) {
                fwrite(s + i, 1, len, f);
                i += len;
            } else {
                fputs("\\ufffd", f);
                i += utf8_bad_len(s + i, n - i);
            }
        }
    }
    fputc('"', f);
}

void kvp_cli_c_escaped(FILE *f, const char *str, size_t n, int quote)
{
    for (size_t i = 0; i < n;) {
        char e[KVP_UNICODE_ESCAPE_MAX];
        size_t len;
        i += kvp_unicode_escape_char(str + i, n - i, quote, e, &len);
        fwrite(e, 1, len, f);
    }
}

char *kvp_cli_sh_quote(const char *s)
{
    size_t n = strlen(s), quotes = 0;
    int plain = n > 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        quotes += c == '\'';
        plain &= (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 (c && strchr("@%+=:,./_-", c));
    }
    if (plain)
        return strdup(s);
    /* 'text', each ' closing the quotes, escaped, and opening them again */
    char *q = malloc(n + 3 * quotes + 3), *o = q;
    if (!q)
        return NULL;
    *o++ = '\'';
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\'') {
            memcpy(o, "'\\''", 4);
            o += 4;
        } else {
            *o++ = s[i];
        }
    }
    *o++ = '\'';
    *o = 0;
    return q;
}

void kvp_cli_c_str(FILE *f, const char *str, size_t n)
{
    fputc('\'', f);
    kvp_cli_c_escaped(f, str, n, '\'');
    fputc('\'', f);
}

/* The null device: it keeps nothing, so any number of outputs (a cron
 * job's --stats=/dev/null > /dev/null) may go to it without one replacing
 * another. */
static int is_null_device(const struct stat *s)
{
    struct stat n;
    return S_ISCHR(s->st_mode) && stat("/dev/null", &n) == 0 && S_ISCHR(n.st_mode) && s->st_rdev == n.st_rdev;
}

int kvp_cli_same_file(const char *out, const char *in)
{
    struct stat so, si;
    if (stat(out, &so) != 0 || is_null_device(&so))
        return 0;
    if (strcmp(in, "-") == 0 ? fstat(STDIN_FILENO, &si) != 0 : stat(in, &si) != 0)
        return 0;
    return so.st_dev == si.st_dev && so.st_ino == si.st_ino;
}

/* path's canonical name (its folder's real path and its own name), for
 * paths that may not exist yet, through a last symlink as the writers go
 * through it (a --stats link dangling at the -o file to be made is that
 * file); NULL when its folder cannot be resolved. */
static char *canonical_name(const char *path)
{
    char *end = kvp_path_link_end(path);
    if (!end)
        return NULL;
    const char *slash = strrchr(end, '/'), *base = slash ? slash + 1 : end;
    char *dir = kvp_path_dir(end), *real = dir ? realpath(dir, NULL) : NULL, *name = NULL;
    size_t n = real ? strlen(real) + strlen(base) + 2 : 0;
    if (real && (name = malloc(n)) != NULL)
        snprintf(name, n, "%s/%s", real, base);
    free(real);
    free(dir);
    free(end);
    return name;
}

int kvp_cli_same_path(const char *a, const char *b)
{
    if (!strcmp(a, "-") || !strcmp(b, "-"))
        return 0;
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino && !is_null_device(&sa);
    char *ca = canonical_name(a), *cb = canonical_name(b);
    int same = ca && cb && strcmp(ca, cb) == 0;
    free(ca);
    free(cb);
    return same;
}

int kvp_cli_is_stdout(const char *path)
{
    if (!strcmp(path, "-"))
        return 1;
    struct stat sp, s1;
    return stat(path, &sp) == 0 && fstat(STDOUT_FILENO, &s1) == 0 && sp.st_dev == s1.st_dev &&
           sp.st_ino == s1.st_ino && !is_null_device(&sp);
}

void kvp_cli_refuse_same(const char *opt, const char *out, const char *in, const char *what)
{
    if (out && in && strcmp(out, "-") != 0 && kvp_cli_same_file(out, in))
        kvp_cli_usage_error("%s%s is the %s: write it to another file", opt, out, what);
}

void kvp_cli_refuse_stdout_input(const char *in, const char *what)
{
    if (in && strcmp(in, "-") != 0 && kvp_cli_is_stdout(in))
        kvp_cli_usage_error("standard output is %s, the %s: redirect it to another file", in, what);
}

/* What a failure of stdout (errno e) makes of the job: a reader gone, a
 * quiet KVP_EXIT_OK (like head); else said, KVP_EXIT_FAIL. */
static int stdout_failed(int e)
{
    if (e == EPIPE)
        return KVP_EXIT_OK;
    fprintf(stderr, "%s: <stdout>: write error: %s\n", prog_name, strerror(e));
    return KVP_EXIT_FAIL;
}

int kvp_cli_close_stdout(void)
{
    int bad = fflush(stdout) != 0 || ferror(stdout);
    int e = errno;
    if (fclose(stdout) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    return bad ? stdout_failed(e) : KVP_EXIT_OK;
}

void kvp_cli_check_stdout(void)
{
    if (fflush(stdout) != 0 || ferror(stdout))
        exit(stdout_failed(errno)); /* the files not committed yet are removed at exit */
}

int kvp_cli_write_atomic(const char *path, const void *data, size_t n, kvp_err *err)
{
    kvp_out out;
    int rc = kvp_cli_write_sealed(&out, path, data, n, err);
    return rc < 0 ? rc : kvp_out_commit(&out, err);
}

int kvp_cli_write_sealed(kvp_out *out, const char *path, const void *data, size_t n, kvp_err *err)
{
    int rc = kvp_out_open(out, path, err);
    if (rc < 0)
        return rc;
    if ((rc = kvp_out_write(out, data, n, err)) == 0 && (rc = kvp_out_seal(out, err)) == 0)
        return 0;
    kvp_out_abort(out);
    return rc;
}

void kvp_cli_check_output(const char *opt, const char *path)
{
    if (!path || !strcmp(path, "-"))
        return;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        kvp_cli_die("%s%s: is a directory", opt, path);
    if (kvp_out_in_place(path)) {
        if (access(path, W_OK) != 0)
            kvp_cli_die("%s%s: cannot write: %s", opt, path, strerror(errno));
        return;
    }
    /* a link (dangling or not) is written through: its file's folder is
     * where the temporary file is made and renamed */
    char *end = kvp_path_link_end(path);
    if (!end)
        kvp_cli_die("%s%s: cannot follow the symlink: %s", opt, path, strerror(errno));
    char *dir = kvp_path_dir(end);
    if (!dir)
        kvp_cli_die("out of memory");
    if (access(dir, W_OK | X_OK) != 0)
        kvp_cli_die("%s%s: cannot write into %s: %s", opt, path, dir, strerror(errno));
    free(dir);
    free(end);
}
