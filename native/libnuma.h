/* libnuma declarations used by pycxl (libnuma.so.1). */
int numa_available(void);
int numa_max_node(void);
int numa_num_configured_nodes(void);
long long numa_node_size64(int node, long long *freep);
int numa_distance(int a, int b);
int numa_preferred(void);
/* numaif.h: the memory-policy system calls, as libnuma wraps them (errno on failure). */
long get_mempolicy(int *mode, unsigned long *nmask, unsigned long maxnode, void *addr,
                   unsigned flags);
long set_mempolicy(int mode, const unsigned long *nmask, unsigned long maxnode);
long mbind(void *start, unsigned long len, int mode, const unsigned long *nmask,
           unsigned long maxnode, unsigned flags);
long move_pages(int pid, unsigned long count, void **pages, const int *nodes, int *status,
                int flags);
