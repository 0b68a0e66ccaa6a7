/* io.h - input that may be a file (mmapped) or a pipe (read sequentially),
 * and output that lands atomically (temporary file renamed into place).
 *
 * Readers never seek: a pipe works the same as a file.  A regular file is
 * mapped once so large tensors can be used in place; `kvp_in_read` still works
 * on it, so parsers are written once against the sequential interface and
 * may ask for the mapping as an optimization.
 */
#ifndef KVP_IO_H
#define KVP_IO_H

#include "error.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvp_in {
    int fd;
    int own_fd;            /* close on kvp_in_close */
    const char *name;      /* for messages: the path, or "<stdin>" */
    char *name_owned;
    const uint8_t *map;    /* whole file when mapped (or the caller's bytes), else NULL */
    int own_map;           /* munmap on kvp_in_close */
    int map_slot;          /* 1 + its entry among the mappings a bus error names, or 0 */
    uint64_t size;         /* file size when known (regular file) */
    int size_known;
    uint64_t pos;          /* bytes consumed so far */
    uint8_t head[8];       /* bytes peeked from a pipe, not yet consumed */
    uint32_t head_n;
} kvp_in;

/* Open path for reading; "-" is stdin.  Regular files are mapped (an empty
 * file is fine).  Directories are refused with a clear message. */
int kvp_in_open(kvp_in *in, const char *path, kvp_err *err);
/* Wrap an already open descriptor (not closed by kvp_in_close). */
int kvp_in_from_fd(kvp_in *in, int fd, const char *name, kvp_err *err);
/* Read n bytes the caller keeps in memory (not copied, not freed) as if
 * they were a mapped file named name: fuzz harnesses and tests. */
void kvp_in_from_memory(kvp_in *in, const void *p, size_t n, const char *name);
/* Stop using the mapping and read with read(2) from the current position,
 * as on a pipe (tests use it to exercise the streaming path on files). */
void kvp_in_unmap(kvp_in *in);
/* Read up to n bytes; returns the count (short only at end of input) or a
 * negative code.  Advances pos. */
int64_t kvp_in_read(kvp_in *in, void *buf, size_t n, kvp_err *err);
/* Read what is there, up to n bytes: waits only while nothing is (one
 * read(2) on a pipe, so a line written to a pipe is seen as it comes).
 * The count, 0 at the end of input, or a negative code.  Advances pos. */
int64_t kvp_in_read_some(kvp_in *in, void *buf, size_t n, kvp_err *err);
/* 1 when reading now would wait (a pipe or terminal with nothing in it),
 * else 0: a file, a mapping, data or the end ready. */
int kvp_in_would_block(const kvp_in *in);

/* Reads waiting on a pipe or terminal, and kvp_in_open waiting for a FIFO's
 * writer, are retried after a signal, unless *flag is set then (a program's stop flag, set by its SIGINT/SIGTERM
 * handler, installed without SA_RESTART): then they fail with KVP_EINTR, so
 * a job waiting for input stops when told to.  NULL turns this off. */
void kvp_in_interrupt_on(const volatile sig_atomic_t *flag);
/* Look at up to n (at most 8) bytes ahead without consuming them: a pipe
 * cannot be reopened or rewound, so what is peeked is kept and handed to
 * the next read.  The count (short only at end of input) or a negative code. */
int64_t kvp_in_peek(kvp_in *in, void *buf, size_t n, kvp_err *err);
/* 1 when opening in's path again gives the same bytes from the start (a
 * regular file opened by name), else 0 (stdin, a pipe, a FIFO, a device):
 * a reader that needs two passes refuses the latter. */
int kvp_in_reopenable(const kvp_in *in);
/* Skip n bytes forward (reads and discards on a pipe); returns bytes skipped. */
int64_t kvp_in_skip(kvp_in *in, uint64_t n, kvp_err *err);
/* Bytes left when the size is known, else UINT64_MAX. */
uint64_t kvp_in_left(const kvp_in *in);
void kvp_in_close(kvp_in *in);

/* Read the rest of in into memory, with a size ceiling; as kvp_read_file. */
int kvp_in_read_all(kvp_in *in, uint64_t max, uint8_t **data, size_t *len, kvp_err *err);
/* Read a whole file (or stdin) into memory, with a size ceiling. *data is
 * NUL-terminated for convenience (not counted in *len).  Free with free(). */
int kvp_read_file(const char *path, uint64_t max, uint8_t **data, size_t *len, kvp_err *err);

/* What kind of model input a path is, from its first bytes (never its name). */
enum kvp_file_kind {
    KVP_FILE_GGUF = 1,        /* "GGUF" magic */
    KVP_FILE_KVP = 2,         /* the KVP stream magic */
    KVP_FILE_SAFETENSORS = 3, /* anything else, or a folder: the safetensors reader names what is wrong */
};
/* Sets *kind from in's first bytes, which stay to be read (kvp_in_peek). */
int kvp_in_kind(kvp_in *in, int *kind, kvp_err *err);
/* Open path ("-": stdin) and set *kind from its first bytes, which stay in
 * *in for the reader that takes it: a pipe or FIFO opened a second time
 * would lose them.  A folder is KVP_FILE_SAFETENSORS with *in closed (fd
 * -1).  0, or a negative code naming the path; *in is closed on error.  A
 * file shorter than 8 bytes, which no model is, is KVP_EFORMAT ("the file
 * is empty, not a model", "3 bytes, too short to be a model"). */
