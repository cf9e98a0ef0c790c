"""What a page fault costs on this machine, and how many pages an MLX array faults again after a free.

Two measurements behind HISTORY stop 39; prints figures, asserts nothing.

1. Fresh anonymous memory touched page by page, CHUNK_MB at a time (`mmap`, one byte a page): the
   faults and microseconds per fault of each chunk. On the 2-vCPU Firecracker VM of rounds 13-15 the
   first ~2 GB cost 1.5-1.7 us a fault and everything beyond 12.5-13 us: pages the host still backs
   are cheap, the rest dear; run it twice in a row, then again after 20 s, to see freed pages go
   back to the host. On a machine that keeps its pages every chunk costs about the same.
2. 56 MLX arrays (one per layer's keys or values of Qwen3-0.6B) of 1 MB, then of 2.3 MB (a batch of
   two at 280 tokens), allocated again after each free: the minor faults each time. MLX's CPU
   allocator calls malloc for every buffer and keeps no cache, so what faults is glibc's doing.

    python3 benchmarks/page_faults.py [--chunks 8] [--chunk-mb 512]
"""
import argparse
import mmap
import resource
import time

PAGE = 4096


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def touch_chunks(chunks: int, chunk_mb: int) -> None:
    held = []  # kept mapped, so every chunk is memory the process has not used before
    for k in range(chunks):
        m = mmap.mmap(-1, chunk_mb << 20)
        f, t = faults(), time.perf_counter()
        for i in range(0, chunk_mb << 20, PAGE):
            m[i] = 1
        dt, n = time.perf_counter() - t, faults() - f
        held.append(m)
        print(f"chunk {k} ({(k + 1) * chunk_mb} MB touched): {n} faults, {dt * 1e6 / max(n, 1):.2f} us a fault")


def reallocations() -> None:
    import mlx.core as mx

    def alloc(nbytes: int, n: int = 56):
        f = faults()
        xs = [mx.ones((nbytes // 4,)) for _ in range(n)]
        mx.eval(xs)
        return xs, faults() - f

    for mb in (1.0, 2.3):
        size = int(mb * (1 << 20))
        counts = []
        for _ in range(4):
            xs, n = alloc(size)
            counts.append(n)
            del xs
        print(f"56 arrays of {mb} MB ({56 * size // PAGE} pages), allocated after each free: faults {counts}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--chunk-mb", type=int, default=512)
    args = ap.parse_args()
    if not (1 <= args.chunks <= 64 and 1 <= args.chunk_mb <= 4096):
        ap.error("--chunks takes 1-64 and --chunk-mb 1-4096")
    touch_chunks(args.chunks, args.chunk_mb)
    reallocations()


if __name__ == "__main__":
    main()
