/* The training side's hand-over of one tensor to the cache's writer process, in C.
 *
 * redline.data.cache_ring.PyRing is the same in Python, and the reference: this module only
 * makes a fill epoch's per-sample work one call. That work runs right after the user's own
 * transform, with the CPU's caches cold, where each interpreted operation costs several times
 * its warm cost, and the interpreter's work also slows the user's next transform (its code
 * and data evicted); see benchmarks/cache.py and the README's cache section.
 *
 * Ring(ring_bytes, window, header_bytes, send_bytes, write_batch, layouts, layouts_max,
 *      tensor_type, learn)
 *   layouts: redline.data.sample_codec's table of known tensor layouts, read here;
 *   learn: called with a tensor whose layout is not in it while the table holds fewer than
 *   layouts_max (sample_codec.fast_parts, which adds it), then looked up once more.
 * Ring.hold(map): the writer's shared map (a writable buffer), held exported until release().
 * Ring.put(key, value) -> 0 (not taken: the caller encodes and submits it), 1 (copied into the
 *   ring), 2 (copied, and the ring's end is due to be published).
 *
 * The tensor's methods may run Python (a torch function mode, such as the one
 * `with torch.device(...)` installs; `learn` is Python): another thread may then release the
 * map or replace `unsettled`. So what they may change is read after the last such call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

typedef unsigned long long u64;

typedef struct {
    PyObject_HEAD
    Py_buffer buf;
    int held;
    u64 end;      /* positions: absolute, never negative (members of unsigned type) */
    u64 consumed;
    u64 sent;
    Py_ssize_t ring_bytes;
    Py_ssize_t window;
    Py_ssize_t header_bytes;
    u64 send_bytes;
    Py_ssize_t write_batch;
    Py_ssize_t layouts_max;
    PyObject *unsettled; /* a list of keys, always (its setter refuses anything else) */
    PyObject *layouts;   /* dict */
    PyObject *tensor_type;
    PyObject *learn;
} Ring;

static PyObject *s_is_cpu, *s_requires_grad, *s_is_neg, *s_is_conj, *s_dtype, *s_shape,
    *s_stride, *s_data_ptr;

static int
Ring_init(Ring *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"ring_bytes", "window", "header_bytes", "send_bytes",
                            "write_batch", "layouts", "layouts_max", "tensor_type", "learn",
                            NULL};
    PyObject *layouts, *tensor_type, *learn;
    Py_ssize_t ring_bytes, window, header_bytes, send_bytes, write_batch, layouts_max;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "nnnnnO!nO!O", names, &ring_bytes, &window,
                                     &header_bytes, &send_bytes, &write_batch, &PyDict_Type,
                                     &layouts, &layouts_max, &PyType_Type, &tensor_type,
                                     &learn))
        return -1;
    if (!PyCallable_Check(learn)) {
        PyErr_SetString(PyExc_TypeError, "Ring: learn must be callable");
        return -1;
    }
    if (self->held) {
        PyErr_SetString(PyExc_RuntimeError, "Ring.__init__ on a ring that holds a map");
        return -1;
    }
    if (ring_bytes <= 0 || window <= 0 || window > ring_bytes || header_bytes < 0
        || header_bytes > PY_SSIZE_T_MAX - ring_bytes || send_bytes < 0 || write_batch < 1) {
        PyErr_SetString(PyExc_ValueError, "Ring: sizes must be positive, window <= ring_bytes, "
                                          "header_bytes + ring_bytes within a Py_ssize_t");
        return -1;
    }
    self->ring_bytes = ring_bytes;
    self->window = window;
    self->header_bytes = header_bytes;
    self->send_bytes = (u64)send_bytes;
    self->write_batch = write_batch;
    self->layouts_max = layouts_max;
    self->end = self->consumed = self->sent = 0;
    Py_XSETREF(self->unsettled, PyList_New(0));
    if (self->unsettled == NULL)
        return -1;
    Py_INCREF(layouts);
    Py_XSETREF(self->layouts, layouts);
    Py_INCREF(tensor_type);
    Py_XSETREF(self->tensor_type, tensor_type);
    Py_INCREF(learn);
    Py_XSETREF(self->learn, learn);
    return 0;
}

static void
release_map(Ring *self)
{
    if (self->held) {
        self->held = 0;
        PyBuffer_Release(&self->buf);
    }
}

static int
Ring_traverse(Ring *self, visitproc visit, void *arg)
{
    if (self->held)
        Py_VISIT(self->buf.obj);
    Py_VISIT(self->unsettled);
    Py_VISIT(self->layouts);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->learn);
    return 0;
}

