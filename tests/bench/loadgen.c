/*
 * Closed-loop load generator for the RESOLVE throughput benchmark. Each of CLIENTS unix-socket
 * connections sends one request, waits for the whole reply (its length is in the header),
 * records the round trip and sends the next. Connections are spread over PROCS processes,
 * each driving its share with epoll, so the client side costs little CPU per request.
 *
 *   loadgen SOCKET REQUEST_FILE CLIENTS SECONDS WARMUP PROCS
 *
 * Prints one JSON object: requests and errors counted in the measured window (after WARMUP
 * seconds), requests per second, and latency percentiles in microseconds.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG_MAX 592
#define MAX_PROCS 64

struct client {
	int fd;
	size_t got;
	uint64_t sent_at;
	unsigned char buf[MSG_MAX];
};

struct result {
	uint64_t requests, errors, count;
	uint64_t *lat;
};

static unsigned char request[MSG_MAX];
static size_t request_len;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int connect_unix(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	strncpy(addr.sun_path, path, sizeof(addr.sun_path) - 1);
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
		perror("connect");
		exit(1);
	}
	fcntl(fd, F_SETFL, O_NONBLOCK);
	return fd;
}

static int send_request(struct client *c)
{
	c->got = 0;
	c->sent_at = now_ns();
	ssize_t n = send(c->fd, request, request_len, MSG_NOSIGNAL);
	return n == (ssize_t)request_len ? 0 : -1;
}

static unsigned reply_length(const unsigned char *hdr)
{
	if ((hdr[1] & 0x0f) == 0x01)
		return hdr[6] | (hdr[7] << 8);
	return (hdr[6] << 8) | hdr[7];
}

/* Drive `count` connections until `end`; latencies of replies after `measure_from`. */
static void run_share(const char *path, int count, uint64_t start, uint64_t measure_from,
		      uint64_t end, struct result *res)
{
	struct client *clients = calloc((size_t)count, sizeof(*clients));
	size_t cap = 1 << 16;
	res->lat = malloc(cap * sizeof(uint64_t));
	int ep = epoll_create1(EPOLL_CLOEXEC);
	for (int i = 0; i < count; i++) {
		clients[i].fd = connect_unix(path);
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &clients[i] };
		epoll_ctl(ep, EPOLL_CTL_ADD, clients[i].fd, &ev);
	}
	while (now_ns() < start)
		usleep(100);
	for (int i = 0; i < count; i++)
		if (send_request(&clients[i]))
			res->errors++;
	struct epoll_event events[256];
	for (;;) {
		uint64_t t = now_ns();
		if (t >= end)
			break;
		int n = epoll_wait(ep, events, 256, (int)((end - t) / 1000000 + 1));
		for (int i = 0; i < n; i++) {
			struct client *c = events[i].data.ptr;
			ssize_t r = recv(c->fd, c->buf + c->got, MSG_MAX - c->got, 0);
			if (r < 0 && errno == EAGAIN)
				continue;
			if (r <= 0) {
				fprintf(stderr, "loadgen: server closed a connection\n");
				exit(1);
			}
			c->got += (size_t)r;
			if (c->got < 16 || c->got < reply_length(c->buf))
				continue;
			uint64_t done = now_ns();
			if (c->got != reply_length(c->buf) || c->buf[2] != 0)
				res->errors++;
			if (c->sent_at >= measure_from && done < end) {
				res->requests++;
				if (res->count == cap) {
					cap *= 2;
					res->lat = realloc(res->lat, cap * sizeof(uint64_t));
				}
				res->lat[res->count++] = done - c->sent_at;
			}
			if (send_request(c))
				res->errors++;
		}
	}
	for (int i = 0; i < count; i++)
		close(clients[i].fd);
	free(clients);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double pct(const uint64_t *v, uint64_t n, double p)
{
	if (!n)
		return 0;
	uint64_t i = (uint64_t)(p * (double)(n - 1) + 0.5);
	return (double)v[i] / 1000.0;
}

static int read_all(int fd, void *buf, size_t len)
{
	unsigned char *p = buf;
	while (len) {
		ssize_t n = read(fd, p, len);
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const unsigned char *p = buf;
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 7) {
		fprintf(stderr, "usage: %s SOCKET REQUEST_FILE CLIENTS SECONDS WARMUP PROCS\n", argv[0]);
		return 2;
	}
	const char *path = argv[1];
	FILE *f = fopen(argv[2], "rb");
	if (!f) {
		perror(argv[2]);
		return 1;
	}
	request_len = fread(request, 1, sizeof(request), f);
	fclose(f);
	int clients = atoi(argv[3]);
	double seconds = atof(argv[4]), warmup = atof(argv[5]);
	int procs = atoi(argv[6]);
	if (clients < 1 || request_len < 16 || seconds <= 0 || procs < 1 || procs > MAX_PROCS) {
		fprintf(stderr, "loadgen: bad arguments\n");
		return 2;
	}
	if (procs > clients)
		procs = clients;
	uint64_t start = now_ns() + 300000000ull;
	uint64_t measure_from = start + (uint64_t)(warmup * 1e9);
	uint64_t end = measure_from + (uint64_t)(seconds * 1e9);
	int pipes[MAX_PROCS];
	pid_t pids[MAX_PROCS];
	for (int p = 0; p < procs; p++) {
		int fds[2];
		if (pipe(fds)) {
			perror("pipe");
			return 1;
		}
		int share = clients / procs + (p < clients % procs);
		pids[p] = fork();
		if (pids[p] == 0) {
			close(fds[0]);
			struct result res = { 0 };
			run_share(path, share, start, measure_from, end, &res);
			uint64_t head[3] = { res.requests, res.errors, res.count };
			if (write_all(fds[1], head, sizeof(head)) ||
			    write_all(fds[1], res.lat, res.count * sizeof(uint64_t)))
				_exit(1);
			_exit(0);
		}
		close(fds[1]);
		pipes[p] = fds[0];
	}
	uint64_t requests = 0, errors = 0, count = 0;
	uint64_t *lat = NULL;
	for (int p = 0; p < procs; p++) {
		uint64_t head[3];
		if (read_all(pipes[p], head, sizeof(head))) {
			fprintf(stderr, "loadgen: a worker failed\n");
			return 1;
		}
		lat = realloc(lat, (count + head[2] + 1) * sizeof(uint64_t));
		if (read_all(pipes[p], lat + count, head[2] * sizeof(uint64_t))) {
			fprintf(stderr, "loadgen: a worker failed\n");
			return 1;
		}
		requests += head[0];
		errors += head[1];
		count += head[2];
		close(pipes[p]);
	}
	int failed = 0;
	for (int p = 0; p < procs; p++) {
		int status;
		waitpid(pids[p], &status, 0);
		failed |= !WIFEXITED(status) || WEXITSTATUS(status);
	}
	qsort(lat, count, sizeof(uint64_t), cmp_u64);
	printf("{\"clients\": %d, \"procs\": %d, \"seconds\": %.3f, \"requests\": %llu, "
	       "\"errors\": %llu, \"rps\": %.1f, \"p50_us\": %.2f, \"p90_us\": %.2f, "
	       "\"p99_us\": %.2f, \"p999_us\": %.2f, \"max_us\": %.2f}\n",
	       clients, procs, seconds, (unsigned long long)requests, (unsigned long long)errors,
	       (double)requests / seconds, pct(lat, count, 0.50), pct(lat, count, 0.90),
	       pct(lat, count, 0.99), pct(lat, count, 0.999), count ? (double)lat[count - 1] / 1000.0 : 0);
	free(lat);
	return failed;
}
