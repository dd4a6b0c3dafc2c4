/* _fastspan: the compiled fast path of the collective, ProcessGroup-method and host-sync wrappers (fastpath.py).
 *
 * Why: a traced call should add under a microsecond. The Python wrapper (wrap_ops.op_span) costs ~2.4 us on our
 * 2-vCPU machines, ~1.3 us of it bytecode (argument extraction, frame walk, cache lookups) and ~0.5 us the two
 * ring records; no rewrite in Python gets under 1 us. This object does the *common case* of the same wrapper in C
 * and hands everything else to the Python wrapper it was built around ("slow"), which stays the reference:
 *
 *   - it reads the same caches the Python path fills (TraceState.groups, code_info, tensor_ids, seq, bseq_last)
 *     and never fills them itself: any miss (first call from a call site, a new shape, a new group, no ring yet,
 *     a forked child) goes to the Python wrapper *before* anything is mutated, so a call is recorded exactly once;
 *   - it writes the same ring records, with the same seqlock order (commit word 0, fields, commit = index + 1
 *     last, a release store), taking slot indexes and span ids from the same Python counters, so records from both
 *     paths (and from any thread) interleave in one ring;
 *   - it keeps every rule of the Python wrappers: the call's result and exception pass through untouched; a
 *     failure of ranktrace's own code goes to TraceState.fail (tracing off, one line) and the call still runs; the
 *     guard (tracestate.recording_thread: depth and enabled) and the per-thread span live on the same per-thread
 *     object the Python wrappers use.
 *
 * Not handled here (always the Python wrapper): p2p ops, containers, an open graph capture, an NVTX tool attached.
 * The module imports only on CPython >= 3.11 (PyFrame_GetLasti); elsewhere the pure-Python wrappers run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030B0000
#error "ranktrace.tracer.rank._fastspan needs CPython 3.11 or newer (the pure-Python wrappers are used instead)"
#endif

#define N32 INT32_MIN
#define N64 INT64_MIN
#define SLOT_SIZE 128

enum { MODE_FUNCTION = 0, MODE_PG_METHOD = 1, MODE_SYNC = 2 };
enum { KIND_ENTER = 0, KIND_EXIT = 1 };
#define FLAG_ASYNC 2

/* tracer.formats.ringformat.SLOT: "<QqIBBBBIIIIIIiiqqqqq" (96 bytes, no padding between fields) */
#pragma pack(push, 1)
typedef struct {
    uint64_t commit;
    int64_t t_ns;
    uint32_t tid;
    uint8_t kind, category, flags, pad;
    uint32_t name, group, callsite, dtype, shape, error;
    int32_t peer, graph_id;
    int64_t seq, backend_seq, nbytes, span_id, parent_span_id;
} Slot;
#pragma pack(pop)
_Static_assert(sizeof(Slot) == 96, "Slot must match tracer.formats.ringformat.SLOT");

/* interned attribute / keyword names */
static PyObject *s_tls, *s_ts, *s_depth, *s_span, *s_tid, *s_enabled, *s_capturing, *s_nv, *s_ring,
    *s_c10d_world, *s_default_pg, *s_non_member, *s_spans, *s_dtype, *s_shape, *s_untraced, *s_register_work,
    *s_fail, *s_name_id, *s_group, *s_async_op, *s_put;
static PyObject *monotonic_ns; /* time.monotonic_ns: the ring clock read in C when the recorder uses it */
static PyObject *small_zero, *small_one;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *weaklist;
    PyObject *st;       /* TraceState */
    PyObject *st_dict;  /* its __dict__ (plain attributes read without attribute lookup) */
    PyObject *slow;     /* the Python wrapper: full semantics */
    PyObject *orig;     /* the wrapped callable */
    PyObject *name;     /* op name (str) */
    PyObject *tensor_kw; /* keyword of the input tensor, or NULL */
    PyObject *error_id; /* spans.error_id */
    PyObject *groups, *seqs, *last, *code_info, *tensor_ids; /* TraceState's caches (never rebound) */
    PyObject *k_dtype, *k_shape; /* the last (dtype, shape) seen, and its ids: skips hashing the shape */
    long long k_ids[3];
    long long name_id;
    long long n_fast, n_slow; /* calls recorded here / handed to the Python wrapper (tests, benchmarks) */
    int mode, cat, always_async;
    Py_ssize_t gi, ti, ai;
} FastSpan;

/* outcome of the preparation step */
enum { PREP_OK = 0, PREP_SLOW = 1, PREP_FAIL = 2 };

static inline int64_t now_ns(PyObject *clock, int *err) {
    if (clock == monotonic_ns) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    PyObject *v = PyObject_CallNoArgs(clock);
    if (v == NULL) { *err = 1; return 0; }
    int64_t t = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (t == -1 && PyErr_Occurred()) *err = 1;
    return t;
}

/* The ring's tail index (tracer.formats.ringformat, issue #28), after the record's commit word: the record's index +
 * 1 into its key's entry (ringformat.tail_key: a collective's group and thread, any other category's thread), the field of its
 * kind (enter 8, exit 16: the only kinds written here). The entry offsets are the Python writers' dict (ring item 5),
 * a key's first record takes its entry through ring item 6 (recorder.TailIndex.entry). p2p records never come here;
 * one that did (or a thread id of 2**28 or more) sets the overflow flag: readers then read the whole ring.
 * 0 ok, -1 error set. */