static int
Ring_clear(Ring *self)
{
    release_map(self);
    Py_CLEAR(self->unsettled);
    Py_CLEAR(self->layouts);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->learn);
    return 0;
}

static void
Ring_dealloc(Ring *self)
{
    PyObject_GC_UnTrack(self);
    Ring_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Ring_hold(Ring *self, PyObject *map)
{
    if (self->held) {
        PyErr_SetString(PyExc_RuntimeError, "Ring.hold: a map is held already");
        return NULL;
    }
    if (self->layouts == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Ring.hold: the ring was not initialized");
        return NULL;
    }
    if (PyObject_GetBuffer(map, &self->buf, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0)
        return NULL;
    if (self->buf.len < self->header_bytes + self->ring_bytes) {
        PyErr_Format(PyExc_ValueError, "Ring.hold: the map holds %zd bytes, not %zd",
                     self->buf.len, self->header_bytes + self->ring_bytes);
        PyBuffer_Release(&self->buf);
        return NULL;
    }
    self->held = 1;
    Py_RETURN_NONE;
}

static PyObject *
Ring_release(Ring *self, PyObject *Py_UNUSED(ignored))
{
    release_map(self);
    Py_RETURN_NONE;
}

/* 1: the attribute (or the method's result, `call`) is `want`; 0: it is not; -1: an error. */
static int
is(PyObject *t, PyObject *name, int call, PyObject *want)
{
    PyObject *v = call ? PyObject_CallMethodNoArgs(t, name) : PyObject_GetAttr(t, name);
    if (v == NULL)
        return -1;
    int same = v == want;
    Py_DECREF(v);
    return same;
}

/* 0 with the error cleared where it is an Exception (the Python path then meets it again and
   decides), NULL where it is not (a KeyboardInterrupt goes on). */
static PyObject *
not_taken(void)
{
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
    }
    return PyLong_FromLong(0);
}

static PyObject *
Ring_put(Ring *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "Ring.put(key: bytes, value)");
        return NULL;
    }
    PyObject *key = args[0], *t = args[1];
    if (!self->held || (PyObject *)Py_TYPE(t) != self->tensor_type)
        return PyLong_FromLong(0);
    /* What sample_codec.fast_parts checks, in its order. */
    if (is(t, s_is_cpu, 0, Py_True) != 1 || is(t, s_requires_grad, 0, Py_False) != 1
        || is(t, s_is_neg, 1, Py_False) != 1)
        return not_taken();
    PyObject *dtype = PyObject_GetAttr(t, s_dtype);
    PyObject *shape = dtype ? PyObject_GetAttr(t, s_shape) : NULL;
    PyObject *stride = shape ? PyObject_CallMethodNoArgs(t, s_stride) : NULL;
    PyObject *lkey = stride ? PyTuple_Pack(3, dtype, shape, stride) : NULL;
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    if (lkey == NULL)
        return not_taken();
    PyObject *layout = PyDict_GetItemWithError(self->layouts, lkey); /* borrowed */
    if (layout == NULL && !PyErr_Occurred()
        && PyDict_GET_SIZE(self->layouts) < self->layouts_max) {
        /* Not seen yet: learnt, and looked up again. (With the table full, the caller's
           encode learns it for that sample alone, once.) */
        PyObject *r = PyObject_CallOneArg(self->learn, t);
        Py_XDECREF(r);
        layout = r ? PyDict_GetItemWithError(self->layouts, lkey) : NULL;
    }
    Py_DECREF(lkey);
    /* (header, first bytes, ctypes array type or None, value bytes, complex) */
    if (layout == NULL || !PyTuple_CheckExact(layout) || PyTuple_GET_SIZE(layout) != 5)
        return not_taken(); /* unseen, or the general path's (None) */
    /* Held: the calls below may run Python, which may change the table. */
    Py_INCREF(layout);
    PyObject *first = PyTuple_GET_ITEM(layout, 1);
    Py_ssize_t nbytes = PyLong_AsSsize_t(PyTuple_GET_ITEM(layout, 3));
    const char *src = NULL;
    if (!PyBytes_CheckExact(first) || nbytes < 0
        || (PyTuple_GET_ITEM(layout, 4) == Py_True && is(t, s_is_conj, 1, Py_False) != 1))
        goto refused;
    if (nbytes) {
        PyObject *p = PyObject_CallMethodNoArgs(t, s_data_ptr);
        if (p == NULL)
            goto refused;
        src = (const char *)PyLong_AsVoidPtr(p);
        Py_DECREF(p);
        if (src == NULL)
            goto refused;
    }
    /* No Python runs from here on: the map and the positions read now stay as they are. */
    if (!self->held)
        goto refused; /* released meanwhile: the caller's submit says what became of it */
    Py_ssize_t k = PyBytes_GET_SIZE(key), f = PyBytes_GET_SIZE(first);
    u64 n = (u64)f + (u64)nbytes;
    u64 need = (8 + (u64)k + n + 7) & ~(u64)7;
    u64 at = self->end % (u64)self->ring_bytes;
    /* (consumed past end + need: an absurd position set from Python, refused alike) */
    if (n > UINT32_MAX || (u64)k > UINT32_MAX || at + need > (u64)self->window
        || self->consumed > self->end + need
        || self->end + need - self->consumed > (u64)self->ring_bytes)
        goto refused; /* placed by the caller (a wrap, or no room) */
    unsigned char *p = (unsigned char *)self->buf.buf + self->header_bytes + at;
    uint32_t lens[2] = {(uint32_t)k, (uint32_t)n};
    for (int j = 0; j < 2; j++) /* two little-endian u32 (cache_child.RECORD) */
        for (int b = 0; b < 4; b++)
            p[4 * j + b] = (unsigned char)(lens[j] >> (8 * b));
    memcpy(p + 8, PyBytes_AS_STRING(key), (size_t)k);
    memcpy(p + 8 + k, PyBytes_AS_STRING(first), (size_t)f);
    if (nbytes)
        memcpy(p + 8 + k + f, src, (size_t)nbytes);
    Py_DECREF(layout);
    if (PyList_Append(self->unsettled, key) < 0)
        return NULL; /* nothing published: the record is written over by the next */
    self->end += need;
    return PyLong_FromLong(PyList_GET_SIZE(self->unsettled) >= self->write_batch
                           || self->end - self->sent >= self->send_bytes ? 2 : 1);
