/* Does this QEMU survive an FPU-state save that spans a RAM page and a CXL page above
 * it?  QEMU 10.0 under TCG does not: the host process segfaults (docs/testbed.md).
 *
 * usage: qemu_fpu_straddle LOWNODE HIGHNODE xsave|signal
 *   xsave:  FXSAVE from user space onto the two pages (what ld.so's lazy binding does)
 *   signal: a signal frame on an alternate stack over the two pages (the kernel's XSAVE)
 * Prints the nodes the pages are on and "survived"; a crash never prints the last line.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MPOL_BIND 2
#define MPOL_F_NODE 1
#define MPOL_F_ADDR 2
#define MPOL_MF_STRICT 1
#define PAGE 4096

static volatile sig_atomic_t handled;

static void on_usr1(int sig) { (void)sig; handled = 1; }

static int node_of(void *p)
{
    int node = -1;
    if (syscall(SYS_get_mempolicy, &node, NULL, 0, p, MPOL_F_NODE | MPOL_F_ADDR) != 0)
        return -1;
    return node;
}

static void bind_page(char *p, int node)
{
    unsigned long mask = 1UL << node;
    if (syscall(SYS_mbind, p, PAGE, MPOL_BIND, &mask, 64, MPOL_MF_STRICT) != 0) {
        perror("mbind");
        exit(2);
    }
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s LOWNODE HIGHNODE xsave|signal\n", argv[0]);
        return 2;
    }
    int low = atoi(argv[1]), high = atoi(argv[2]);
    char *p = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    bind_page(p, low);
    bind_page(p + PAGE, high);
    memset(p, 0, 2 * PAGE);
    printf("%s: pages on nodes %d (low) and %d (high)\n", argv[3], node_of(p), node_of(p + PAGE));
    fflush(stdout);
    if (strcmp(argv[3], "xsave") == 0) {
        /* 512 bytes from 256 below the page boundary */
        __asm__ volatile("fxsave64 (%0)" : : "r"(p + PAGE - 256) : "memory");
    } else {
        /* the frame goes at the top of the alternate stack, 512 bytes into the high page */
        stack_t ss = {.ss_sp = p, .ss_size = PAGE + 512, .ss_flags = 0};
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr1;
        sa.sa_flags = SA_ONSTACK;
        if (sigaltstack(&ss, NULL) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0) {
            perror("sigaltstack");
            return 2;
        }
        raise(SIGUSR1);
        if (!handled)
            return 1;
    }
    printf("%s: survived\n", argv[3]);
    return 0;
}
