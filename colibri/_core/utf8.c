/* UTF-8 validation and WHATWG-style repair (see include/colibri/tokenizer.h).
 *
 * One decoder, cb_utf8_next(), classifies the sequence at the start of a buffer by the table of
 * well-formed byte sequences (Unicode 15, table 3-7): it never reads past the n bytes it is given.
 * On an ill-formed sequence it reports the length of the "maximal subpart" (the longest prefix that
 * could start a well-formed sequence), which is what the WHATWG decoder (and Python's
 * bytes.decode('utf-8', 'replace')) replaces by one U+FFFD before resuming at the next byte.
 * No allocation happens here except the output of cb_utf8_sanitize, owned by the caller.
 */
#include "colibri/tokenizer.h"

#include "alloc.h"

#include <stdlib.h>
#include <string.h>

int cb_utf8_next(const uint8_t *s, size_t n, uint32_t *cp, int *truncated) {
    *truncated = 0;
    if (n == 0) {
        return 0;
    }
    const uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    int need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t c;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
        c = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        c = b0 & 0x0F;
        if (b0 == 0xE0) lo = 0xA0;      /* no overlongs */
        else if (b0 == 0xED) hi = 0x9F; /* no surrogates */
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        c = b0 & 0x07;
        if (b0 == 0xF0) lo = 0x90;      /* no overlongs */
        else if (b0 == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        return -1; /* 80..C1 (continuation or overlong lead), F5..FF: never valid */
    }
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) {
            *truncated = 1; /* a valid prefix cut by the end of the input */
            return -i;
        }
        const uint8_t b = s[i];
        const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            return -i;
        }
        c = (c << 6) | (b & 0x3F);
    }
    *cp = c;
    return need + 1;
}

/* Length of the ASCII prefix, eight bytes at a time. */
static size_t ascii_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i + 8 <= n) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull) {
            break;
        }
        i += 8;
    }
    while (i < n && s[i] < 0x80) {
        i++;
    }
    return i;
}

cb_status cb_utf8_validate(const uint8_t *s, size_t n, size_t *bad_offset) {
    if (n && !s) {
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "utf8: NULL text with length %zu", n);
    }
    size_t i = 0;
    while (i < n) {
        i += ascii_prefix(s + i, n - i);
        if (i >= n) {
            break;
        }
        uint32_t cp;
        int trunc;
        const int k = cb_utf8_next(s + i, n - i, &cp, &trunc);
        if (k <= 0) {
            if (bad_offset) {
                *bad_offset = i;
            }
            return cb_fail(CB_STATUS_CORRUPT, "invalid UTF-8 at byte offset %zu (byte 0x%02X%s)", i,
                           s[i], trunc ? ", sequence truncated by the end of the text" : "");
        }
        i += (size_t)k;
    }
    return CB_OK;
}

size_t cb_utf8_sanitize_into(const uint8_t *s, size_t n, uint8_t *out, size_t *n_replaced) {
    size_t i = 0, o = 0, rep = 0;
    while (i < n) {
        const size_t a = ascii_prefix(s + i, n - i);
        memcpy(out + o, s + i, a);
        i += a;
        o += a;
        if (i >= n) {
            break;
        }
        uint32_t cp;
        int trunc;
        const int k = cb_utf8_next(s + i, n - i, &cp, &trunc);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            out[o++] = 0xEF; /* U+FFFD */
            out[o++] = 0xBF;
            out[o++] = 0xBD;
            i += (size_t)(-k);
            rep++;
        }
    }
    if (n_replaced) {
        *n_replaced = rep;
    }
    return o;
}

cb_status cb_utf8_sanitize(const uint8_t *s, size_t n, uint8_t **out, size_t *out_len,
                           size_t *n_replaced) {
    if (!out || !out_len || (n && !s)) {
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "utf8_sanitize: NULL argument (length %zu)", n);
    }
    *out = NULL;
    *out_len = 0;
    if (n > (SIZE_MAX - 1) / 3) {
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "utf8_sanitize: text of %zu bytes too large", n);
    }
    /* each replaced byte grows to at most 3 bytes */
    uint8_t *buf = cb_malloc(n * 3 + 1);
    if (!buf) {
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "utf8_sanitize: cannot allocate %zu bytes", n * 3 + 1);
    }
    *out_len = cb_utf8_sanitize_into(s, n, buf, n_replaced);
    *out = buf;
    return CB_OK;
}
