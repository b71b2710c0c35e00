// The other translation unit of rdc_main.cu: a device function and a device variable that
// rdc_main.cu's kernel and host code use.
__device__ int scale(int x) { return 3 * x + 1; }
__device__ int bias = 5;
