/*
 * Load generator of the client-socket benchmarks (throughput.py). CLIENTS unix-socket clients,
 * spread over PROCS processes that each drive their share with epoll, in one of four modes:
 *
 *   closed    (default) each client keeps one connection and one request in flight: send,
 *             read the whole reply (its length is in the header), send the next;
 *   oneshot   what ib_acme does: connect, send one request, read the whole reply, close,
 *             repeat; the latency is connect -> whole reply;
 *   pipeline  each connection keeps DEPTH requests in flight: DEPTH at once, then one more
 *             per reply;
 *   churn     connect, send REQUEST_FILE's bytes (garbage, say), close at once unread,
 *             COUNT connections in all (-n), each process a blocking loop: what a client
 *             flooding the daemon with malformed connections does. No latency measured.
 *
 *   loadgen [-m MODE] [-k DEPTH] [-n COUNT] [-p PROCS] [-w WARMUP] [-g GRACE] SOCKET
 *           REQUEST_FILE CLIENTS SECONDS
 *
 * Nothing a server does stops the run: a refused connect (nobody listens: the server died),
 * a full backlog (the connect waits in the kernel, as ib_acme's does), a reset or a hang-up
 * (the requests in flight are lost, the client connects again), a reply with a bad header or
 * a non-zero status: each is counted. After SECONDS (following WARMUP) no new request is
 * sent and the run waits up to GRACE seconds for the replies still owed. Prints one JSON
 * object: every request accounted (sent = answered + lost on reset + unanswered at the end),
 * the clients that never got an answer, and over the measured window the replies per second
 * and latency percentiles in microseconds.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG_MAX 592
#define BUF_CAP 4096
#define MAX_PROCS 64
#define MAX_DEPTH 256
#define RETRY_NS 1000000ull
#define RETRY_MAX_NS 64000000ull
#define CONNECTORS 16

enum mode { CLOSED, ONESHOT, PIPELINE, CHURN };

struct client {
	int fd;			/* -1: not connected */
	uint64_t retry_at;	/* when to try connecting again */
	uint64_t backoff;	/* the wait after a refused connect: 1 ms, doubling to 64 ms */
	int connecting;		/* handed to a connector thread (a full backlog) */
	int handed_fd, handed_err; /* what the connector got: written before its pipe write */
	uint64_t connect_at;	/* one-shot: when this connection was started */
	unsigned in_flight;	/* requests sent and not answered on this connection */
	unsigned head;		/* ring of send times, oldest first */
	uint64_t answered;
	size_t got;
	uint64_t sent_at[MAX_DEPTH];
	unsigned char buf[BUF_CAP];
};

/* What a worker sends its parent, then `count` latencies. */
struct tally {
	uint64_t sent, answered, errors, lost, unanswered, resets, refused, backlog_full;
	uint64_t connections, never_answered, send_failed, count;
};

static unsigned char request[MSG_MAX];
static size_t request_len;
static enum mode mode = CLOSED;
static unsigned depth = 1;
static struct sockaddr_un addr = { .sun_family = AF_UNIX };

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The reply length: host order (little-endian) for opcode 0x01, big-endian otherwise. */
static unsigned reply_length(const unsigned char *hdr)
{
	if ((hdr[1] & 0x0f) == 0x01)
		return hdr[6] | (hdr[7] << 8);
	return (hdr[6] << 8) | hdr[7];
}

static void drop(struct client *c, struct tally *t, uint64_t now)
{
	t->lost += c->in_flight;
	c->in_flight = 0;
	c->head = 0;
	c->got = 0;
	close(c->fd);
	c->fd = -1;
	c->retry_at = now;
}

/*
 * A full backlog: the connect is retried by one of CONNECTORS threads with a blocking
 * connect(), as ib_acme's own connect() waits, so the kernel hands the client the next free
 * slot as the server accepts; spinning on EAGAIN instead would leave the slot empty between
 * tries (C ibacm listens with backlog 0 and takes one connection per select round) and burn
 * the cores the server needs. A blocking connect gives up at the end of the run.
 */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t ready;
	struct client **items;
	size_t head, count, cap;
	int stop;
	uint64_t end;
	int result_fd;
} connectors = { .lock = PTHREAD_MUTEX_INITIALIZER, .ready = PTHREAD_COND_INITIALIZER };

