// The other translation unit of rdc_main.cu.
__device__ int scale(int x) { return 3 * x + 1; }
