/* Replays the message schedule piper-schedule recorded from piper-comm's all-to-all code, one file per
 * rank, under SimGrid's SMPI: the same sends, receives, native all-to-alls and waits, in the same
 * program order, with a wait's groups handed over in the order they complete (what piper-comm's
 * wait_groups does) and what each group forwards posted then.
 *
 * usage: replay DIR BYTES_PER_PEER    (prints, on rank 0, the simulated seconds from the last rank's start to the last rank's end) */
#include <mpi.h>
#include <smpi/smpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long long B;
static char *buf;
static MPI_Request *req;
static long nreq;

static void die(const char *what, const char *file) {
  fprintf(stderr, "replay: %s (%s)\n", what, file);
  MPI_Abort(MPI_COMM_WORLD, 2);
}

static int size_of(long long fixed, long long per_byte) { return (int)(fixed + per_byte * B); }

static void grow(long id) {
  if (id < nreq) return;
  long n = (id + 1) * 2;
  req = realloc(req, n * sizeof(MPI_Request));
  for (long i = nreq; i < n; i++) req[i] = MPI_REQUEST_NULL;
  nreq = n;
}

/* Posts the S or R line already read into kind (the rest is still in f). */
static void post(FILE *f, char kind, const char *file) {
  long id, peer, tag; long long fixed, per;
  if (fscanf(f, "%ld %ld %ld %lld %lld", &id, &peer, &tag, &fixed, &per) != 5) die("a bad S/R line", file);
  grow(id);
  if (kind == 'S')
    MPI_Isend(buf, size_of(fixed, per), MPI_BYTE, (int)peer, (int)tag, MPI_COMM_WORLD, &req[id]);
  else
    MPI_Irecv(buf, size_of(fixed, per), MPI_BYTE, (int)peer, (int)tag, MPI_COMM_WORLD, &req[id]);
}

static void all_to_all(FILE *f, const char *file) {
  int n; if (fscanf(f, "%d", &n) != 1) die("a bad A line", file);
  int *counts = malloc(4 * sizeof(int) * n), *displs = calloc(n, sizeof(int));
  for (int i = 0; i < 2 * n; i++) {
    long long fixed, per;
    if (fscanf(f, "%lld %lld", &fixed, &per) != 2) die("a bad A line", file);
    counts[i] = size_of(fixed, per);
  }
  MPI_Alltoallv(buf, counts, displs, MPI_BYTE, buf, counts + n, displs, MPI_BYTE, MPI_COMM_WORLD);
  free(counts); free(displs);
}

/* A wait: the groups, then each group's forwarded posts (kept as file offsets, posted on arrival). */
static void wait_groups(FILE *f, const char *file) {
  int ng; if (fscanf(f, "%d", &ng) != 1) die("a bad W line", file);
  long total = 0, *ids = NULL; int *group_of = NULL, *left = malloc(ng * sizeof(int));
  for (int g = 0; g < ng; g++) {
    int k; char c;
    if (fscanf(f, " %c %d", &c, &k) != 2 || c != 'G') die("a wait without its groups", file);
    left[g] = k;
    ids = realloc(ids, (total + k) * sizeof(long)); group_of = realloc(group_of, (total + k) * sizeof(int));
    for (int i = 0; i < k; i++, total++) {
      if (fscanf(f, "%ld", &ids[total]) != 1) die("a bad G line", file);
      group_of[total] = g;
    }
  }
  long *then_at = malloc(ng * sizeof(long)); int *then_n = malloc(ng * sizeof(int));
  for (int g = 0; g < ng; g++) {
    int gg, c; char t;
    if (fscanf(f, " %c %d %d", &t, &gg, &c) != 3 || t != 'T' || gg != g) die("a wait without its T lines", file);
    then_at[g] = ftell(f); then_n[g] = c;
    for (int i = 0; i < c; i++) { char kind; long a, b, cc; long long x, y;
      if (fscanf(f, " %c %ld %ld %ld %lld %lld", &kind, &a, &b, &cc, &x, &y) != 6) die("a bad T line", file); }
  }
  char e; if (fscanf(f, " %c", &e) != 1 || e != 'E') die("a wait without its end", file);
  long end = ftell(f);
  MPI_Request *pending = malloc((total + 1) * sizeof(MPI_Request));
  for (long i = 0; i < total; i++) { grow(ids[i]); pending[i] = req[ids[i]]; }
  int handed = 0;
  for (int g = 0; g < ng; g++) if (left[g] == 0) left[g] = -1;
  for (;;) {
    for (int g = 0; g < ng; g++) {
      if (left[g] != -1) continue;
      left[g] = -2; handed++;
      fseek(f, then_at[g], SEEK_SET);
      for (int i = 0; i < then_n[g]; i++) { char kind; if (fscanf(f, " %c", &kind) != 1) die("a bad T line", file); post(f, kind, file); }
    }
    if (handed == ng) break;
    int idx; MPI_Waitany((int)total, pending, &idx, MPI_STATUS_IGNORE);
    if (idx == MPI_UNDEFINED) die("a wait whose groups never complete", file);
    req[ids[idx]] = MPI_REQUEST_NULL;
    if (--left[group_of[idx]] == 0) left[group_of[idx]] = -1;
  }
  fseek(f, end, SEEK_SET);
  free(ids); free(group_of); free(left); free(then_at); free(then_n); free(pending);
}

