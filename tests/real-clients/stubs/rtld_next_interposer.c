// An LD_PRELOAD interposer of the usual kind: its puts finds the next one with
// dlsym(RTLD_NEXT), which must skip this library whatever else defines dlsym (gpufuse's NVRTC
// interposer does: test_nvrtc.py's test_the_dlsym_hook_keeps_rtld_next).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int puts(const char *s) {
  int (*real)(const char *) = (int (*)(const char *))dlsym(RTLD_NEXT, "puts");
  if (real == puts) { fprintf(stderr, "RTLD_NEXT gave my own puts\n"); return -1; }
  fputs("[wrapped] ", stdout);
  return real(s);
}
