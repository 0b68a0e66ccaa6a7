"""llama.cpp (llama-cpp-python) for every script that runs it: the reference
generators here and scripts/bench/bench_llamacpp.py, with one fallback.

llama.cpp's CPU backend puts weights in "extra buffer types" by default
(AMX tiles, repacked Q4/Q8 layouts) where the CPU has them.  On a 2-core
Intel Xeon (AVX-512, AMX-INT8; llama-cpp-python 0.3.36) that path died with
SIGSEGV in the first decode of Q4_1 and q8_0 files, taking the reference (and
its row in scripts/bench-cpu) with it.  run(fn) therefore calls fn(opener)
in a forked child with llama.cpp's defaults; when the child dies of a signal,
it calls fn again in this process with use_extra_bufts off in the model
parameters, says so on stderr, and returns the note with the result.

Environment:
  KVP_LLAMA_EXTRA_BUFTS=0  start with extra buffer types off (no child)
  KVP_LLAMA_TEST_CRASH=1   the default attempt dies of SIGSEGV when it opens
                           its first model, as on that Intel host: the
                           fallback can be tested on any CPU
  KVP_LLAMA_TEST_CRASH=all every attempt dies so (no reference at all)
"""
import contextlib
import os
import pickle
import signal
import sys

NOTE = "extra buffer types off (use_extra_bufts=False: no AMX, no repacked weights)"


@contextlib.contextmanager
def _extra_bufts(on):
    """Llama() builds its model parameters from llama_model_default_params()
    and takes no argument for this field: set it on what that returns."""
    from llama_cpp import llama_cpp as lc
    default = lc.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = on
        return p

    lc.llama_model_default_params = params
    try:
        yield
    finally:
        lc.llama_model_default_params = default


def opener(extra_bufts):
    """A function taking Llama()'s keyword arguments that opens the model
    with extra buffer types on (llama.cpp's default) or off."""
    def open_llama(**kw):
        from llama_cpp import Llama
        crash = os.environ.get("KVP_LLAMA_TEST_CRASH")
        if crash == "all" or (crash == "1" and extra_bufts):
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGSEGV)
        with _extra_bufts(extra_bufts):
            return Llama(**kw)
    return open_llama


def _in_child(fn):
    """(True, fn(default opener)) from a forked child, or (False, signal
    name) when the child died of a signal.  Exits like the child when it
    failed otherwise (an exception: its traceback is on stderr)."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        status = 1
        try:
            data = pickle.dumps(fn(opener(True)))
            with os.fdopen(w, "wb") as f:
                f.write(data)
            status = 0
        except BaseException:  # noqa: B036 - report anything, then leave without the parent's cleanup
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, st = os.waitpid(pid, 0)
    if os.WIFSIGNALED(st):
        return False, signal.Signals(os.WTERMSIG(st)).name
    if os.WEXITSTATUS(st) != 0:
        sys.exit(os.WEXITSTATUS(st))
    return True, pickle.loads(data)


def run(fn, prog):
    """(fn(open_llama), note): note is "" when llama.cpp's defaults ran, else
    says extra buffer types were off and why.  fn must return something
    picklable and may run twice."""
    if os.environ.get("KVP_LLAMA_EXTRA_BUFTS") == "0":
        return fn(opener(False)), NOTE + " (KVP_LLAMA_EXTRA_BUFTS=0)"
    ok, got = _in_child(fn)
    if ok:
        return got, ""
    note = f"{NOTE}: the default run died of {got}"
    print(f"{prog}: llama.cpp {note}; running it again", file=sys.stderr)
    return fn(opener(False)), note