#define TAIL_OFFSET 1024
#define TAIL_OVERFLOW 1u
#define TAIL_ENTRY_SIZE 40
static int tail_store(PyObject *ring, Py_buffer *view, const Slot *rec, long long idx) {
    if (PyTuple_GET_SIZE(ring) < 7) return 0;
    if (rec->category == 1 || rec->tid >= (1u << 28)) {
        uint32_t *flags = (uint32_t *)((char *)view->buf + TAIL_OFFSET + 8);
        __atomic_fetch_or(flags, TAIL_OVERFLOW, __ATOMIC_RELEASE);
        return 0;
    }
    long long key = rec->category == 0 ? (((long long)rec->tid << 32) | (long long)rec->group) * 8
                                       : -((long long)rec->tid * 8 + (long long)rec->category) - 1;
    PyObject *k = PyLong_FromLongLong(key);
    if (k == NULL) return -1;
    PyObject *o = PyDict_GetItemWithError(PyTuple_GET_ITEM(ring, 5), k);  /* borrowed */
    long long off;
    if (o == NULL) {
        if (PyErr_Occurred()) { Py_DECREF(k); return -1; }
        PyObject *r = PyObject_CallOneArg(PyTuple_GET_ITEM(ring, 6), k);
        Py_DECREF(k);
        if (r == NULL) return -1;
        off = PyLong_AsLongLong(r);
        Py_DECREF(r);
    } else {
        Py_DECREF(k);
        off = PyLong_AsLongLong(o);
    }
    if (off == -1 && PyErr_Occurred()) return -1;
    if (off < 0 || off + TAIL_ENTRY_SIZE > view->len) return 0;
    uint64_t *field = (uint64_t *)((char *)view->buf + off + (rec->kind == KIND_ENTER ? 8 : 16));
    __atomic_store_n(field, (uint64_t)idx + 1, __ATOMIC_RELEASE);
    return 0;
}

/* Write one record into ring (mapping, slot counter, offset of slot 0, slots, clock). 0 ok, -1 error set. */
static int write_slot(PyObject *ring, Slot *rec) {
    PyObject *buf = PyTuple_GET_ITEM(ring, 0), *nxt = PyTuple_GET_ITEM(ring, 1);
    long long base = PyLong_AsLongLong(PyTuple_GET_ITEM(ring, 2));
    long long slots = PyLong_AsLongLong(PyTuple_GET_ITEM(ring, 3));
    if ((base == -1 || slots == -1) && PyErr_Occurred()) return -1;
    if (slots <= 0) { PyErr_SetString(PyExc_ValueError, "ring has no slots"); return -1; }
    int err = 0;
    rec->t_ns = now_ns(PyTuple_GET_ITEM(ring, 4), &err);
    if (err) return -1;
    PyObject *iv = PyIter_Next(nxt);
    if (iv == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "ring slot counter ended");
        return -1;
    }
    long long idx = PyLong_AsLongLong(iv);
    Py_DECREF(iv);
    if (idx == -1 && PyErr_Occurred()) return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE) < 0) return -1;
    long long off = base + (idx % slots) * SLOT_SIZE;
    if (off < 0 || off + SLOT_SIZE > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "ring slot outside the mapping");
        return -1;
    }
    char *p = (char *)view.buf + off;
    uint64_t *commit = (uint64_t *)p;
    __atomic_store_n(commit, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(p + 8, (char *)rec + 8, sizeof(Slot) - 8);
    __atomic_store_n(commit, (uint64_t)idx + 1, __ATOMIC_RELEASE);
    int rc = tail_store(ring, &view, rec, idx);
    PyBuffer_Release(&view);
    return rc;
}

/* Is the pending error a KeyboardInterrupt / SystemExit / GeneratorExit (not an Exception)? Those are the job's:
 * the Python wrappers catch only Exception, so they propagate from there too. */
static inline int pending_is_base_only(void) {
    return PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception);
}

/* Clear a pending Exception (a lookup that failed: the caller falls back); -1 leaves a BaseException set. */
static inline int clear_exception(void) {
    if (pending_is_base_only()) return -1;
    PyErr_Clear();
    return 0;
}

/* st.fail(current exception) and clear it: ranktrace's own failure, tracing goes off, the job goes on.
 * Returns -1 (error left set) when the pending error is not an Exception: that one belongs to the job. */
static int report_failure(FastSpan *self) {
    if (pending_is_base_only()) return -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value == NULL) { value = Py_None; Py_INCREF(value); }
    PyObject *r = PyObject_CallMethodOneArg(self->st, s_fail, value);
    Py_XDECREF(r);
    Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
    return clear_exception();  /* st.fail's own error, if any: dropped unless it is the job's */
}

static inline PyObject *st_attr(FastSpan *self, PyObject *key) { /* borrowed or NULL (absent or error) */
    return PyDict_GetItemWithError(self->st_dict, key);
}

static inline long long as_ll(PyObject *o, int *err) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) *err = 1;
    return v;
}

/* --- the per-thread object (tracestate.ThreadState: __slots__ depth, span, tid) ---------------------------------
 * Read and written through its slot offsets when it has the layout we learnt (a member-descriptor read costs
 * ~180 instructions, this ~10); any other object goes through ordinary attribute access. */
static PyTypeObject *thr_type;
static Py_ssize_t thr_off[3]; /* depth, span, tid */
enum { TS_DEPTH = 0, TS_SPAN = 1, TS_TID = 2 };
static PyObject **ts_names[3] = {&s_depth, &s_span, &s_tid};

