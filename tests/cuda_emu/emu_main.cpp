/* emu_main.cpp: run colibri's CUDA kernels (cuda/routing.cu, cuda/moe_gemm.cu) on the CPU
 * through cuda_emu.h, on inputs written by tests/test_cuda_emulated.py as raw files, and write
 * the outputs back as raw files. Every buffer is allocated at exactly the size the kernels
 * are documented to use, so ASan reports any access outside it; outputs start poisoned
 * (NaN for floats, 0x7f7f7f7f for integers) so unwritten elements show.
 *
 *   emu route DIR n_tokens n_experts k gating renorm scale tile has_bias has_slot [blocks
 *             [per_warp]]
 *       blocks > 0: the multi-block pair (cb_route_count, then cb_route_place over `blocks`
 *       blocks of 256 threads) instead of cb_route_topk; per_warp (default 1): phase 1 a warp
 *       per token (where n_experts allows), 0: a thread per token;
 *       reads logits.bin [bias.bin] [slot.bin]; writes topk_ids.bin topk_w.bin sel_offset.bin
 *       counts.bin seg_offset.bin sorted_token.bin sorted_weight.bin pair_pos.bin
 *       tile_expert.bin err.bin (cap from routing_capacity, computed here the same way)
 *   emu moe DIR n_tokens n_experts k D F int4 act tile cap pool_bytes [smem_gate_up smem_down]
 *       with the two dynamic shared memory sizes: the fp16 "_cp" kernels (cp.async pipeline);
 *       reads x.bin pool.bin offsets.bin sorted_token.bin sorted_weight.bin tile_expert.bin
 *       pair_pos.bin; writes h.bin z.bin out.bin err.bin
 */
#include "cuda_emu.h"

#include "../../cuda/routing.cu"
#undef CB_FILE_ID
#include "../../cuda/moe_gemm.cu"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

namespace {

template <class T>
std::vector<T> read_file(const std::string &path, size_t n) {
    std::vector<T> v(n);
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) emu::die(("cannot open " + path).c_str());
    if (std::fread(v.data(), sizeof(T), n, f) != n) emu::die(("short file " + path).c_str());
    std::fclose(f);
    return v;
}

template <class T>
void write_file(const std::string &path, const std::vector<T> &v) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(v.data(), sizeof(T), v.size(), f) != v.size()) emu::die("write failed");
    std::fclose(f);
}

/* Unwritten outputs must show: all-ones bytes are NaN for float and fp16, 0x7f7f7f7f (an
 * impossible index) for integers. */
template <class T>
std::vector<T> poisoned(size_t n) {
    std::vector<T> v(n);
    const int byte = std::is_floating_point<T>::value || std::is_same<T, __half>::value ? 0xff : 0x7f;
    std::memset(static_cast<void *>(v.data()), byte, n * sizeof(T));
    return v;
}

int route(const std::string &dir, char **a, int na) {
    const int n_tokens = std::atoi(a[0]), n_experts = std::atoi(a[1]), k = std::atoi(a[2]);
    const int gating = std::atoi(a[3]), renorm = std::atoi(a[4]);
    const float scale = std::strtof(a[5], nullptr);
    const int tile = std::atoi(a[6]), has_bias = std::atoi(a[7]), has_slot = std::atoi(a[8]);
    const int blocks = na > 9 ? std::atoi(a[9]) : 0;
    const int per_warp =
        (na > 10 ? std::atoi(a[10]) : 1) && n_experts <= CB_ROUTE_WARP_MAX_EXPERTS;
    const long pairs = (long)n_tokens * k;
    long cap = pairs + std::min<long>(n_experts, pairs) * (tile - 1);
    cap = std::max<long>(tile, (cap + tile - 1) / tile * tile);
    auto logits = read_file<float>(dir + "/logits.bin", (size_t)n_tokens * n_experts);
    std::vector<float> bias;
    std::vector<long long> slot;
    if (has_bias) bias = read_file<float>(dir + "/bias.bin", n_experts);
    if (has_slot) slot = read_file<long long>(dir + "/slot.bin", n_experts);
    auto ids = poisoned<int>(pairs);
    auto w = poisoned<float>(pairs);
    auto sel = poisoned<long long>(pairs);
    auto counts = poisoned<int>(n_experts);
    auto seg = poisoned<int>(n_experts + 1);
    auto stok = poisoned<int>(cap);
    auto sw = poisoned<float>(cap);
    auto pp = poisoned<int>(pairs);
    auto te = poisoned<int>(cap / tile);
    std::vector<int> err(4, 0);
    if (blocks > 0) {
        std::fill(counts.begin(), counts.end(), 0); /* the caller zeroes counts */
        const int per_block = per_warp ? 256 / 32 : 256; /* tokens a block of 256 routes */
        emu::launch(dim3((n_tokens + per_block - 1) / per_block), dim3(256), [&] {
            cb_route_count(logits.data(), n_tokens, n_experts, k, gating,
                           has_bias ? bias.data() : nullptr, renorm, scale, per_warp,
                           has_slot ? slot.data() : nullptr, ids.data(), w.data(), sel.data(),
                           pp.data(), counts.data(), err.data());
        });
        emu::launch(dim3(blocks), dim3(256), [&] {
            cb_route_place(n_tokens, n_experts, k, tile, (int)cap, ids.data(), w.data(),
                           counts.data(), seg.data(), stok.data(), sw.data(), pp.data(),
                           te.data(), err.data());
        });
    } else {
        emu::launch(dim3(1), dim3(1024), [&] {
            cb_route_topk(logits.data(), n_tokens, n_experts, k, gating,
                          has_bias ? bias.data() : nullptr, renorm, scale, tile, (int)cap,
                          per_warp, has_slot ? slot.data() : nullptr, ids.data(), w.data(),
                          sel.data(),
                          counts.data(), seg.data(), stok.data(), sw.data(), pp.data(),
                          te.data(), err.data());
        });
    }
    write_file(dir + "/topk_ids.bin", ids);
    write_file(dir + "/topk_w.bin", w);
    write_file(dir + "/sel_offset.bin", sel);
    write_file(dir + "/counts.bin", counts);
    write_file(dir + "/seg_offset.bin", seg);
    write_file(dir + "/sorted_token.bin", stok);
    write_file(dir + "/sorted_weight.bin", sw);
    write_file(dir + "/pair_pos.bin", pp);
    write_file(dir + "/tile_expert.bin", te);
    write_file(dir + "/err.bin", err);
    return 0;
}