static void *connector(void *unused)
{
	(void)unused;
	for (;;) {
		pthread_mutex_lock(&connectors.lock);
		while (!connectors.count && !connectors.stop)
			pthread_cond_wait(&connectors.ready, &connectors.lock);
		if (connectors.stop) {
			pthread_mutex_unlock(&connectors.lock);
			return NULL;
		}
		struct client *c = connectors.items[connectors.head];
		connectors.head = (connectors.head + 1) % connectors.cap;
		connectors.count--;
		pthread_mutex_unlock(&connectors.lock);
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		uint64_t now = now_ns();
		uint64_t left = connectors.end > now ? connectors.end - now : 1000000;
		struct timeval tv = { .tv_sec = (time_t)(left / 1000000000ull),
				      .tv_usec = (suseconds_t)(left % 1000000000ull / 1000) };
		int err = 0;
		if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) ||
		    connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
			err = errno ? errno : EIO;
			if (fd >= 0)
				close(fd);
			fd = -1;
		}
		c->handed_fd = fd;
		c->handed_err = err;
		if (write(connectors.result_fd, &c, sizeof(c)) != sizeof(c)) {
			perror("loadgen: connector pipe");
			exit(1);
		}
	}
}

static void hand_to_connector(struct client *c)
{
	c->connecting = 1;
	pthread_mutex_lock(&connectors.lock);
	connectors.items[(connectors.head + connectors.count) % connectors.cap] = c;
	connectors.count++;
	pthread_cond_signal(&connectors.ready);
	pthread_mutex_unlock(&connectors.lock);
}

static void connected(struct client *c, int fd, int ep, struct tally *t)
{
	c->fd = fd;
	c->backoff = 0;
	t->connections++;
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
	epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

static void refused(struct client *c, struct tally *t, uint64_t now)
{
	c->backoff = c->backoff ? c->backoff * 2 : RETRY_NS;
	if (c->backoff > RETRY_MAX_NS)
		c->backoff = RETRY_MAX_NS;
	c->retry_at = now + c->backoff;
	t->refused++; /* ECONNREFUSED, ENOENT: nobody listens (the server died) */
}

/* Connect without blocking: 1 connected, 0 try later (counted), -1 fatal. */
static int try_connect(struct client *c, int ep, struct tally *t, uint64_t now)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		perror("loadgen: socket");
		return -1;
	}
	c->connect_at = now;
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
		int err = errno;
		close(fd);
		if (err == EAGAIN) {
			t->backlog_full++;
			hand_to_connector(c);
		} else {
			refused(c, t, now);
		}
		return 0;
	}
	connected(c, fd, ep, t);
	return 1;
}

static int send_one(struct client *c, struct tally *t, uint64_t now)
{
	ssize_t n = send(c->fd, request, request_len, MSG_NOSIGNAL);
	if (n != (ssize_t)request_len) {
		/* A reset, or a full socket buffer: either way this connection is done. */
		if (n < 0 && errno != EAGAIN)
			t->resets++;
		else
			t->send_failed++;
		return -1;
	}
	t->sent++;
	c->sent_at[(c->head + c->in_flight) % MAX_DEPTH] = now;
	c->in_flight++;
	return 0;
}

/* Send until the connection holds its share of requests in flight. */
static int fill(struct client *c, struct tally *t, uint64_t now)
{
	unsigned want = mode == PIPELINE ? depth : 1;
	while (c->in_flight < want)
		if (send_one(c, t, now))
			return -1;
	return 0;
}

static void record(struct tally *t, uint64_t **lat, size_t *cap, uint64_t value)
{
	if (t->count == *cap) {
		*cap *= 2;
		*lat = realloc(*lat, *cap * sizeof(uint64_t));
		if (!*lat) {
			perror("loadgen: realloc");
			exit(1);
		}
	}
	(*lat)[t->count++] = value;
}

/* The connectors' results: a connected client sends at once; the others wait their turn.
 * Returns how many clients went back to waiting. */
static int take_connected(int results_fd, int ep, struct tally *t, uint64_t end)
{
	struct client *c;
	int back = 0;
	while (read(results_fd, &c, sizeof(c)) == sizeof(c)) {
		uint64_t now = now_ns();
		c->connecting = 0;
		if (c->handed_fd >= 0) {
			fcntl(c->handed_fd, F_SETFL, O_NONBLOCK);
			connected(c, c->handed_fd, ep, t);
			if (now < end && fill(c, t, now)) {
				drop(c, t, now);
				back++;
			}
			continue;
		}
		if (c->handed_err == EAGAIN || c->handed_err == EINTR)
			c->retry_at = now; /* timed out at the end of the run */
		else
			refused(c, t, now);
		back++;
	}
	return back;
}

