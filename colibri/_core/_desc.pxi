"""The model description (include/colibri/forward.h) as Python objects that hold the C structs.

CModelDesc and CLayerDesc each own one cb_model_desc_t / cb_layer_desc_t. Their fields are
written once, in forward.h's field tables (the CB_*_DESC_FIELDS X-macros); cb_desc_fields gives
each field's name, offset and kind, and attribute assignment (`desc.n_embd = 64`,
`layer.wq = Mat(...)`) writes the struct member of that name, checked by kind. Reading an
attribute gives back the value that was set (arrays and matrices stay alive through it). Other
attributes (colibri.arch's `layers`, `arch`, `experts`, ...) are plain Python attributes of the
subclasses. Forward copies the structs as they are (the layers into one array): no field is
copied by name anywhere."""

import operator

from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset

from colibri._core.quant cimport cb_matrix_t
from colibri._core.forward cimport (
    cb_desc_field_t, cb_desc_fields, cb_layer_desc_t, cb_model_desc_t,
    CB_DESC_I32, CB_DESC_I64, CB_DESC_F32, CB_DESC_ENUM, CB_DESC_VEC, CB_DESC_MAT,
)

import numpy as np

cdef extern from "Python.h":
    int PyObject_GenericSetAttr(object o, object name, object value) except -1


cdef uintptr_t _addr(object arr, object dtype, str what) except? 0:
    """Address of a C-contiguous numpy array of dtype (None -> 0)."""
    if arr is None:
        return 0
    if not isinstance(arr, np.ndarray) or arr.dtype != dtype or not arr.flags.c_contiguous:
        raise ValueError(f"{what}: expected a contiguous {np.dtype(dtype).name} array")
    if arr.ctypes.data % np.dtype(dtype).itemsize:
        raise ValueError(f"{what}: misaligned data")
    return <uintptr_t>arr.ctypes.data


cdef int _mat(cb_matrix_t *m, object M, str what) except -1:
    """A matrix (colibri.arch.Mat: type, rows, cols, row_bytes, data) into m; None: absent."""
    memset(m, 0, sizeof(cb_matrix_t))
    if M is None:
        return 0
    m.type = M.type
    m.rows = M.rows
    m.cols = M.cols
    m.row_bytes = M.row_bytes
    m.data = <const void *>_addr(M.data, np.uint8, what) if M.data is not None else NULL
    return 0


cdef inline const float *_vec(object v, str what) except? NULL:
    return <const float *>_addr(v, np.float32, what)


_DESC_KINDS = {CB_DESC_I32: "i32", CB_DESC_I64: "i64", CB_DESC_F32: "f32",
               CB_DESC_ENUM: "enum", CB_DESC_VEC: "vec", CB_DESC_MAT: "mat"}


cdef dict _field_table(int layer):
    """name -> (offset, kind) of forward.h's table for the model (0) or a layer (1)."""
    cdef const cb_desc_field_t *f = NULL
    cdef int32_t n = cb_desc_fields(layer, &f)
    return {f[i].name.decode("ascii"): (f[i].offset, f[i].kind) for i in range(n)}


_MODEL_FIELDS = _field_table(0)
_LAYER_FIELDS = _field_table(1)
_DEFAULTS = {CB_DESC_I32: 0, CB_DESC_I64: 0, CB_DESC_F32: 0.0, CB_DESC_ENUM: 0,
             CB_DESC_VEC: None, CB_DESC_MAT: None}


def desc_fields(layer=False):
    """[(name, kind, offset)] of forward.h's field table of cb_layer_desc_t (layer=True) or
    cb_model_desc_t, in declaration order; kind is "i32", "i64", "f32", "enum", "vec" or "mat"."""
    t = _LAYER_FIELDS if layer else _MODEL_FIELDS
    return [(name, _DESC_KINDS[kind], off) for name, (off, kind) in t.items()]


def desc_struct_size(layer=False):
    """sizeof(cb_layer_desc_t) or sizeof(cb_model_desc_t) (tests check the table covers it)."""
    return sizeof(cb_layer_desc_t) if layer else sizeof(cb_model_desc_t)


cdef class _CDesc:
    """One description struct, filled by field name (see the module doc)."""
    cdef char *c
    cdef dict _fields
    cdef dict _values

    def __dealloc__(self):
        free(self.c)
        self.c = NULL

    cdef int _alloc(self, size_t size, dict fields) except -1:
        self.c = <char *>calloc(1, size)
        if self.c == NULL:
            raise MemoryError("no memory for a model description")
        self._fields, self._values = fields, {}
        return 0

    def __setattr__(self, str name, value):
        spec = self._fields.get(name)
        if spec is None:
            PyObject_GenericSetAttr(self, name, value)  # a subclass's own attribute
            return
        cdef size_t off = spec[0]
        cdef int kind = spec[1]
        cdef char *p = self.c + off
        if kind == CB_DESC_I32 or kind == CB_DESC_ENUM:
            v = operator.index(value)
            if not -2**31 <= v < 2**31:
                raise ValueError(f"{name} = {v} does not fit in int32")
            if kind == CB_DESC_I32:
                (<int32_t *>p)[0] = <int32_t>v
            else:
                (<int *>p)[0] = <int>v
        elif kind == CB_DESC_I64:
            v = operator.index(value)
            if not -2**63 <= v < 2**63:
                raise ValueError(f"{name} = {v} does not fit in int64")
            (<int64_t *>p)[0] = <int64_t>v
        elif kind == CB_DESC_F32:
            (<float *>p)[0] = <float>float(value)
        elif kind == CB_DESC_VEC:
            (<const float **>p)[0] = _vec(value, name)
        elif kind == CB_DESC_MAT:
            _mat(<cb_matrix_t *>p, value, name)
        else:
            raise AssertionError(f"field {name}: unknown kind {kind}")
        self._values[name] = value

    def __getattr__(self, str name):
        spec = self._fields.get(name) if self._fields is not None else None
        if spec is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self._values.get(name, _DEFAULTS[spec[1]])

    def c_fields(self):
        """{name: value} of every field of the struct, in the table's order."""
        return {name: getattr(self, name) for name in self._fields}

    def __copy__(self):
        cls = type(self)
        new = cls.__new__(cls)
        for name, value in self._values.items():
            setattr(new, name, value)
        extra = getattr(self, "__dict__", None)
        if extra:
            new.__dict__.update(extra)
        return new

    def replace(self, **changes):
        """A copy with the given attributes (struct fields or not) changed."""
        new = self.__copy__()
        for name, value in changes.items():
            setattr(new, name, value)
        return new


cdef class CLayerDesc(_CDesc):
    """A cb_layer_desc_t (forward.h), filled by field name."""

    def __cinit__(self, *args, **kwargs):
        self._alloc(sizeof(cb_layer_desc_t), _LAYER_FIELDS)


cdef class CModelDesc(_CDesc):
    """A cb_model_desc_t (forward.h) without its layer table, filled by field name; Forward
    joins it with the layers' structs."""

    def __cinit__(self, *args, **kwargs):
        self._alloc(sizeof(cb_model_desc_t), _MODEL_FIELDS)