int moe(const std::string &dir, char **a, int argc) {
    const int n_tokens = std::atoi(a[0]), n_experts = std::atoi(a[1]), k = std::atoi(a[2]);
    const int D = std::atoi(a[3]), F = std::atoi(a[4]), int4 = std::atoi(a[5]);
    const int act = std::atoi(a[6]), tile = std::atoi(a[7]), cap = std::atoi(a[8]);
    const long pool_bytes = std::atol(a[9]);
    const bool cp = argc >= 12;
    const size_t smem_gu = cp ? std::strtoul(a[10], nullptr, 10) : 0;
    const size_t smem_dn = cp ? std::strtoul(a[11], nullptr, 10) : 0;
    if (cp && int4) {
        std::fprintf(stderr, "the cp.async kernels are fp16 only\n");
        return 2;
    }
    auto x = read_file<__half>(dir + "/x.bin", (size_t)n_tokens * D);
    auto pool = read_file<unsigned char>(dir + "/pool.bin", pool_bytes);
    auto off = read_file<long long>(dir + "/offsets.bin", n_experts);
    auto stok = read_file<int>(dir + "/sorted_token.bin", cap);
    auto sw = read_file<float>(dir + "/sorted_weight.bin", cap);
    auto te = read_file<int>(dir + "/tile_expert.bin", cap / tile);
    auto pp = read_file<int>(dir + "/pair_pos.bin", (size_t)n_tokens * k);
    auto h = poisoned<__half>((size_t)cap * F);
    auto z = poisoned<float>((size_t)cap * D);
    auto out = poisoned<float>((size_t)n_tokens * D);
    std::vector<int> err(4, 0);
    const int bn = tile == 16 ? 64 : 128, threads = tile == 16 ? 128 : 256;
    const dim3 blk(threads);
    auto gate_up = cp ? (tile == 16 ? cb_moe_gate_up_f16_m16_cp : cb_moe_gate_up_f16_m64_cp)
                 : tile == 16 ? (int4 ? cb_moe_gate_up_i4_m16 : cb_moe_gate_up_f16_m16)
                              : (int4 ? cb_moe_gate_up_i4_m64 : cb_moe_gate_up_f16_m64);
    auto down = cp ? (tile == 16 ? cb_moe_down_f16_m16_cp : cb_moe_down_f16_m64_cp)
              : tile == 16 ? (int4 ? cb_moe_down_i4_m16 : cb_moe_down_f16_m16)
                           : (int4 ? cb_moe_down_i4_m64 : cb_moe_down_f16_m64);
    emu::launch(dim3(cap / tile, (F + bn - 1) / bn), blk, [&] {
        gate_up(x.data(), stok.data(), sw.data(), te.data(), pool.data(), off.data(), n_experts,
                D, F, act, h.data(), nullptr, err.data());
    }, smem_gu);
    emu::launch(dim3(cap / tile, (D + bn - 1) / bn), blk, [&] {
        down(h.data(), stok.data(), sw.data(), te.data(), pool.data(), off.data(), n_experts, F,
             D, act, nullptr, z.data(), err.data());
    }, smem_dn);
    emu::launch(dim3(n_tokens), dim3(256), [&] {
        cb_moe_combine(z.data(), pp.data(), n_tokens, k, D, out.data(), err.data());
    });
    write_file(dir + "/h.bin", h);
    write_file(dir + "/z.bin", z);
    write_file(dir + "/out.bin", out);
    write_file(dir + "/err.bin", err);
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc >= 12 && std::strcmp(argv[1], "route") == 0) return route(argv[2], argv + 3, argc - 3);
    if (argc >= 13 && std::strcmp(argv[1], "moe") == 0) return moe(argv[2], argv + 3, argc - 3);
    std::fprintf(stderr, "usage: see the top of emu_main.cpp\n");
    return 2;
}
