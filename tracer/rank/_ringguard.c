/* The ring guard: a rank's ring is a shared mapping of a file; when something else truncates that file (a cleanup
 * script, `: > rank.ring`, a copytruncate rotation), the next store into a page past the new end faults with SIGBUS,
 * and SIGBUS kills the job's own process inside its own collective. This module takes SIGBUS first: a fault inside
 * a guarded ring's mapping replaces that whole mapping, in place, by private anonymous memory (mmap MAP_FIXED), and
 * the faulting store runs again into memory nobody reads. The rank runs on untraced from then on; the file, as the
 * truncation left it, is what the host side reads (it says the ring was cut). A fault anywhere else goes to the
 * handler that was there before (faulthandler's, the job's own) or ends the process as SIGBUS always did.
 *
 * Only async-signal-safe work in the handler: a scan of a fixed table, one mmap syscall, sigaction, raise.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_RINGS 64

typedef struct {
    volatile uintptr_t start;
    volatile uintptr_t length;   /* 0: slot free */
} Guarded;

static Guarded guarded[MAX_RINGS];
static volatile sig_atomic_t lost;       /* mappings replaced since import */
static volatile sig_atomic_t passing;    /* a SIGBUS not ours was handed on */
static struct sigaction previous;
static int installed;

/* Not a fault of ours: to whoever handled SIGBUS before us, once (faulthandler dumps the stacks, then re-raises
 * into us: the second time it is SIGBUS's own default, the end of the process as it always was). */
static void pass_on(int sig, siginfo_t *info)
{
    if (!passing) {
        passing = 1;
        int theirs = (previous.sa_flags & SA_SIGINFO) ? previous.sa_sigaction != NULL
                     : (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN && previous.sa_handler != NULL);
        if (theirs) {
            sigaction(sig, &previous, NULL);
            if (info->si_code <= 0)
                raise(sig);    /* sent (kill, raise): sent again, to them */
            return;            /* a fault: the instruction runs again, into their handler */
        }
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    uintptr_t at = (uintptr_t)info->si_addr;
    if (info->si_code > 0) {   /* a fault (BUS_ADRERR ...), not a kill(): only those can be ours */
        for (int i = 0; i < MAX_RINGS; i++) {
            uintptr_t start = guarded[i].start, length = guarded[i].length;
            if (length != 0 && at >= start && at < start + length) {
                int saved = errno;
                void *got = mmap((void *)start, length, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
                errno = saved;
                if (got != MAP_FAILED) {
                    guarded[i].length = 0;
                    lost++;
                    return;     /* the store runs again, into anonymous memory */
                }
                break;
            }
        }
    }
    pass_on(sig, info);
}

/* On top of whatever handles SIGBUS now. Again after faulthandler.enable() (torchrun's @record calls it in main(),
 * after the ring exists): faulthandler on top would dump "Fatal Python error: Bus error" for a cut ring and end the
 * rank before we saw the fault. */
static int install(int again)
{
    if (installed && !again)
        return 0;
    struct sigaction now;
    if (installed && sigaction(SIGBUS, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigbus)
        return 0;   /* still on top */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &previous) != 0)
        return -1;
    installed = 1;
    return 0;
}

/* the mapping's address and length, from a writable buffer (the rank's mmap object) */
static int span_of(PyObject *obj, uintptr_t *start, uintptr_t *length)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_WRITABLE) != 0)
        return -1;
    *start = (uintptr_t)view.buf;
    *length = (uintptr_t)view.len;
    PyBuffer_Release(&view);
    return 0;
}

static PyObject *guard(PyObject *self, PyObject *obj)
{
    uintptr_t start, length;
    if (span_of(obj, &start, &length) != 0)
        return NULL;
    if (length == 0)
        Py_RETURN_FALSE;
    if (install(0) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    for (int i = 0; i < MAX_RINGS; i++) {
        if (guarded[i].length == 0) {
            guarded[i].start = start;
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            guarded[i].length = length;
            Py_RETURN_TRUE;
        }
    }
    Py_RETURN_FALSE;   /* more rings than slots in one process: this one goes unguarded */
}

static PyObject *release(PyObject *self, PyObject *obj)
{
    uintptr_t start, length;
    if (span_of(obj, &start, &length) != 0)
        return NULL;
    for (int i = 0; i < MAX_RINGS; i++) {
        if (guarded[i].start == start) {
            guarded[i].length = 0;
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            guarded[i].start = 0;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *on_top(PyObject *self, PyObject *unused)
{
    if (!installed)
        Py_RETURN_FALSE;
    if (install(1) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_TRUE;
}

static PyObject *lost_count(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong((long)lost);
}

static PyObject *is_guarded(PyObject *self, PyObject *obj)
{
    uintptr_t start, length;
    if (span_of(obj, &start, &length) != 0)
        return NULL;
    for (int i = 0; i < MAX_RINGS; i++)
        if (guarded[i].length != 0 && guarded[i].start == start)
            Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"guard", guard, METH_O, "guard(mapping): a SIGBUS inside it replaces it by anonymous memory; False: no slot"},
    {"release", release, METH_O, "release(mapping): before it is unmapped"},
    {"is_guarded", is_guarded, METH_O, "is_guarded(mapping): still guarded (not replaced, not released)"},
    {"on_top", on_top, METH_NOARGS, "put the guard back on top of a SIGBUS handler installed since (faulthandler)"},
    {"lost", lost_count, METH_NOARGS, "how many guarded mappings a SIGBUS replaced"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ringguard", NULL, -1, methods};

PyMODINIT_FUNC PyInit__ringguard(void)
{
    return PyModule_Create(&module);
}
