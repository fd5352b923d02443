/* Which instruction-set build of the op library (__init__.py's SOURCES) this
 * CPU and its OS can run.  Built without ISA flags, so it runs anywhere.
 * libgcc's feature check also asks the OS (XGETBV) whether it saves the wider
 * registers. */

/* 2: AVX-512F, 1: AVX2, 0: neither (the architecture's baseline). */
int bp_isa_level(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return 2;
    if (__builtin_cpu_supports("avx2"))
        return 1;
#endif
    return 0;
}
