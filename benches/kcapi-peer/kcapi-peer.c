/*
 * kcapi-peer: libkcapi's AIO cipher throughput, the reference AF_ALG user
 * against which `af-alg-vs-kcapi` measures the crate's AF_ALG backend on
 * the same driver in the same guest (docs/benchmarks.md §4).
 *
 *   kcapi-peer [-d DRIVER] [-t MS] [-q DEPTH] [-m iov|handles] SIZE...
 *
 * For each SIZE (bytes, a multiple of 16), AES-128-CBC on DRIVER (default
 * cbc(aes); a driver name such as virtio_crypto_aes_cbc binds exactly it),
 * for MS milliseconds each (default 1000), two ways (or the one -m names)
 * with DEPTH requests in flight (default 64):
 *
 *   iov      one handle, kcapi_cipher_encrypt_aio with DEPTH iovecs: DEPTH
 *            operations per call (one sendmsg carrying all of them, one
 *            io_submit of DEPTH reads on the handle's socket, then
 *            io_getevents until all are back). One IV for the whole call:
 *            libkcapi's fastest AIO use, not independent requests.
 *   handles  DEPTH threads, each with its own handle, each calling
 *            kcapi_cipher_encrypt_aio with one iovec and its own IV in a
 *            loop: independent requests, one per call.
 *
 * One line a measurement:
 *   kcapi mode=iov size=64 depth=64 ops=... secs=... ops_per_s=... cpu_us_per_op=...
 * (cpu: this process's user+system time, getrusage). Exit status 1 if any
 * call failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <kcapi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static const char *driver = "cbc(aes)";
static long time_ms = 1000;
static const char *mode = NULL;
static size_t depth = 64;
/* When the handles' threads stop (written before the start barrier). */
static double stop_at;
static const uint8_t key[16] = {0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24,
                                0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24, 0x24};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_secs(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static uint8_t *page_buffer(size_t len)
{
	void *p = NULL;
	long page = sysconf(_SC_PAGESIZE);
	if (posix_memalign(&p, (size_t)(page > 0 ? page : 4096), len ? len : 1))
		return NULL;
	memset(p, 0x5a, len);
	return p;
}

static struct kcapi_handle *open_handle(void)
{
	struct kcapi_handle *h = NULL;
	int rc = kcapi_cipher_init(&h, driver, KCAPI_INIT_AIO);
	if (rc) {
		fprintf(stderr, "kcapi_cipher_init(%s): %s\n", driver, strerror(-rc));
		return NULL;
	}
	rc = kcapi_cipher_setkey(h, key, sizeof(key));
	if (rc) {
		fprintf(stderr, "kcapi_cipher_setkey: %s\n", strerror(-rc));
		kcapi_cipher_destroy(h);
		return NULL;
	}
	return h;
}

static void report(const char *mode, size_t size, unsigned long long ops,
		   double secs, double cpu)
{
	printf("kcapi mode=%s size=%zu depth=%zu ops=%llu secs=%.3f ops_per_s=%.0f cpu_us_per_op=%.2f\n",
	       mode, size, depth, ops, secs, (double)ops / secs,
	       ops ? cpu * 1e6 / (double)ops : 0.0);
	fflush(stdout);
}

static int run_iov(size_t size)
{
	struct kcapi_handle *h = open_handle();
	struct iovec *in = calloc(depth, sizeof(*in));
	struct iovec *out = calloc(depth, sizeof(*out));
	uint8_t iv[16] = {0};
	unsigned long long ops = 0;
	int failed = 0;

	if (!h || !in || !out)
		return 1;
	for (size_t i = 0; i < depth; i++) {
		in[i].iov_base = page_buffer(size);
		out[i].iov_base = page_buffer(size);
		if (!in[i].iov_base || !out[i].iov_base)
			return 1;
		in[i].iov_len = out[i].iov_len = size;
	}
	/* Warm up: the socket and the AIO context are set up here. */
	if (kcapi_cipher_encrypt_aio(h, in, out, depth, iv, KCAPI_ACCESS_HEURISTIC) !=
	    (ssize_t)(size * depth)) {
		fprintf(stderr, "kcapi iov warm-up failed\n");
		return 1;
	}
	double cpu0 = cpu_secs(), t0 = now(), end = t0 + (double)time_ms / 1e3;
	while (now() < end) {
		ssize_t r = kcapi_cipher_encrypt_aio(h, in, out, depth, iv,
						     KCAPI_ACCESS_HEURISTIC);
		if (r != (ssize_t)(size * depth)) {
			fprintf(stderr, "kcapi_cipher_encrypt_aio: %zd\n", r);
			failed = 1;
			break;
		}
		ops += depth;
	}
	report("iov", size, ops, now() - t0, cpu_secs() - cpu0);
	for (size_t i = 0; i < depth; i++) {
		free(in[i].iov_base);
		free(out[i].iov_base);
	}
	free(in);
	free(out);
	kcapi_cipher_destroy(h);
	return failed;
}

struct worker {
	pthread_t thread;
	size_t size;
	unsigned long long ops;
	int failed;
	pthread_barrier_t *start;
};

static void *work(void *arg)
{
	struct worker *w = arg;
	struct kcapi_handle *h = open_handle();
	uint8_t *in = page_buffer(w->size), *out = page_buffer(w->size);
	uint8_t iv[16] = {0};
	struct iovec iin, iout;

	w->failed = !h || !in || !out;
	iin.iov_base = in;
	iout.iov_base = out;
	iin.iov_len = iout.iov_len = w->size;
	if (!w->failed && kcapi_cipher_encrypt_aio(h, &iin, &iout, 1, iv,
						   KCAPI_ACCESS_HEURISTIC) != (ssize_t)w->size)
		w->failed = 1;
	pthread_barrier_wait(w->start);
	while (!w->failed && now() < stop_at) {
		iv[0]++;
		if (kcapi_cipher_encrypt_aio(h, &iin, &iout, 1, iv,
					     KCAPI_ACCESS_HEURISTIC) != (ssize_t)w->size) {
			w->failed = 1;
			break;
		}
		w->ops++;
	}
	if (h)
		kcapi_cipher_destroy(h);
	free(in);
	free(out);
	return NULL;
}

static int run_handles(size_t size)
{
	struct worker *w = calloc(depth, sizeof(*w));
	pthread_barrier_t start;
	unsigned long long ops = 0;
	int failed = 0;

	if (!w)
		return 1;
	pthread_barrier_init(&start, NULL, (unsigned)depth + 1);
	for (size_t i = 0; i < depth; i++) {
		w[i].size = size;
		w[i].start = &start;
		if (pthread_create(&w[i].thread, NULL, work, &w[i])) {
			fprintf(stderr, "pthread_create failed\n");
			return 1;
		}
	}
	/* The clock starts when every thread has its handle and has warmed
	 * up; the barrier publishes the stop time to them. */
	stop_at = now() + (double)time_ms / 1e3;
	pthread_barrier_wait(&start);
	double t0 = now(), cpu0 = cpu_secs();
	for (size_t i = 0; i < depth; i++) {
		pthread_join(w[i].thread, NULL);
		ops += w[i].ops;
		failed |= w[i].failed;
	}
	report("handles", size, ops, now() - t0, cpu_secs() - cpu0);
	pthread_barrier_destroy(&start);
	free(w);
	if (failed)
		fprintf(stderr, "kcapi handles: a call failed\n");
	return failed;
}

int main(int argc, char **argv)
{
	int opt, failed = 0;

	while ((opt = getopt(argc, argv, "d:t:q:m:")) != -1) {
		switch (opt) {
		case 'd':
			driver = optarg;
			break;
		case 't':
			time_ms = strtol(optarg, NULL, 10);
			break;
		case 'm':
			mode = optarg;
			break;
		case 'q':
			depth = (size_t)strtoul(optarg, NULL, 10);
			break;
		default:
			fprintf(stderr, "usage: %s [-d DRIVER] [-t MS] [-q DEPTH] [-m iov|handles] SIZE...\n", argv[0]);
			return 2;
		}
	}
	if (depth < 1 || depth > 64) {
		/* libkcapi submits at most 64 (KCAPI_AIO_CONCURRENT) per call. */
		fprintf(stderr, "depth must be 1..64\n");
		return 2;
	}
	for (int i = optind; i < argc; i++) {
		size_t size = (size_t)strtoul(argv[i], NULL, 10);
		if (!size || size % 16) {
			fprintf(stderr, "size %s: a positive multiple of 16\n", argv[i]);
			return 2;
		}
		if (!mode || !strcmp(mode, "iov"))
			failed |= run_iov(size);
		if (!mode || !strcmp(mode, "handles"))
			failed |= run_handles(size);
	}
	return failed;
}
