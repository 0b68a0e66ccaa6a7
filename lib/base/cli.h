/* cli.h - what every kvpipe program shares: messages, exit codes, number and
 * size parsing, JSON string output, progress and SIGPIPE behaviour.
 *
 * This is the program layer of the library: unlike the rest of lib/, these
 * functions may print (to the stream they are given) and kvp_cli_die* exit.
 * Only cmd/ calls them.
 */
#ifndef KVP_CLI_H
#define KVP_CLI_H

#include "error.h"
#include "version.h"

#include <stdint.h>
#include <stdio.h>

enum { KVP_EXIT_OK = 0, KVP_EXIT_FAIL = 1, KVP_EXIT_USAGE = 2 };

/* Call first in main: remembers the program name (basename of argv0) for
 * messages, restores default SIGPIPE so a vanished reader ends us quietly,
 * and turns off getopt's own messages (opterr = 0) so that a bad option gives
 * the same two lines as every other usage error: kvp_cli_bad_option. */
void kvp_cli_init(const char *argv0);
/* fn (NULL: none) runs before every warning and error message, e.g. to end
 * a status line being redrawn on the terminal. */
void kvp_cli_before_message(void (*fn)(void));
const char *kvp_cli_prog(void);

/* "prog: message" on stderr. */
void kvp_cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "prog: message" on stderr, exit 1. */
_Noreturn void kvp_cli_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "prog: <err->msg>" and exit 1; a broken pipe exits 0 quietly (like head). */
_Noreturn void kvp_cli_die_err(const kvp_err *err);
/* "prog: message" + "Try 'prog --help'." on stderr, exit 2.  Every usage
 * error is exactly these two lines; every runtime error is one line. */
_Noreturn void kvp_cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Usage errors said by this process (0) or not (1): the ranks of an MPI
 * job but rank 0 parse the same options, so rank 0 says it once; a quiet
 * rank waits (30 s at most) for mpirun to end it after rank 0 has exited,
 * then exits 2. */
void kvp_cli_set_usage_quiet(int quiet);
/* Call before getopt_long: notes an option whose value is optional
 * (optional_argument, as --stats[=FILE]) written without '=' and followed
 * by a word getopt will take for an operand ("--stats out.json"), for
 * kvp_cli_operand_hint.  getopt permutes argv, so this looks first. */
struct option;
void kvp_cli_note_optional_values(int argc, char *const argv[], const struct option *longopts);
/* For a usage error about the operands argv[first..argc): "" or, when one
 * of them followed such an option, " ('out.json' follows --stats, whose
 * value is given as --stats=VALUE)". */
const char *kvp_cli_operand_hint(int argc, char *const argv[], int first);

struct option;
/* The usage error for getopt_long's '?' (or ':'): names the option that was
 * unknown, ambiguous (a prefix of two or more of longopts: getopt tells
 * neither apart), lacks its value or takes none.  optstring and longopts
 * are the ones given to getopt_long (optstring tells an unknown short
 * option from one missing its value); a long option whose val is a
 * character must have it in optstring. */
_Noreturn void kvp_cli_bad_option(char *const argv[], const char *optstring, const struct option *longopts);
/* Print "prog VERSION" on stdout and exit 0. */
_Noreturn void kvp_cli_version(void);

/* Parse a size with optional suffix K M G T P (powers of 1000) or Ki Mi Gi
 * Ti Pi (powers of 1024), an optional trailing B ("4GiB", "512M", "1.5G"),
 * in exact decimal: a fraction in a unit rounds to the nearest byte
 * ("79.65GiB"), a fraction of a byte with no unit is refused.  Returns 0
 * or -1 on a malformed or overflowing value. */
int kvp_cli_parse_size(const char *s, uint64_t *out);
/* Whole number in [min, max], decimal digits with an optional '-' (no
 * space, '+' or hex); 0 or -1. */
int kvp_cli_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
/* Finite real number in [min, max], decimal ("-0.5", ".5", "1e-3"; no
 * space, '+', hex, inf or nan); 0 or -1. */
int kvp_cli_parse_f64(const char *s, double min, double max, double *out);

/* Option parsers that exit 2 with "prog: --name: ..." on a bad value. */
uint64_t kvp_cli_opt_size(const char *opt, const char *s);
int64_t kvp_cli_opt_i64(const char *opt, const char *s, int64_t min, int64_t max);
double kvp_cli_opt_f64(const char *opt, const char *s, double min, double max);
/* A file option's value; an empty name is a usage error ("-m: an empty file
 * name"), not a file that is not there (": No such file or directory"). */