static int learn_thread_type(PyTypeObject *tp) {
    Py_ssize_t offs[3];
    for (int i = 0; i < 3; i++) {
        PyObject *d = _PyType_Lookup(tp, *ts_names[i]);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) return 0;
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) return 0;
        offs[i] = m->offset;
    }
    memcpy(thr_off, offs, sizeof(offs));
    Py_INCREF(tp);
    thr_type = tp;
    return 1;
}

/* new reference, or NULL with an error set */
static PyObject *ts_get(PyObject *ts, int which) {
    if (Py_TYPE(ts) == thr_type || (thr_type == NULL && learn_thread_type(Py_TYPE(ts)))) {
        PyObject *v = *(PyObject **)((char *)ts + thr_off[which]);
        if (v != NULL) return Py_NewRef(v);
    }
    return PyObject_GetAttr(ts, *ts_names[which]);
}

static int ts_set(PyObject *ts, int which, PyObject *v) {
    if (Py_TYPE(ts) == thr_type) {
        PyObject **slot = (PyObject **)((char *)ts + thr_off[which]);
        PyObject *old = *slot;
        *slot = Py_NewRef(v);
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(ts, *ts_names[which], v);
}

/* This thread's object, cached for the last Python thread state that asked: a threading.local read costs ~570
 * instructions. One global slot, read and written under the GIL (no C thread-local storage: in a dlopen'ed module
 * that goes through __tls_get_addr); another thread's call simply replaces it. Keyed by the thread state's unique
 * id (a native thread that enters Python again gets a new one, and a new threading.local object) and by the tls
 * object, held strongly so its address cannot be reused (a forked child's TraceState gets a new tls: a miss).
 * New reference; NULL with an error set; None when not made yet. */
static PyObject *c_tls, *c_ts;
static uint64_t c_tstate_id;

static PyObject *thread_state(PyObject *tls) {
    uint64_t tid = PyThreadState_GetID(PyThreadState_Get());
    if (tid == c_tstate_id && tls == c_tls && c_ts != NULL) return Py_NewRef(c_ts);
    PyObject *ts = PyObject_GetAttr(tls, s_ts);
    if (ts != NULL && ts != Py_None) {
        Py_XSETREF(c_tls, Py_NewRef(tls));
        Py_XSETREF(c_ts, Py_NewRef(ts));
        c_tstate_id = tid;
    }
    return ts;
}

/* Per-call values carried from preparation to the exit record. */
typedef struct {
    PyObject *ts, *ring, *pg, *g, *reader; /* strong refs (pg, g, reader may be NULL) */
    long long gid, cs, dt, sh, nb, seq, span, parent, tid;
    int flags, aop;
    PyObject *parent_obj; /* strong ref: ts.span before */
} Call;

static void call_clear(Call *c) {
    Py_CLEAR(c->ts); Py_CLEAR(c->ring); Py_CLEAR(c->pg); Py_CLEAR(c->g); Py_CLEAR(c->reader);
    Py_CLEAR(c->parent_obj);
}

/* Walk frames from the caller to the first one outside torch and ranktrace: its call-site string id from
 * TraceState.code_info (per code object, then per bytecode offset). PREP_SLOW on any cache miss. */
static int callsite(FastSpan *self, long long *cs) {
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    while (f != NULL) {
        PyCodeObject *co = PyFrame_GetCode(f);
        PyObject *key = PyLong_FromVoidPtr((void *)co);
        if (key == NULL) { Py_DECREF(co); Py_DECREF(f); return PREP_FAIL; }
        PyObject *ci = PyDict_GetItemWithError(self->code_info, key);
        Py_DECREF(key);
        if (ci == NULL || !PyTuple_Check(ci) || PyTuple_GET_SIZE(ci) != 3 ||
            PyTuple_GET_ITEM(ci, 0) != (PyObject *)co) {
            Py_DECREF(co); Py_DECREF(f);
            return PyErr_Occurred() ? PREP_FAIL : PREP_SLOW;
        }
        Py_DECREF(co);
        if (PyTuple_GET_ITEM(ci, 1) != Py_True) { /* the first frame outside torch/ranktrace */
            PyObject *lk = PyLong_FromLong(PyFrame_GetLasti(f));
            Py_DECREF(f);
            if (lk == NULL) return PREP_FAIL;
            PyObject *offsets = PyTuple_GET_ITEM(ci, 2);
            PyObject *sid = PyDict_Check(offsets) ? PyDict_GetItemWithError(offsets, lk) : NULL;
            Py_DECREF(lk);
            if (sid == NULL) return PyErr_Occurred() ? PREP_FAIL : PREP_SLOW;
            int err = 0;
            *cs = as_ll(sid, &err);
            return err ? PREP_FAIL : PREP_OK;
        }
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    *cs = 0;
    return PREP_OK;
}

/* (dtype id, shape id, nbytes) from TraceState.tensor_ids; lists/tuples stand for their first tensor. */
static int tensor_ids(FastSpan *self, PyObject *t, Call *c) {
    if (t == NULL || t == Py_None) { c->dt = 0; c->sh = 0; c->nb = N64; return PREP_OK; }
    while (PyList_CheckExact(t) || PyTuple_CheckExact(t)) {
        if (PySequence_Fast_GET_SIZE(t) == 0) return PREP_SLOW;
        t = PySequence_Fast_GET_ITEM(t, 0);
    }
    Py_INCREF(t); /* the list may change while a tensor subclass's getters run Python */
    PyObject *dtype = PyObject_GetAttr(t, s_dtype);
    PyObject *shape = dtype == NULL ? NULL : PyObject_GetAttr(t, s_shape);
    Py_DECREF(t);
    if (shape == NULL) {
        Py_XDECREF(dtype);
        return clear_exception() < 0 ? PREP_FAIL : PREP_SLOW;
    }
    PyObject *kshape = Py_XNewRef(self->k_shape);
    if (dtype == self->k_dtype && kshape != NULL && Py_TYPE(shape) == Py_TYPE(kshape)) {
        int eq = shape == kshape ? 1 : PyObject_RichCompareBool(shape, kshape, Py_EQ);
        if (eq < 0 && clear_exception() < 0) { Py_DECREF(kshape); Py_DECREF(dtype); Py_DECREF(shape); return PREP_FAIL; }
        if (eq == 1) {
            Py_DECREF(kshape);
            Py_DECREF(dtype); Py_DECREF(shape);
            c->dt = self->k_ids[0]; c->sh = self->k_ids[1]; c->nb = self->k_ids[2];
            return PREP_OK;
        }
    }
    Py_XDECREF(kshape);
    PyObject *key = PyTuple_Pack(2, dtype, shape);
    if (key == NULL) { Py_DECREF(dtype); Py_DECREF(shape); return PREP_FAIL; }
    PyObject *ids = PyDict_GetItemWithError(self->tensor_ids, key);
    Py_DECREF(key);
    if (ids == NULL || !PyTuple_Check(ids) || PyTuple_GET_SIZE(ids) != 3) {
        Py_DECREF(dtype); Py_DECREF(shape);
        return clear_exception() < 0 ? PREP_FAIL : PREP_SLOW; /* an unhashable shape: the Python path decides */
    }
    int err = 0;
    c->dt = as_ll(PyTuple_GET_ITEM(ids, 0), &err);
    c->sh = as_ll(PyTuple_GET_ITEM(ids, 1), &err);
    c->nb = as_ll(PyTuple_GET_ITEM(ids, 2), &err);
    if (err) { Py_DECREF(dtype); Py_DECREF(shape); return PREP_FAIL; }
    Py_XSETREF(self->k_dtype, dtype); /* references handed over */
    Py_XSETREF(self->k_shape, shape);
    self->k_ids[0] = c->dt; self->k_ids[1] = c->sh; self->k_ids[2] = c->nb;
    return PREP_OK;
}

/* Everything checked and looked up before any state changes; PREP_SLOW hands the call to the Python wrapper. */
static int prepare(FastSpan *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, Call *c) {
    PyObject *v = st_attr(self, s_nv);
    if (v == NULL) return PyErr_Occurred() ? PREP_FAIL : PREP_SLOW;
    if (v != Py_None) return PREP_SLOW; /* an NVTX tool is attached: the Python path pushes ranges */
    v = st_attr(self, s_capturing);
    if (v == NULL) return PyErr_Occurred() ? PREP_FAIL : PREP_SLOW;
    if (v != Py_None) return PREP_SLOW; /* a graph capture is open */
    PyObject *ring = st_attr(self, s_ring);
    if (ring == NULL) return PyErr_Occurred() ? PREP_FAIL : PREP_SLOW;
    if (!PyTuple_Check(ring) || PyTuple_GET_SIZE(ring) != 7) return PREP_SLOW; /* no ring yet (or forked) */
    Py_INCREF(ring);
    c->ring = ring;
    int err = 0;
    PyObject *tid = ts_get(c->ts, TS_TID);
    if (tid == NULL) return PREP_FAIL;
    c->tid = as_ll(tid, &err);
    Py_DECREF(tid);
    if (err) return PREP_FAIL;

    PyObject *tens = NULL;
    if (self->mode != MODE_SYNC) {
        PyObject *pg = NULL;
        c->aop = self->always_async;
        if (self->mode == MODE_PG_METHOD) {
            if (nargs < 1) return PREP_SLOW;
            pg = args[0];
            if (self->ti >= 0 && self->ti < nargs) tens = args[self->ti];
            c->aop = 1;
        } else {
            PyObject *aop_obj = NULL;
            if (self->gi < nargs) pg = args[self->gi];
            if (self->ti < nargs) tens = args[self->ti];
            if (self->ai < nargs) aop_obj = args[self->ai];
            if (kwnames != NULL) {
                Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
                for (Py_ssize_t i = 0; i < nk; i++) {
                    PyObject *k = PyTuple_GET_ITEM(kwnames, i), *val = args[nargs + i];
                    if (self->gi >= nargs && PyUnicode_Compare(k, s_group) == 0) pg = val;
                    else if (self->tensor_kw && self->ti >= nargs && PyUnicode_Compare(self->tensor_kw, k) == 0)
                        tens = val;
                    else if (self->ai >= nargs && PyUnicode_Compare(k, s_async_op) == 0) aop_obj = val;
                }
                if (PyErr_Occurred()) return PREP_FAIL;
            }
            if (!c->aop && aop_obj != NULL) {
                int t = PyObject_IsTrue(aop_obj);
                if (t < 0) return PREP_FAIL;
                c->aop = t;
            }
            if (pg == NULL || pg == Py_None) {
                PyObject *world = st_attr(self, s_c10d_world);
                if (world == NULL || world == Py_None) return PyErr_Occurred() ? PREP_FAIL : PREP_SLOW;
                pg = PyObject_GetAttr(world, s_default_pg);
                if (pg == NULL) return clear_exception() < 0 ? PREP_FAIL : PREP_SLOW;
                if (pg == Py_None) { Py_DECREF(pg); return PREP_SLOW; } /* not initialised: the call raises */
                c->pg = pg;
            }
        }
        if (c->pg == NULL) { Py_INCREF(pg); c->pg = pg; }
        PyObject *non_member = st_attr(self, s_non_member);
        if (non_member == NULL && PyErr_Occurred()) return PREP_FAIL;
        if (c->pg == non_member) return PREP_SLOW;
        /* group: (weakref to pg, name id, name, ranks, counter reader, is gloo) */
        PyObject *key = PyLong_FromVoidPtr(c->pg);
        if (key == NULL) return PREP_FAIL;
        PyObject *g = PyDict_GetItemWithError(self->groups, key);
        Py_DECREF(key);
        if (g == NULL) return PyErr_Occurred() ? PREP_FAIL : PREP_SLOW;
        if (!PyTuple_Check(g) || PyTuple_GET_SIZE(g) < 6 || !PyWeakref_Check(PyTuple_GET_ITEM(g, 0)) ||
            PyWeakref_GetObject(PyTuple_GET_ITEM(g, 0)) != c->pg)
            return PREP_SLOW;
        Py_INCREF(g);
        c->g = g;
        c->gid = as_ll(PyTuple_GET_ITEM(g, 1), &err);
        if (err) return PREP_FAIL;
        if (PyTuple_GET_ITEM(g, 4) != Py_None) { c->reader = PyTuple_GET_ITEM(g, 4); Py_INCREF(c->reader); }
    }
    if (self->name_id == 0) {
        PyObject *nid = PyObject_CallMethodOneArg(self->st, s_name_id, self->name);
        if (nid == NULL) return PREP_FAIL;
        self->name_id = as_ll(nid, &err);
        Py_DECREF(nid);
        if (err) { self->name_id = 0; return PREP_FAIL; }
    }
    int r = callsite(self, &c->cs);
    if (r != PREP_OK) return r;
    if (self->mode == MODE_SYNC) { c->dt = 0; c->sh = 0; c->nb = N64; return PREP_OK; }
    return tensor_ids(self, tens, c);
}

static void fill(FastSpan *self, Call *c, Slot *s, int kind, long long bseq) {
    s->commit = 0;
    s->tid = (uint32_t)c->tid;
    s->kind = (uint8_t)kind;
    s->category = (uint8_t)self->cat;
    s->flags = (uint8_t)c->flags;
    s->pad = 0;
    s->name = (uint32_t)self->name_id;
    s->group = (uint32_t)c->gid;
    s->callsite = (uint32_t)c->cs;
    s->dtype = (uint32_t)c->dt;
    s->shape = (uint32_t)c->sh;
    s->error = 0;
    s->peer = N32;
    s->graph_id = N32;
    s->seq = c->seq;
    s->backend_seq = bseq;
    s->nbytes = c->nb;
    s->span_id = c->span;
    s->parent_span_id = c->parent;
}

/* reader(pg) as an int; *ok = 0 with the error cleared when the read fails with an Exception, *ok = -1 with the
 * error left set when it is the job's (KeyboardInterrupt from a signal handler, ...). */
static long long read_counter(Call *c, int *ok) {
    PyObject *v = PyObject_CallOneArg(c->reader, c->pg);
    long long n = -1;
    if (v != NULL) {
        n = PyLong_AsLongLong(v);
        Py_DECREF(v);
    }
    if (v == NULL || (n == -1 && PyErr_Occurred())) {
        *ok = clear_exception() < 0 ? -1 : 0;
        return 0;
    }
    *ok = 1;
    return n;
}

/* The state changes of the enter half: seq, untraced-op check, span id, ENTER record. -1 with an error set. */
static int enter(FastSpan *self, Call *c) {
    int err = 0;
    c->flags = c->aop ? FLAG_ASYNC : 0;
    c->seq = N64;
    if (self->mode != MODE_SYNC) {
        PyObject *gname = PyTuple_GET_ITEM(c->g, 2);
        PyObject *prev = PyDict_GetItemWithError(self->seqs, gname);
        if (prev == NULL && PyErr_Occurred()) return -1;
        long long seq = (prev == NULL ? 0 : as_ll(prev, &err)) + 1;
        if (err) return -1;
        PyObject *sv = PyLong_FromLongLong(seq);
        if (sv == NULL || PyDict_SetItem(self->seqs, gname, sv) < 0) { Py_XDECREF(sv); return -1; }
        Py_DECREF(sv);
        c->seq = seq;
        if (c->reader != NULL) { /* the backend counter moved since our last op on this group: ops we never saw */
            int ok;
            long long before = read_counter(c, &ok);
            if (ok < 0) return -1;
            if (ok) {
                PyObject *gid = PyTuple_GET_ITEM(c->g, 1);
                PyObject *last = PyDict_GetItemWithError(self->last, gid);
                if (last == NULL && PyErr_Occurred()) return -1;
                if (last != NULL) {
                    long long lv = as_ll(last, &err);
                    if (err) return -1;
                    if (before > lv) {
                        PyObject *r = PyObject_CallMethod(self->st, "untraced", "OLLLL", c->g, lv, before, c->cs,
                                                          c->tid);
                        if (r == NULL) return -1;
                        Py_DECREF(r);
                    }
                }
            }
        }
    }
    PyObject *spans = st_attr(self, s_spans);
    if (spans == NULL) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "_spans"); return -1; }
    PyObject *sp = PyIter_Next(spans);
    if (sp == NULL) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "span counter ended"); return -1; }
    c->span = as_ll(sp, &err);
    Py_DECREF(sp);
    if (err) return -1;
    c->parent_obj = ts_get(c->ts, TS_SPAN);
    if (c->parent_obj == NULL) return -1;
    c->parent = as_ll(c->parent_obj, &err);
    if (err) return -1;
    Slot s;
    fill(self, c, &s, KIND_ENTER, N64);
    return write_slot(c->ring, &s);
}

