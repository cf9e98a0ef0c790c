"""The machine a measurement ran on: its description for profiles (`machine`), the BLAS MLX's
CPU kernels call (`blas`), and glibc kept from handing freed memory back (`malloc`)."""