const char *kvp_cli_opt_path(const char *opt, const char *s);

/* True when progress may be drawn: stderr is a terminal. */
int kvp_cli_progress_enabled(void);

/* Write s as a JSON string literal (quotes, escapes, invalid UTF-8 as U+FFFD). */
void kvp_cli_json_str(FILE *f, const char *s, size_t n);
/* Write s in single quotes, C-escaped: \n \t \r \\ \' and \xNN for other
 * control bytes and bytes that are not whole UTF-8 (part of a character). */
void kvp_cli_c_str(FILE *f, const char *s, size_t n);
/* kvp_cli_c_str's escapes without the quotes; quote (0: none) is the one
 * quote character escaped besides the backslash. */
void kvp_cli_c_escaped(FILE *f, const char *s, size_t n, int quote);
/* s as one word for a POSIX shell, to paste into a command line: as it is
 * when every byte is one a shell takes literally (letters, digits and
 * @%+=:,./_-), else in single quotes, each ' in it as '\''.  Malloc'd;
 * NULL when out of memory. */
char *kvp_cli_sh_quote(const char *s);

/* Write data[n] to path as a whole: a temporary file renamed into place
 * (lib/base/io.h), so a reader never sees half of it.  0 or a code. */
int kvp_cli_write_atomic(const char *path, const void *data, size_t n, kvp_err *err);
/* kvp_cli_write_atomic but the rename: data[n] written to *out opened on
 * path and sealed (kvp_out_seal), for kvp_out_commit once the job's other
 * outputs are ready too.  0, or a code with nothing left behind. */
struct kvp_out;
int kvp_cli_write_sealed(struct kvp_out *out, const char *path, const void *data, size_t n, kvp_err *err);

/* An output written when the job ends (--stats=FILE), opt its option and
 * separator ("--stats="): one that could not be made then fails now,
 * before the work, with "prog: OPT PATH: what", exit 1: a directory, a
 * device or FIFO not open for writing, or a folder that is missing or not
 * writable: the folder of the file a symlink ends at, where kvp_out_open
 * makes it.  NULL and "-": nothing to check. */
void kvp_cli_check_output(const char *opt, const char *path);

/* An output named out would replace the input named in: both name one
 * existing file (st_dev and st_ino, so through a symlink or another path
 * too); in "-" is standard input, which may be that file redirected.
 * Nothing of out need exist yet: 0 then. */
int kvp_cli_same_file(const char *out, const char *in);

/* a and b name one file: the same inode when both exist, else the same
 * canonical name (each one's folder resolved, its own name as given), so
 * two outputs not written yet compare too.  "-" is never a file here. */
int kvp_cli_same_path(const char *a, const char *b);

/* path is standard output: "-", or a name of what descriptor 1 writes to
 * (/dev/stdout, /dev/fd/1, the file "> FILE" opened), so that an output
 * given it would be mixed into what the program prints there. */
int kvp_cli_is_stdout(const char *path);

/* A usage error when the output out (option opt and the separator before
 * its value, e.g. "-o " or "--stats=") would replace the input in ("-":
 * standard input), described as what ("model", "prompts file"): writing it
 * would destroy the input.  NULL out or in, or out "-" (standard output):
 * nothing to compare. */
void kvp_cli_refuse_same(const char *opt, const char *out, const char *in, const char *what);
/* Usage error (exit 2) when standard output writes to the input in (a
 * file, not "-"), described as what: `decode -f p.jsonl >> p.jsonl`
 * appended the results to the prompts it was reading, `quantize --kv
 * kv.kvp -o - >> kv.kvp` spoiled its input. */
void kvp_cli_refuse_stdout_input(const char *in, const char *what);

/* Flush and close stdout, exit 1 on a write error (a full disk), exit 0
 * quietly when the reader went away.  Call before returning from main. */
int kvp_cli_close_stdout(void);
/* Flush stdout and exit as kvp_cli_close_stdout does on a failure, else
 * return with it open: before a job renames its files into place, so that
 * a job whose printed results were lost (a full disk, a closed
 * descriptor) exits 1 leaving none of them either. */
void kvp_cli_check_stdout(void);

#endif