/* ERROR record through st.put (rare: cost does not matter); the job's exception is kept aside meanwhile.
 * Returns -1 with an error set when a KeyboardInterrupt (or the like) arrived meanwhile: it propagates instead,
 * as it would from the Python wrapper's error path. */
static int record_error(FastSpan *self, Call *c, PyObject *exc) {
    if (c->g != NULL) {
        if (PyDict_DelItem(self->last, PyTuple_GET_ITEM(c->g, 1)) < 0) PyErr_Clear();
    }
    PyObject *eid = PyObject_CallFunctionObjArgs(self->error_id, self->st, exc, NULL);
    if (eid == NULL) return report_failure(self);
    PyObject *put = PyObject_GetAttr(self->st, s_put);
    if (put == NULL) { Py_DECREF(eid); return report_failure(self); }
    PyObject *r = PyObject_CallFunction(put, "iiiLLLLLOiiLLLLLL", 2, self->cat, c->flags, self->name_id, c->gid,
                                        c->cs, c->dt, c->sh, eid, (int)N32, (int)N32, c->seq, (long long)N64,
                                        c->nb, c->span, c->parent, c->tid);
    Py_DECREF(put);
    Py_DECREF(eid);
    if (r == NULL) return report_failure(self);
    Py_DECREF(r);
    return 0;
}

