/* libnuma declarations used by pycxl (libnuma.so.1). */
int numa_available(void);
int numa_max_node(void);
int numa_num_configured_nodes(void);
long long numa_node_size64(int node, long long *freep);
int numa_distance(int a, int b);
int numa_preferred(void);