refused:
    Py_DECREF(layout);
    return not_taken();
}

static PyObject *
Ring_get_unsettled(Ring *self, void *Py_UNUSED(closure))
{
    if (self->unsettled == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the ring was not initialized");
        return NULL;
    }
    return Py_NewRef(self->unsettled);
}

static int
Ring_set_unsettled(Ring *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL || !PyList_CheckExact(value)) {
        PyErr_SetString(PyExc_TypeError, "Ring.unsettled must be a list");
        return -1;
    }
    Py_INCREF(value);
    Py_XSETREF(self->unsettled, value);
    return 0;
}

static PyObject *
Ring_get_size(Ring *self, void *closure)
{
    return PyLong_FromSsize_t(closure ? self->window : self->ring_bytes);
}

static PyGetSetDef Ring_getset[] = {
    {"unsettled", (getter)Ring_get_unsettled, (setter)Ring_set_unsettled,
     "Keys of the records put since they were last settled (a list).", NULL},
    {"ring_bytes", (getter)Ring_get_size, NULL, "The ring's size.", NULL},
    {"window", (getter)Ring_get_size, NULL, "Where records go back to the beginning.",
     (void *)1},
    {NULL},
};

static PyMethodDef Ring_methods[] = {
    {"put", (PyCFunction)(void (*)(void))Ring_put, METH_FASTCALL,
     "put(key, value) -> 0 not taken, 1 copied, 2 copied and the end is due to be published"},
    {"hold", (PyCFunction)Ring_hold, METH_O, "Hold the map (a writable buffer) until release()."},
    {"release", (PyCFunction)Ring_release, METH_NOARGS, "Release the map (before it closes)."},
    {NULL},
};

static PyMemberDef Ring_members[] = {
    {"end", T_ULONGLONG, offsetof(Ring, end), 0, "Where the next record goes (absolute)."},
    {"consumed", T_ULONGLONG, offsetof(Ring, consumed), 0, "Written up to, when last read."},
    {"sent", T_ULONGLONG, offsetof(Ring, sent), 0, "The end last published."},
    {NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "redline.data._ring.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The training side of the cache's ring (see redline.data.cache_ring).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ring_init,
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_traverse = (traverseproc)Ring_traverse,
    .tp_clear = (inquiry)Ring_clear,
    .tp_methods = Ring_methods,
    .tp_members = Ring_members,
    .tp_getset = Ring_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_ring",
    .m_doc = "The cache's per-sample hand-over in C (see redline.data.cache_ring).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__ring(void)
{
    const char *names[] = {"is_cpu", "requires_grad", "is_neg", "is_conj",
                           "dtype", "shape", "stride", "data_ptr"};
    PyObject **slots[] = {&s_is_cpu, &s_requires_grad, &s_is_neg, &s_is_conj,
                          &s_dtype, &s_shape, &s_stride, &s_data_ptr};
    for (int j = 0; j < 8; j++)
        if ((*slots[j] = PyUnicode_InternFromString(names[j])) == NULL)
            return NULL;
    if (PyType_Ready(&RingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