/* The wrapped callable, held for the call (_retarget may replace it meanwhile from another thread). */
static inline PyObject *call_orig(FastSpan *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *orig = self->orig;
    if (orig == NULL) return PyErr_Format(PyExc_TypeError, "ranktrace wrapper has nothing to call");
    Py_INCREF(orig);
    PyObject *r = PyObject_Vectorcall(orig, args, nargsf, kwnames);
    Py_DECREF(orig);
    return r;
}

static PyObject *fastspan_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    FastSpan *self = (FastSpan *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Call c;
    memset(&c, 0, sizeof(c));

    PyObject *tls = st_attr(self, s_tls);
    if (tls == NULL) goto slow_checked;
    c.ts = thread_state(tls);
    if (c.ts == NULL) goto fail_before;
    if (c.ts == Py_None) goto slow;
    {
        PyObject *depth = ts_get(c.ts, TS_DEPTH);
        if (depth == NULL) goto fail_before;
        int busy = PyObject_IsTrue(depth);
        Py_DECREF(depth);
        if (busy < 0) goto fail_before;
        PyObject *en = st_attr(self, s_enabled);
        if (en == NULL) goto slow_checked;
        int enabled = PyObject_IsTrue(en);
        if (enabled < 0) goto fail_before;
        if (busy || !enabled) { /* inside a recorded call, or tracing off: pass through */
            call_clear(&c);
            return call_orig(self, args, nargsf, kwnames);
        }
    }
    switch (prepare(self, args, nargs, kwnames, &c)) {
    case PREP_SLOW: goto slow;
    case PREP_FAIL: goto fail_before;
    default: break;
    }
    if (enter(self, &c) < 0) goto fail_before;
    if (ts_set(c.ts, TS_DEPTH, small_one) < 0) goto fail_before;
    if (self->mode != MODE_SYNC) {
        PyObject *spo = PyLong_FromLongLong(c.span);
        if (spo == NULL || ts_set(c.ts, TS_SPAN, spo) < 0) {
            Py_XDECREF(spo);
            PyObject *type, *value, *tb;  /* undo the guard with the error kept aside, then report it */
            PyErr_Fetch(&type, &value, &tb);
            if (ts_set(c.ts, TS_DEPTH, small_zero) < 0) PyErr_Clear();
            PyErr_Restore(type, value, tb);
            goto fail_before;
        }
        Py_DECREF(spo);
    }

    PyObject *result = call_orig(self, args, nargsf, kwnames);

    /* restore the guard first, whatever happened */
    {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (ts_set(c.ts, TS_DEPTH, small_zero) < 0) PyErr_Clear();
        if (self->mode != MODE_SYNC && ts_set(c.ts, TS_SPAN, c.parent_obj) < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
    }
    if (result == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
        if (record_error(self, &c, value != NULL ? value : Py_None) < 0) {
            /* a KeyboardInterrupt while recording: it propagates, the call's own exception as its context */
            PyObject *t2, *v2, *tb2;
            PyErr_Fetch(&t2, &v2, &tb2);
            PyErr_NormalizeException(&t2, &v2, &tb2);
            if (v2 != NULL && value != NULL) PyException_SetContext(v2, Py_NewRef(value));
            Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
            PyErr_Restore(t2, v2, tb2);
        } else {
            PyErr_Restore(type, value, tb);
        }
        call_clear(&c);
        self->n_fast++;
        return NULL;
    }
    {
        long long bseq = N64;
        if (c.reader != NULL) {
            int ok;
            long long n = read_counter(&c, &ok);
            PyObject *gid = PyTuple_GET_ITEM(c.g, 1);
            if (ok < 0) goto fail_after;
            if (!ok) {
                if (PyDict_DelItem(self->last, gid) < 0) PyErr_Clear();
            } else {
                bseq = n;
                PyObject *prev = PyDict_GetItemWithError(self->last, gid);
                long long pv = -1;
                int err = 0;
                if (prev != NULL) pv = as_ll(prev, &err);
                if (err || (prev == NULL && PyErr_Occurred())) goto fail_after;
                if (bseq > pv) {
                    PyObject *bv = PyLong_FromLongLong(bseq);
                    if (bv == NULL || PyDict_SetItem(self->last, gid, bv) < 0) { Py_XDECREF(bv); goto fail_after; }
                    Py_DECREF(bv);
                }
            }
        }
        PyObject *ring = st_attr(self, s_ring);
        if (ring == c.ring) { /* not forked in between (a fork gives the child its own ring) */
            Slot s;
            fill(self, &c, &s, KIND_EXIT, bseq);
            if (write_slot(c.ring, &s) < 0) goto fail_after;
        } else if (PyErr_Occurred()) {
            goto fail_after;
        }
        if (result != Py_None && (c.aop || self->mode == MODE_PG_METHOD)) {
            PyObject *opinfo = Py_BuildValue("(LLiLLiiiO)", c.span, self->name_id, self->cat, c.gid, c.seq,
                                             (int)N32, (int)N32, c.flags,
                                             PyTuple_GET_ITEM(c.g, 5) == Py_True ? Py_True : Py_False);
            if (opinfo == NULL) goto fail_after;
            PyObject *r = PyObject_CallMethodObjArgs(self->st, s_register_work, result, opinfo, NULL);
            Py_DECREF(opinfo);
            if (r == NULL) goto fail_after;
            Py_DECREF(r);
        }
    }
    call_clear(&c);
    self->n_fast++;
    return result;

fail_after:
    call_clear(&c);
    if (report_failure(self) < 0) { /* the job's KeyboardInterrupt: the result is dropped, as in Python */
        Py_DECREF(result);
        return NULL;
    }
    return result;

slow_checked:
    if (PyErr_Occurred()) goto fail_before;
slow:
    call_clear(&c);
    self->n_slow++;
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);

fail_before:
    call_clear(&c);
    if (report_failure(self) < 0) return NULL; /* the job's KeyboardInterrupt: propagates, the call does not run */
    return call_orig(self, args, nargsf, kwnames);
}