int kvp_in_open_kind(kvp_in *in, const char *path, int *kind, kvp_err *err);

/* The folder path names its file in ("." for a bare name, "/" at the
 * root), allocated; NULL when out of memory. */
char *kvp_path_dir(const char *path);
/* The end of the chain of symlinks at path, allocated: the file a shell's
 * `>` writes through the link (a dangling link's target, which it would
 * create), or path itself when it is no link.  NULL with errno set (ELOOP
 * past 40 links, ENOMEM). */
char *kvp_path_link_end(const char *path);
/* 1 when kvp_out_open writes path in place: an existing device or FIFO,
 * or the regular file standard output or error writes to; 0 when it is
 * written under a temporary name in the folder of the file it ends at
 * (kvp_path_link_end) and renamed there, which that folder must allow. */
int kvp_out_in_place(const char *path);

typedef struct kvp_out {
    int fd;
    int is_stdout;
    int direct;      /* path is a device or FIFO: written in place, no rename */
    int sealed;      /* kvp_out_seal done: closed, only the rename is left */
    int sig_slot;    /* 1 + slot of tmp_path in the signal cleanup table; 0: none */
    char *path;      /* final name (NULL for stdout) */
    char *target;    /* where path's symlink points: renamed there (NULL: path itself) */
    char *tmp_path;  /* where we write until commit */
    uint64_t pos;    /* bytes written */
} kvp_out;

/* Open path for writing; "-" is stdout.  A file is written under a temporary
 * name in the same directory ("PATH.tmp.XXXXXX") and renamed into place by
 * kvp_out_commit, so a failed or interrupted run never leaves a partial file
 * under `path`.  An existing path that is not a regular file (/dev/null,
 * /dev/full, a FIFO) is written in place: renaming over it would replace it;
 * so is the regular file standard output or error writes to (/dev/stderr
 * of "2>> log"), through that stream's descriptor.
 * A symlink to a file is followed (the file it names is replaced, the link
 * stays), a file replaced keeps its permissions, and a new one gets 0666
 * less the umask, as a shell's redirection would.
 *
 * While the temporary file exists, a fatal signal whose action is the default
 * (SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE, SIGXFSZ) removes it and then
 * ends the process by that signal as it would have; the handlers are
 * installed on the first temporary file.  So does exit() (a program that
 * dies of an error in the middle of a job, kvp_cli_die).  SIGKILL cannot be
 * caught: it leaves the temporary file (never a file under `path`). */
int kvp_out_open(kvp_out *out, const char *path, kvp_err *err);
/* fsync(fd), a file system that cannot sync (EINVAL, ENOTSUP, ENOSYS)
 * counted as done: 0, or -1 with errno. */
int kvp_fsync(int fd);
/* Write all n bytes (retries on EINTR).  KVP_EPIPE when the reader is gone. */
int kvp_out_write(kvp_out *out, const void *p, size_t n, kvp_err *err);
/* fsync the temporary file, rename it into place and fsync its folder;
 * closes.  A failed fsync or close is KVP_EIO and leaves no file.  After
 * kvp_out_seal, only the rename and the folder's fsync are left to do. */
int kvp_out_commit(kvp_out *out, kvp_err *err);
/* kvp_out_commit's first half: the temporary file synced and closed, so
 * every failure a commit can have but the rename's has happened; the file
 * stays under its temporary name (removed by kvp_out_abort, a fatal signal
 * or exit()) until kvp_out_commit renames it.  A job of several outputs
 * (decode's --kv-out and --stats=FILE) seals them all before it renames
 * any, so that one failing leaves none of the others behind it.  0, or
 * KVP_EIO with the file removed (as a failed commit); standard output and
 * an output sealed already: 0, nothing done. */
int kvp_out_seal(kvp_out *out, kvp_err *err);
/* A job's outputs committed together: each sealed (the first failure
 * removes every one), then all renamed into place back to back, with a
 * fatal signal held off until the last rename is done (so a signal never
 * leaves one renamed and another's temporary file removed), then their
 * folders synced.  A rename that fails after another succeeded (a folder
 * changed meanwhile) says which is in place: "X: cannot rename into place:
 * ... (Y was written; this was not)".  Standard output and outputs
 * committed already are passed over. */
int kvp_out_commit_all(kvp_out *const *outs, size_t n, kvp_err *err);
/* Remove the temporary file; closes.  Safe after commit (does nothing). */
void kvp_out_abort(kvp_out *out);
/* A scratch file or folder of the program's own (not an output: a
 * temporary folder and what it holds), removed as a temporary output is, on
 * a fatal signal or at exit(), until forgotten: files first, then empty
 * folders.  path must stay valid until kvp_tmp_forget.  Returns the handle
 * for kvp_tmp_forget (0: the table was full, not remembered). */
int kvp_tmp_remember(const char *path);
void kvp_tmp_forget(int handle, const char *path);
/* Remove every temporary output and remembered scratch file now, before an
 * end that runs no atexit (MPI_Abort). */
void kvp_tmp_remove_all(void);
/* The name the output will have, for messages ("<stdout>" for stdout). */
const char *kvp_out_name(const kvp_out *out);

#endif
