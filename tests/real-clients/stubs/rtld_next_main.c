// Looks a function up in a library it opened itself (dlopen, dlsym on the handle), then prints
// through puts, which an interposer may wrap (rtld_next_interposer.c).
#include <stdio.h>
#include <dlfcn.h>
int main(void) {
  void *h = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
  double (*c)(double) = (double (*)(double))dlsym(h, "cos");
  puts(c && c(0.0) == 1.0 ? "cos ok" : "cos bad");
  return 0;
}