/* --- type plumbing ---------------------------------------------------------------------------------------- */
static int fastspan_traverse(FastSpan *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->dict); Py_VISIT(self->st); Py_VISIT(self->st_dict); Py_VISIT(self->slow); Py_VISIT(self->orig);
    Py_VISIT(self->name); Py_VISIT(self->tensor_kw); Py_VISIT(self->error_id); Py_VISIT(self->groups);
    Py_VISIT(self->seqs); Py_VISIT(self->last); Py_VISIT(self->code_info); Py_VISIT(self->tensor_ids);
    Py_VISIT(self->k_dtype); Py_VISIT(self->k_shape);
    return 0;
}

static int fastspan_clear(FastSpan *self) {
    Py_CLEAR(self->dict); Py_CLEAR(self->st); Py_CLEAR(self->st_dict); Py_CLEAR(self->slow); Py_CLEAR(self->orig);
    Py_CLEAR(self->name); Py_CLEAR(self->tensor_kw); Py_CLEAR(self->error_id); Py_CLEAR(self->groups);
    Py_CLEAR(self->seqs); Py_CLEAR(self->last); Py_CLEAR(self->code_info); Py_CLEAR(self->tensor_ids);
    Py_CLEAR(self->k_dtype); Py_CLEAR(self->k_shape);
    return 0;
}