/* Drive `count` clients: start at `start`, measure from `measure_from`, stop sending at
 * `end`, wait for the replies owed until `end + grace`. */
static void run_share(int count, uint64_t start, uint64_t measure_from, uint64_t end,
		      uint64_t grace, struct tally *t, uint64_t **lat)
{
	struct client *clients = calloc((size_t)count, sizeof(*clients));
	size_t cap = 1 << 16;
	*lat = malloc(cap * sizeof(uint64_t));
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (!clients || !*lat || ep < 0) {
		perror("loadgen: setup");
		exit(1);
	}
	for (int i = 0; i < count; i++) {
		clients[i].fd = -1;
		clients[i].retry_at = start;
	}
	int results[2];
	connectors.items = calloc((size_t)count, sizeof(*connectors.items));
	connectors.cap = (size_t)count;
	connectors.end = end;
	if (!connectors.items || pipe2(results, O_CLOEXEC | O_NONBLOCK)) {
		perror("loadgen: connectors");
		exit(1);
	}
	connectors.result_fd = results[1];
	/* The pipe's writes must not fail: the connectors block until the loop reads. */
	fcntl(results[1], F_SETFL, 0);
	struct epoll_event pev = { .events = EPOLLIN, .data.ptr = NULL };
	epoll_ctl(ep, EPOLL_CTL_ADD, results[0], &pev);
	pthread_t threads[CONNECTORS];
	for (int i = 0; i < CONNECTORS; i++)
		if (pthread_create(&threads[i], NULL, connector, NULL)) {
			perror("loadgen: pthread_create");
			exit(1);
		}
	while (now_ns() < start)
		usleep(100);
	struct epoll_event events[256];
	int waiting = count; /* clients not connected */
	for (;;) {
		uint64_t now = now_ns();
		int sending = now < end;
		if (!sending) {
			uint64_t owed = 0;
			for (int i = 0; i < count; i++)
				owed += clients[i].in_flight;
			if (!owed || now >= end + grace)
				break;
		}
		if (sending && waiting) {
			waiting = 0;
			for (int i = 0; i < count; i++) {
				struct client *c = &clients[i];
				if (c->fd >= 0 || c->connecting)
					continue;
				if (c->retry_at > now || try_connect(c, ep, t, now) == 0) {
					waiting += !c->connecting;
					continue;
				}
				if (c->fd < 0)
					exit(1);
				if (fill(c, t, now)) {
					drop(c, t, now);
					waiting++;
				}
			}
		}
		int timeout = waiting ? 1 : 20;
		int n = epoll_wait(ep, events, 256, timeout);
		for (int i = 0; i < n; i++) {
			struct client *c = events[i].data.ptr;
			if (!c) {
				waiting += take_connected(results[0], ep, t, end);
				continue;
			}
			ssize_t r = recv(c->fd, c->buf + c->got, BUF_CAP - c->got, 0);
			if (r < 0 && (errno == EAGAIN || errno == EINTR))
				continue;
			uint64_t done = now_ns();
			if (r <= 0) {
				t->resets++; /* a hang-up or a reset by the server */
				drop(c, t, done);
				waiting++;
				continue;
			}
			c->got += (size_t)r;
			size_t off = 0;
			int bad = 0;
			while (c->got - off >= 8) {
				unsigned len = reply_length(c->buf + off);
				if (len < 16 || len > MSG_MAX || !c->in_flight) {
					bad = 1;
					break;
				}
				if (c->got - off < len)
					break;
				uint64_t from = mode == ONESHOT ? c->connect_at : c->sent_at[c->head];
				c->head = (c->head + 1) % MAX_DEPTH;
				c->in_flight--;
				t->answered++;
				c->answered++;
				if (c->buf[off + 2] != 0)
					t->errors++;
				if (from >= measure_from && done < end)
					record(t, lat, &cap, done - from);
				off += len;
			}
			memmove(c->buf, c->buf + off, c->got - off);
			c->got -= off;
			if (bad) {
				t->errors++;
				t->resets++;
				drop(c, t, done);
				waiting++;
				continue;
			}
			if (mode == ONESHOT && !c->in_flight) {
				epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
				close(c->fd);
				c->fd = -1;
				c->got = 0;
				c->retry_at = done;
				waiting++;
				continue;
			}
			if (done < end && fill(c, t, done)) {
				drop(c, t, done);
				waiting++;
			}
		}
	}
	pthread_mutex_lock(&connectors.lock);
	connectors.stop = 1;
	pthread_cond_broadcast(&connectors.ready);
	pthread_mutex_unlock(&connectors.lock);
	/* A connector still in connect() returns by the end of the run (SO_SNDTIMEO); one
	 * blocked on the pipe is let through by reading what it wrote. */
	for (int i = 0; i < CONNECTORS; i++) {
		while (pthread_tryjoin_np(threads[i], NULL) == EBUSY) {
			struct client *c;
			while (read(results[0], &c, sizeof(c)) == sizeof(c))
				if (c->handed_fd >= 0)
					close(c->handed_fd);
			usleep(1000);
		}
	}
	for (int i = 0; i < count; i++) {
		struct client *c = &clients[i];
		t->unanswered += c->in_flight;
		t->never_answered += c->answered == 0;
		if (c->fd >= 0)
			close(c->fd);
	}
	close(ep);
	free(clients);
}

