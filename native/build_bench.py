"""cffi build script for pycxl._bench: the measurement loops (bench.c), the threaded
copy of staged GPU transfers (copy.c), the paced loads of loaded latency (loaded.c) and
the allocators of GPU-addressable memory on a tier (tier.c, whose exported functions
PyTorch loads from this module's file as a pluggable allocator) and the fused CPU Adam
step over state on a tier (adam.c),
in API mode, compiled at install time.

No -march flag: the build must run on any CPU of the architecture; bench.c picks wide
vector code at run time (target_clones, AVX checks).
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

ffibuilder = FFI()
ffibuilder.cdef(
    """
    void *chase_build_start(char *buf, size_t n_lines, size_t stride, size_t group,
                            uint64_t seed, int *err);
    int chase_build_step(void *builder, uint64_t budget_ns);
    void chase_build_end(void *builder);
    uint64_t chase_run(void **cursor, uint64_t loads);
    int stream_has_nt(void);
    void *stream_start(int nthreads, const int *cpus, int *err);
    size_t stream_steps(void *team, const int *kernels, int nkernels, double *a, double *b,
                        double *c, size_t n, double s, int nt, size_t first, size_t nsteps,
                        uint64_t budget_ns, uint64_t *times);
    void stream_end(void *team);
    size_t first_touch(char *buf, size_t npages, size_t page, uint32_t *ns, uint64_t budget_ns,
                       uint64_t *total_ns);
    uint64_t timer_cost_ns(void);
    void *copy_pool_create(int nthreads, const int *cpus);
    void copy_pool_destroy(void *pool);
    int copy_stream_start(void *pool, char *host, char *const *bufs, int depth, size_t size,
                          size_t chunk, int to_host, int nt, size_t open);
    void copy_stream_open(void *pool, size_t chunks);
    void copy_stream_wait(void *pool, size_t c);
    void copy_stream_end(void *pool, int abort);
    int load_mix_streams(int mix);
    int load_mix_traffic(int mix);
    int load_has_nt(void);
    void *load_start(char *buf, size_t slice, int nthreads, const int *cpus, int mix,
                     double bytes_per_s, int *err);
    uint64_t load_moved(void *handle);
    void load_stop(void *handle);
    size_t chase_windows(void **cursor, uint64_t loads, uint64_t duration_ns, uint32_t *win_ns,
                         size_t max_windows);
    int tier_open(int slot, int node, const int *devices, int ndevices, int mode, char *err,
                  size_t errlen);
    int tier_registered(int slot);
    int tier_spill_to(int slot, size_t headroom);
    int tier_prefer(int slot);
    int tier_stats(int slot, uint64_t *out, char *error, size_t errlen);
    uint64_t tier_alloc(int slot, size_t size, void *stream);
    void tier_free(uint64_t ptr, void *stream);
    int tier_trim(int slot);
    int tier_use(int device, int64_t *out);
    int tier_use_reset(int device, int what);
    int64_t tier_spilled_rise(int device);
    int tier_kind(int kind);
    int tier_hbm_reserved(int device, uint64_t *now, uint64_t *high);
    int tier_spill_mapped(uint64_t *now, uint64_t *high);
    int tier_owns(uint64_t p);
    uint64_t tier_hbm_room(int device, int settle);
    void tier_log(int on);
    extern "Python" void tier_spilled(int slot, size_t size);
    void *adam_team_start(int nthreads, const int *cpus, int *err);
    void adam_team_end(void *team);
    int adam_step(void *team, size_t n, float *master, float *m, float *v, float *vmax,
                  const void *grad, int grad_kind, void *weight, int weight_kind, double lr,
                  double beta1, double beta2, double eps, double weight_decay, int decoupled,
                  int maximize, int64_t step, double grad_scale);
    int grad_accumulate(void *team, size_t n, void *home, const void *incoming, int kind,
                        int add, double *sumsq);
    """
)
ffibuilder.set_source(
    "pycxl._bench",
    "\n".join(
        (HERE / name).read_text() for name in ("bench.c", "copy.c", "loaded.c", "tier.c", "adam.c")
    ),
    include_dirs=[str(HERE)],  # pinned_thread.h, thread_team.h
    extra_compile_args=["-O3", "-fno-strict-aliasing", "-fno-math-errno", "-pthread"],
    extra_link_args=["-pthread", "-ldl"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