static void fastspan_dealloc(FastSpan *self) {
    PyObject_GC_UnTrack(self);
    if (self->weaklist != NULL) PyObject_ClearWeakRefs((PyObject *)self);
    fastspan_clear(self);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *fastspan_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) { Py_INCREF(self); return self; }
    return PyMethod_New(self, obj); /* binds like a function, so it can replace a method on a class */
}

static PyObject *get_attr_of(PyObject *o, const char *name) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (v != NULL && !PyDict_Check(v)) {
        PyErr_Format(PyExc_TypeError, "TraceState.%s is not a dict", name);
        Py_CLEAR(v);
    }
    return v;
}

/* FastSpan(st, slow, orig, name, mode, cat, gi, ti, ai, tensor_kw, always_async, error_id) */
static PyObject *fastspan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *st, *slow, *orig, *name, *tensor_kw, *error_id;
    int mode, cat, always_async;
    Py_ssize_t gi, ti, ai;
    if (!PyArg_ParseTuple(args, "OOOUiinnnOpO", &st, &slow, &orig, &name, &mode, &cat, &gi, &ti, &ai, &tensor_kw,
                          &always_async, &error_id))
        return NULL;
    if (mode < MODE_FUNCTION || mode > MODE_SYNC) return PyErr_Format(PyExc_ValueError, "bad mode %d", mode);
    FastSpan *self = (FastSpan *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = fastspan_vectorcall;
    self->st = Py_NewRef(st);
    self->slow = Py_NewRef(slow);
    self->orig = Py_NewRef(orig);
    self->name = Py_NewRef(name);
    self->tensor_kw = tensor_kw == Py_None ? NULL : Py_NewRef(tensor_kw);
    self->error_id = Py_NewRef(error_id);
    self->mode = mode;
    self->cat = cat;
    self->gi = gi < 0 ? PY_SSIZE_T_MAX : gi;
    self->ti = ti < 0 ? PY_SSIZE_T_MAX : ti;
    self->ai = ai < 0 ? PY_SSIZE_T_MAX : ai;
    self->always_async = always_async;
    self->st_dict = PyObject_GenericGetDict(st, NULL);
    self->groups = get_attr_of(st, "groups");
    self->seqs = self->groups ? get_attr_of(st, "seq") : NULL;
    self->last = self->seqs ? get_attr_of(st, "bseq_last") : NULL;
    self->code_info = self->last ? get_attr_of(st, "code_info") : NULL;
    self->tensor_ids = self->code_info ? get_attr_of(st, "tensor_ids") : NULL;
    if (self->st_dict == NULL || self->tensor_ids == NULL) { Py_DECREF(self); return NULL; }
    return (PyObject *)self;
}