/* Churn: `count` connect-send-close rounds (or until `end`), blocking, counting failures. */
static void run_churn(uint64_t count, uint64_t start, uint64_t end, struct tally *t,
		      uint64_t **lat)
{
	*lat = malloc(sizeof(uint64_t));
	while (now_ns() < start)
		usleep(100);
	while (t->connections < count && now_ns() < end) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			perror("loadgen: socket");
			exit(1);
		}
		if (connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
			if (errno == EAGAIN)
				t->backlog_full++;
			else
				t->refused++;
			close(fd);
			usleep(100);
			continue;
		}
		t->connections++;
		if (send(fd, request, request_len, MSG_NOSIGNAL) == (ssize_t)request_len)
			t->sent++;
		else if (errno == EAGAIN)
			t->send_failed++;
		else
			t->resets++;
		close(fd);
	}
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

/* Room for every client's socket: the soft limit up to the hard one (raised too if root). */
static int raise_nofile(int per_proc)
{
	struct rlimit rl;
	rlim_t want = (rlim_t)per_proc + 64;
	if (getrlimit(RLIMIT_NOFILE, &rl))
		return -1;
	if (rl.rlim_cur >= want)
		return 0;
	if (rl.rlim_max < want) {
		struct rlimit up = { want, want };
		if (setrlimit(RLIMIT_NOFILE, &up) == 0)
			return 0;
		return -1;
	}
	rl.rlim_cur = want;
	return setrlimit(RLIMIT_NOFILE, &rl);
}

static void usage(const char *self)
{
	fprintf(stderr,
		"usage: %s [-m closed|oneshot|pipeline|churn] [-k DEPTH] [-n COUNT (churn)] "
		"[-p PROCS] [-w WARMUP] [-g GRACE] SOCKET REQUEST_FILE CLIENTS SECONDS\n", self);
}

