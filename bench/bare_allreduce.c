/* A bare MPI_Allreduce timing loop: the baseline that `foundry bench comm` is compared with
 * (bench/compare_allreduce_overhead.sh). Nothing but MPI and a clock, timed the classic way:
 * warm-up calls, one barrier, then `iters` back-to-back calls timed as a block; the time per
 * call is the block's time / iters, and the reported figure is the slowest rank's.
 *
 *   mpicc -O2 bench/bare_allreduce.c -o bare_allreduce
 *   mpirun -np 2 ./bare_allreduce BYTES ITERS WARMUP
 *
 * Prints one line on rank 0: "bare_allreduce bytes=... iters=... avg_us=..." */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const long bytes = argc > 1 ? atol(argv[1]) : 1048576;
  const int iters = argc > 2 ? atoi(argv[2]) : 200;
  const int warmup = argc > 3 ? atoi(argv[3]) : 20;
  const int count = (int)(bytes / (long)sizeof(float));
  if (count < 1 || iters < 1 || warmup < 0) {
    if (rank == 0) fprintf(stderr, "usage: bare_allreduce BYTES ITERS WARMUP\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  float* send = malloc((size_t)count * sizeof(float));
  float* recv = malloc((size_t)count * sizeof(float));
  for (int i = 0; i < count; ++i) send[i] = (float)(rank + 1);

  for (int i = 0; i < warmup; ++i)
    MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int i = 0; i < iters; ++i)
    MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double per_call = (MPI_Wtime() - start) / iters;
  double slowest = 0;
  MPI_Reduce(&per_call, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int ok = recv[0] == (float)size * (size + 1) / 2;
  if (rank == 0)
    printf("bare_allreduce bytes=%ld iters=%d avg_us=%.3f correct=%d\n", (long)count * 4, iters,
           slowest * 1e6, ok);
  free(send);
  free(recv);
  MPI_Finalize();
  return ok ? 0 : 1;
}
