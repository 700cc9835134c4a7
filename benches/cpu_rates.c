// The throughput of the AVX2 instructions the kernels are made of, on this machine: how many
// nanoseconds one costs when eight independent ones are in flight (so latency does not count).
// Machines differ between sessions; what is cheap on one (a 256-bit integer multiply on Zen 3)
// is the bottleneck on another (Zen 1 splits 256-bit operations in two and multiplies bytes on
// one 128-bit pipe). Run it before tuning a kernel:
//
//   gcc -O2 benches/cpu_rates.c -o /tmp/cpu_rates && /tmp/cpu_rates
//
// Pairs ("a + b") show whether two instructions share an execution port: if they do, the pair
// costs the sum of the two; if not, about the larger.
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int32_t mem[16] __attribute__((aligned(64)));

// Eight instructions a loop iteration, writing eight different registers from the same sources.
#define EIGHT(A, B) A "%%ymm0\n" B "%%ymm1\n" A "%%ymm2\n" B "%%ymm3\n" A "%%ymm4\n" B "%%ymm5\n" A "%%ymm6\n" B "%%ymm7\n"
#define RATE(NAME, A, B)                                                                              \
    {                                                                                                 \
        long n = 50000000;                                                                            \
        double t = now();                                                                             \
        for (long i = 0; i < n; i++)                                                                  \
            __asm__ volatile(EIGHT(A, B)::"r"(mem) : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7"); \
        printf("%-28s %.2f ns each\n", NAME, (now() - t) / n / 8 * 1e9);                             \
    }

#define MADDUBS "vpmaddubsw %%ymm15,%%ymm14,"
#define MADDWD "vpmaddwd %%ymm15,%%ymm14,"
#define SIGN "vpsignb %%ymm15,%%ymm14,"
#define PSHUFB "vpshufb %%ymm15,%%ymm14,"
#define PADDD "vpaddd %%ymm15,%%ymm14,"
#define PAND "vpand %%ymm15,%%ymm14,"
#define SHIFT "vpsrlw $4,%%ymm15,"
#define FMA "vfmadd231ps %%ymm15,%%ymm14,"
#define CVT "vcvtdq2ps %%ymm15,"
#define PERM2 "vperm2i128 $0x20,%%ymm15,%%ymm14,"
#define PERMPS "vpermps %%ymm15,%%ymm14,"
#define SHUFPS "vshufps $0x50,%%ymm15,%%ymm14,"
#define INSERT "vinserti128 $1,%%xmm15,%%ymm14,"
#define BCAST "vpbroadcastd (%0),"
#define LOAD "vmovdqu (%0),"

int main(void) {
    RATE("vpmaddubsw", MADDUBS, MADDUBS)
    RATE("vpmaddwd", MADDWD, MADDWD)
    RATE("vpsignb", SIGN, SIGN)
    RATE("vpshufb", PSHUFB, PSHUFB)
    RATE("vpaddd", PADDD, PADDD)
    RATE("vpand", PAND, PAND)
    RATE("vpsrlw", SHIFT, SHIFT)
    RATE("vfmadd231ps", FMA, FMA)
    RATE("vcvtdq2ps", CVT, CVT)
    RATE("vperm2i128", PERM2, PERM2)
    RATE("vpermps", PERMPS, PERMPS)
    RATE("vshufps", SHUFPS, SHUFPS)
    RATE("vinserti128", INSERT, INSERT)
    RATE("vpbroadcastd m32", BCAST, BCAST)
    RATE("vmovdqu m256", LOAD, LOAD)
    RATE("vpmaddubsw + vpmaddwd", MADDUBS, MADDWD)
    RATE("vpmaddubsw + vpsignb", MADDUBS, SIGN)
    RATE("vpmaddubsw + vcvtdq2ps", MADDUBS, CVT)
    RATE("vpmaddubsw + vpsrlw", MADDUBS, SHIFT)
    RATE("vcvtdq2ps + vfmadd231ps", CVT, FMA)
    return 0;
}
