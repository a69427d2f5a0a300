from colibri._core.status cimport cb_status

cdef extern from "colibri/mapguard.h" nogil:
    int CB_MAPGUARD_MAX
    cb_status cb_mapguard_install()
    cb_status cb_mapguard_register(const void *base, size_t len, const char *path, int *out_id)
    void cb_mapguard_unregister(int id)
    int cb_mapguard_count()
    size_t cb_mapguard_message(const void *addr, char *buf, size_t cap)
