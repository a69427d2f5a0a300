/* emu_lib.cpp: colibri's CUDA kernels on the CPU (cuda_emu.h) as a shared library, one
 * launcher per kernel: emu_<kernel>(grid_x, grid_y, block_x, dynamic_smem_bytes, <the kernel's
 * parameters>).
 * tests/test_cuda_runtime_emulated.py loads it behind a stand-in `pycuda` package so that
 * colibri/cuda.py (argument packing, buffer sizes, grids, error records) runs end to end
 * without a GPU. Device pointers are host pointers here. */
#include "cuda_emu.h"

#include "../../cuda/routing.cu"
#undef CB_FILE_ID
#include "../../cuda/moe_gemm.cu"

#define EMU_LAUNCH(kernel, params, args)                                                  \
    extern "C" void emu_##kernel(unsigned gx, unsigned gy, unsigned bx, size_t smem,       \
                                 params) {                                                 \
        emu::launch(dim3(gx, gy), dim3(bx), [&] { kernel(args); }, smem);                  \
    }

#define EMU_COMMA ,
EMU_LAUNCH(cb_route_topk,
           const float *logits EMU_COMMA int n_tokens EMU_COMMA int n_experts EMU_COMMA int k
               EMU_COMMA int gating EMU_COMMA const float *bias EMU_COMMA int renorm
                   EMU_COMMA float scale EMU_COMMA int tile EMU_COMMA int cap
                       EMU_COMMA int per_warp EMU_COMMA const long long *slot_offset
                           EMU_COMMA int *topk_ids
                           EMU_COMMA float *topk_w EMU_COMMA long long *sel_offset
                               EMU_COMMA int *counts EMU_COMMA int *seg_offset
                                   EMU_COMMA int *sorted_token EMU_COMMA float *sorted_weight
                                       EMU_COMMA int *pair_pos EMU_COMMA int *tile_expert
                                           EMU_COMMA int *err,
           logits EMU_COMMA n_tokens EMU_COMMA n_experts EMU_COMMA k EMU_COMMA gating
               EMU_COMMA bias EMU_COMMA renorm EMU_COMMA scale EMU_COMMA tile EMU_COMMA cap
                   EMU_COMMA per_warp EMU_COMMA slot_offset EMU_COMMA topk_ids EMU_COMMA topk_w
                       EMU_COMMA sel_offset
                       EMU_COMMA counts EMU_COMMA seg_offset EMU_COMMA sorted_token
                           EMU_COMMA sorted_weight EMU_COMMA pair_pos EMU_COMMA tile_expert
                               EMU_COMMA err)

EMU_LAUNCH(cb_route_count,
           const float *logits EMU_COMMA int n_tokens EMU_COMMA int n_experts EMU_COMMA int k
               EMU_COMMA int gating EMU_COMMA const float *bias EMU_COMMA int renorm
                   EMU_COMMA float scale EMU_COMMA int per_warp
                       EMU_COMMA const long long *slot_offset
                       EMU_COMMA int *topk_ids EMU_COMMA float *topk_w
                           EMU_COMMA long long *sel_offset EMU_COMMA int *pair_pos
                               EMU_COMMA int *counts EMU_COMMA int *err,
           logits EMU_COMMA n_tokens EMU_COMMA n_experts EMU_COMMA k EMU_COMMA gating
               EMU_COMMA bias EMU_COMMA renorm EMU_COMMA scale EMU_COMMA per_warp
                   EMU_COMMA slot_offset EMU_COMMA topk_ids EMU_COMMA topk_w EMU_COMMA sel_offset
                       EMU_COMMA pair_pos
                       EMU_COMMA counts EMU_COMMA err)
EMU_LAUNCH(cb_route_place,
           int n_tokens EMU_COMMA int n_experts EMU_COMMA int k EMU_COMMA int tile
               EMU_COMMA int cap EMU_COMMA const int *topk_ids EMU_COMMA const float *topk_w
                   EMU_COMMA const int *counts EMU_COMMA int *seg_offset
                       EMU_COMMA int *sorted_token EMU_COMMA float *sorted_weight
                           EMU_COMMA int *pair_pos EMU_COMMA int *tile_expert EMU_COMMA int *err,
           n_tokens EMU_COMMA n_experts EMU_COMMA k EMU_COMMA tile EMU_COMMA cap
               EMU_COMMA topk_ids EMU_COMMA topk_w EMU_COMMA counts EMU_COMMA seg_offset
                   EMU_COMMA sorted_token EMU_COMMA sorted_weight EMU_COMMA pair_pos
                       EMU_COMMA tile_expert EMU_COMMA err)

#define EMU_GEMM(kernel) EMU_LAUNCH(kernel, CB_MOE_GEMM_PARAMS, CB_MOE_GEMM_ARGS)
EMU_GEMM(cb_moe_gate_up_f16_m16)
EMU_GEMM(cb_moe_gate_up_f16_m64)
EMU_GEMM(cb_moe_gate_up_i4_m16)
EMU_GEMM(cb_moe_gate_up_i4_m64)
EMU_GEMM(cb_moe_down_f16_m16)
EMU_GEMM(cb_moe_down_f16_m64)
EMU_GEMM(cb_moe_down_i4_m16)
EMU_GEMM(cb_moe_down_i4_m64)
EMU_GEMM(cb_moe_gate_up_f16_m16_cp)
EMU_GEMM(cb_moe_gate_up_f16_m64_cp)
EMU_GEMM(cb_moe_down_f16_m16_cp)
EMU_GEMM(cb_moe_down_f16_m64_cp)

EMU_LAUNCH(cb_moe_combine,
           const float *z EMU_COMMA const int *pair_pos EMU_COMMA int n_tokens EMU_COMMA int k
               EMU_COMMA int D EMU_COMMA float *out EMU_COMMA int *err,
           z EMU_COMMA pair_pos EMU_COMMA n_tokens EMU_COMMA k EMU_COMMA D EMU_COMMA out
               EMU_COMMA err)