int main(int argc, char **argv)
{
	int procs = 1, opt;
	long long total = 0;
	double warmup = 0, grace = 2;
	const char *mode_name = "closed";
	while ((opt = getopt(argc, argv, "m:k:n:p:w:g:")) != -1) {
		switch (opt) {
		case 'm':
			mode_name = optarg;
			break;
		case 'k':
			depth = (unsigned)atoi(optarg);
			break;
		case 'n':
			total = atoll(optarg);
			break;
		case 'p':
			procs = atoi(optarg);
			break;
		case 'w':
			warmup = atof(optarg);
			break;
		case 'g':
			grace = atof(optarg);
			break;
		default:
			usage(argv[0]);
			return 2;
		}
	}
	if (!strcmp(mode_name, "closed"))
		mode = CLOSED;
	else if (!strcmp(mode_name, "oneshot"))
		mode = ONESHOT;
	else if (!strcmp(mode_name, "pipeline"))
		mode = PIPELINE;
	else if (!strcmp(mode_name, "churn") && total > 0)
		mode = CHURN;
	else {
		usage(argv[0]);
		return 2;
	}
	if (mode != PIPELINE)
		depth = 1;
	if (argc - optind != 4) {
		usage(argv[0]);
		return 2;
	}
	const char *path = argv[optind];
	FILE *f = fopen(argv[optind + 1], "rb");
	if (!f) {
		perror(argv[optind + 1]);
		return 1;
	}
	request_len = fread(request, 1, sizeof(request), f);
	fclose(f);
	int clients = atoi(argv[optind + 2]);
	double seconds = atof(argv[optind + 3]);
	if (clients < 1 || request_len < 16 || seconds <= 0 || warmup < 0 || grace < 0 ||
	    procs < 1 || procs > MAX_PROCS || depth < 1 || depth > MAX_DEPTH ||
	    strlen(path) >= sizeof(addr.sun_path)) {
		fprintf(stderr, "loadgen: bad arguments\n");
		return 2;
	}
	strcpy(addr.sun_path, path);
	if (procs > clients)
		procs = clients;
	if (raise_nofile(clients / procs + 1)) {
		fprintf(stderr, "loadgen: cannot open %d sockets per process (RLIMIT_NOFILE)\n",
			clients / procs + 1);
		return 1;
	}
	uint64_t start = now_ns() + 100000000ull;
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
			struct tally t = { 0 };
			uint64_t *lat;
			if (mode == CHURN)
				run_churn((uint64_t)(total / procs + (p < total % procs)), start,
					  end, &t, &lat);
			else
				run_share(share, start, measure_from, end, (uint64_t)(grace * 1e9),
					  &t, &lat);
			if (write_all(fds[1], &t, sizeof(t)) ||
			    write_all(fds[1], lat, t.count * sizeof(uint64_t)))
				_exit(1);
			_exit(0);
		}
		close(fds[1]);
		pipes[p] = fds[0];
	}
	struct tally sum = { 0 };
	uint64_t *lat = NULL;
	int failed = 0;
	for (int p = 0; p < procs; p++) {
		struct tally t;
		if (read_all(pipes[p], &t, sizeof(t))) {
			failed = 1;
			close(pipes[p]);
			continue;
		}
		lat = realloc(lat, (sum.count + t.count + 1) * sizeof(uint64_t));
		if (!lat || read_all(pipes[p], lat + sum.count, t.count * sizeof(uint64_t))) {
			fprintf(stderr, "loadgen: a worker failed\n");
			return 1;
		}
		uint64_t *a = &sum.sent, *b = &t.sent;
		for (size_t i = 0; i < sizeof(t) / sizeof(uint64_t); i++)
			a[i] += b[i];
		close(pipes[p]);
	}
	for (int p = 0; p < procs; p++) {
		int status;
		waitpid(pids[p], &status, 0);
		failed |= !WIFEXITED(status) || WEXITSTATUS(status);
	}
	if (failed) {
		fprintf(stderr, "loadgen: a worker failed\n");
		return 1;
	}
	qsort(lat, sum.count, sizeof(uint64_t), cmp_u64);
	printf("{\"mode\": \"%s\", \"depth\": %u, \"clients\": %d, \"procs\": %d, "
	       "\"seconds\": %.3f, \"warmup\": %.3f, \"sent\": %llu, \"answered\": %llu, "
	       "\"errors\": %llu, \"lost_on_reset\": %llu, \"unanswered\": %llu, "
	       "\"resets\": %llu, \"refused\": %llu, \"backlog_full\": %llu, "
	       "\"send_failed\": %llu, \"connections\": %llu, \"never_answered\": %llu, "
	       "\"requests\": %llu, \"rps\": %.1f, \"p50_us\": %.2f, \"p90_us\": %.2f, "
	       "\"p99_us\": %.2f, \"p999_us\": %.2f, \"max_us\": %.2f}\n",
	       mode_name, depth, clients, procs, seconds, warmup, (unsigned long long)sum.sent,
	       (unsigned long long)sum.answered, (unsigned long long)sum.errors,
	       (unsigned long long)sum.lost, (unsigned long long)sum.unanswered,
	       (unsigned long long)sum.resets, (unsigned long long)sum.refused,
	       (unsigned long long)sum.backlog_full, (unsigned long long)sum.send_failed,
	       (unsigned long long)sum.connections, (unsigned long long)sum.never_answered,
	       (unsigned long long)sum.count, (double)sum.count / seconds,
	       pct(lat, sum.count, 0.50), pct(lat, sum.count, 0.90), pct(lat, sum.count, 0.99),
	       pct(lat, sum.count, 0.999), sum.count ? (double)lat[sum.count - 1] / 1000.0 : 0);
	free(lat);
	return 0;
}