/* The largest message of the schedule at B bytes per peer (the one buffer every message uses). */
static long long largest(FILE *f) {
  long start = ftell(f), most = 0;
  char line[1 << 16];
  while (fgets(line, sizeof line, f)) {
    long id, peer, tag; long long fixed, per; int n, used;
    char kind;
    if (sscanf(line, " %c %ld %ld %ld %lld %lld", &kind, &id, &peer, &tag, &fixed, &per) == 6 && (kind == 'S' || kind == 'R')) {
      if (size_of(fixed, per) > most) most = size_of(fixed, per);
    } else if (sscanf(line, " A %d%n", &n, &used) == 1) {
      /* A native all-to-all's largest block is what matters; its lines can be long, so read them by value. */
      fseek(f, -(long)strlen(line) + used, SEEK_CUR);
      for (int i = 0; i < 2 * n; i++) {
        if (fscanf(f, "%lld %lld", &fixed, &per) != 2) break;
        if (size_of(fixed, per) > most) most = size_of(fixed, per);
      }
    }
  }
  fseek(f, start, SEEK_SET);
  return most;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 3) die("usage: replay DIR BYTES_PER_PEER", "arguments");
  B = atoll(argv[2]);
  char file[4096]; snprintf(file, sizeof file, "%s/rank-%d.txt", argv[1], rank);
  FILE *f = fopen(file, "r"); if (!f) die("cannot open the schedule", file);
  int version, ranks, me; char algo[32];
  if (fscanf(f, "piper-schedule %d %d %d %31s", &version, &ranks, &me, algo) != 4 || version != 1 || me != rank)
    die("not a version-1 schedule of this rank", file);
  int world; MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != ranks) die("the schedule is for another number of ranks", file);
  /* One buffer for every message: the simulation moves sizes, not data. */
  buf = SMPI_SHARED_MALLOC((size_t)largest(f) + 4096);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  char kind;
  while (fscanf(f, " %c", &kind) == 1) {
    if (kind == 'S' || kind == 'R') post(f, kind, file);
    else if (kind == 'A') all_to_all(f, file);
    else if (kind == 'W') wait_groups(f, file);
    else die("an unknown line", file);
  }
  /* The ranks share one simulated clock, and leave the barrier up to a latency apart: the exchange
     runs from the last rank's start to the last rank's end. */
  double end = MPI_Wtime(), last_end, first_start, last_start;
  MPI_Reduce(&end, &last_end, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(&t0, &first_start, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
  MPI_Reduce(&t0, &last_start, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("simulated_s %.9g\nstart_skew_s %.9g\n", last_end - last_start, last_start - first_start);
  fclose(f); SMPI_SHARED_FREE(buf); free(req);
  MPI_Finalize();
  return 0;
}