/* Copied and pickled as the function it stands for is: copy/deepcopy return it, pickle stores its name (its
 * __module__ / __qualname__, set by spans.finish_wrapper), so a job that deep-copies or saves an object holding
 * dist.all_reduce or torch.cuda.synchronize behaves as without ranktrace. */
static PyObject *fastspan_reduce(PyObject *self, PyObject *unused) {
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyObject *fastspan_copy(PyObject *self, PyObject *unused) { return Py_NewRef(self); }

static PyObject *fastspan_deepcopy(PyObject *self, PyObject *memo) { return Py_NewRef(self); }

/* Tests drive GPU-only calls through stand-ins: point this wrapper (not its Python twin) at another callable. */
static PyObject *fastspan_retarget(PyObject *op, PyObject *fn) {
    if (!PyCallable_Check(fn)) return PyErr_Format(PyExc_TypeError, "not callable");
    FastSpan *self = (FastSpan *)op;
    Py_XSETREF(self->orig, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyMethodDef fastspan_methods[] = {
    {"__reduce__", fastspan_reduce, METH_NOARGS, NULL},
    {"__copy__", fastspan_copy, METH_NOARGS, NULL},
    {"__deepcopy__", fastspan_deepcopy, METH_O, NULL},
    {"_retarget", fastspan_retarget, METH_O, "call `fn` instead of the wrapped callable (tests)"},
    {NULL},
};

static PyMemberDef fastspan_members[] = {
    {"__dictoffset__", T_PYSSIZET, offsetof(FastSpan, dict), READONLY},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(FastSpan, weaklist), READONLY},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(FastSpan, vectorcall), READONLY},
    {"slow", T_OBJECT, offsetof(FastSpan, slow), READONLY, "the Python wrapper every unusual call goes to"},
    {"fast_calls", T_LONGLONG, offsetof(FastSpan, n_fast), READONLY, "calls recorded by the compiled path"},
    {"slow_calls", T_LONGLONG, offsetof(FastSpan, n_slow), READONLY, "calls handed to the Python wrapper"},
    {NULL},
};

static PyGetSetDef fastspan_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyType_Slot fastspan_slots[] = {
    {Py_tp_new, fastspan_new},
    {Py_tp_dealloc, fastspan_dealloc},
    {Py_tp_traverse, fastspan_traverse},
    {Py_tp_clear, fastspan_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, fastspan_descr_get},
    {Py_tp_members, fastspan_members},
    {Py_tp_methods, fastspan_methods},
    {Py_tp_getset, fastspan_getset},
    {Py_tp_doc, "A traced call's compiled fast path (see tracer/rank/_fastspan.c); unusual calls go to .slow."},
    {0, NULL},
};

static PyType_Spec fastspan_spec = {
    .name = "ranktrace.tracer.rank._fastspan.FastSpan",
    .basicsize = sizeof(FastSpan),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = fastspan_slots,
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_fastspan",
    "Compiled fast path of the collective and sync wrappers (the Python wrappers stay the reference).",
    -1, NULL,
};

#define INTERN(var, text) do { var = PyUnicode_InternFromString(text); if (var == NULL) return NULL; } while (0)

PyMODINIT_FUNC PyInit__fastspan(void) {
    INTERN(s_tls, "tls"); INTERN(s_ts, "ts"); INTERN(s_depth, "depth"); INTERN(s_span, "span");
    INTERN(s_tid, "tid"); INTERN(s_enabled, "enabled"); INTERN(s_capturing, "capturing"); INTERN(s_nv, "nv");
    INTERN(s_ring, "ring"); INTERN(s_c10d_world, "c10d_world"); INTERN(s_default_pg, "_default_pg");
    INTERN(s_non_member, "non_member"); INTERN(s_spans, "_spans"); INTERN(s_dtype, "dtype");
    INTERN(s_shape, "shape"); INTERN(s_untraced, "untraced"); INTERN(s_register_work, "register_work");
    INTERN(s_fail, "fail"); INTERN(s_name_id, "name_id"); INTERN(s_group, "group"); INTERN(s_async_op, "async_op");
    INTERN(s_put, "put");
    small_zero = PyLong_FromLong(0);
    small_one = PyLong_FromLong(1);
    PyObject *time_mod = PyImport_ImportModule("time");
    if (time_mod == NULL) return NULL;
    monotonic_ns = PyObject_GetAttrString(time_mod, "monotonic_ns");
    Py_DECREF(time_mod);
    if (monotonic_ns == NULL) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (m == NULL) return NULL;
    PyObject *tp = PyType_FromSpec(&fastspan_spec);
    if (tp == NULL || PyModule_AddObject(m, "FastSpan", tp) < 0) { Py_XDECREF(tp); Py_DECREF(m); return NULL; }
    if (PyModule_AddIntConstant(m, "MODE_FUNCTION", MODE_FUNCTION) < 0 ||
        PyModule_AddIntConstant(m, "MODE_PG_METHOD", MODE_PG_METHOD) < 0 ||
        PyModule_AddIntConstant(m, "MODE_SYNC", MODE_SYNC) < 0 ||
        PyModule_AddIntConstant(m, "TAIL_INDEX", 1) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
