"""The one timing rule of the GPU lane's PyTorch checks: a warm-up call (compilation, caches),
then the mean of `reps` calls between two device synchronizations, in milliseconds."""
import time


def timed(fn, reps=10):
    import torch  # the caller's own, already imported; kept out of import time here

    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        out = fn()
    torch.cuda.synchronize()
    return out, (time.perf_counter() - t) * 1000 / reps
