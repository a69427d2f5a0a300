"""One-call check of colibri's CUDA kernels on a lent GPU: build, verify, time.

    python tools/bench/cuda_check.py            # on the GPU machine (device tool), ~3-6 min
    python tools/bench/cuda_check.py --cpu-only # here: the CPU reference path, no GPU needed

(the command line of colibri.tools.cuda_check.driver: reference.py holds the inputs, the NumPy
emulation and the checks, staged.py step 6, timing.py step 5, pycuda_build.py step 1)

Steps on the GPU machine (each timed and printed; a JSON summary goes to $OUT/cuda_check.json
when $OUT is set):
  1. PyCUDA: imported if present, else built from the carried sdist and wheels in
     build/pycuda_wheels (tools/dev/fetch_pycuda.sh; carry=["build/pycuda_wheels"]): the
     dependencies installed offline into build/pycuda_site, the sdist compiled in place in
     build/pycuda_src (parallel build_ext); the build time is reported.
  2. Kernels compiled for the device's own architecture (colibri.cuda, cubin cache).
  3. Routing on fresh random logits vs colibri._cuda_ref (float64): ids exact, weights within
     2e-5 relative, grouping (counts, segments, sorted list, pair positions, tiles) exact;
     up to 2048 tokens the single-block kernel, 5000 tokens the multi-block pair.
  4. Grouped expert FFN vs the float64 reference on the weights as stored (fp16, or int4-g128
     dequantized): relative Frobenius error < 5e-3 for both formats (fp32 accumulation, fp16
     x and h), with every output element written (outputs pre-filled with NaN).
  5. Timing with CUDA events (median of many runs after warm-up) of the grouped FFN (gate/up,
     down, combine) at 1, 16, 128 and 1024 tokens, for two expert shapes: Qwen3-30B-A3B
     (hidden 2048, expert FFN 768, 128 experts, top-8; ~64 rows per expert at 1024 tokens:
     bound by reading the weights) and Mixtral-8x7B (hidden 4096, FFN 14336, 8 experts,
     top-2; ~256 rows per expert: bound by the tensor cores); fp16 with both GEMM pipelines
     (cp.async, register prefetch; compared with each other bit for bit) and int4. Each row is
     checked against the float64 reference first (small token counts). Reported as TFLOP/s of
     useful work (6 * D * F per routed token) against the device's measured fp16 matmul rate
     (PyTorch or CuPy, same run), against the roofline (the larger of flops / matmul rate and
     weight bytes / copy bandwidth), as weight bandwidth against a measured device-to-device
     copy, and against PyTorch's eager per-expert loop on the same routing (the peer).
     Target: at 1024 tokens, fp16, >= 50% of the matmul rate; stated per shape with whether
     the roofline allows it. Then every routing variant (a warp or a thread per token, the
     single block or the multi-block pair) from 1 to 16384 tokens over 8, 128 and 256
     experts: where each one takes over (colibri.cuda.ROUTE_WARP_TOKENS, MULTI_BLOCK_TOKENS).
  6. The staged expert path (colibri.cuda_moe with a device budget of a few experts) against
     the whole pool, bit for bit, on a synthetic F16 expert file served by a real expert
     store in cache mode whose slot pool is page-locked (cuMemHostRegister): fp16 weights
     copied straight from the pinned slots, int4-g128 converted through the pinned staging
     buffer; batches of 1..40 tokens, with evictions and batch splits; the pool unpinned at
     close. (:func:`staged_check`, also run by tests/cuda/test_cuda_check_emulated.py.)

--cpu-only runs steps 3-4 with a NumPy emulation of the kernels' data flow (router output
layout, padded tiles, byte offsets in the pool, fp16 rounding of h, the ordered combine) in
place of the device, so the indexing the kernels rely on is checked on any machine.
"""

from __future__ import annotations

from colibri.tools.cuda_check.driver import gpu_main, main
from colibri.tools.cuda_check.reference import cpu_only
from colibri.tools.cuda_check.staged import staged_check

__all__ = ["cpu_only", "gpu_main", "main", "staged_check"]
