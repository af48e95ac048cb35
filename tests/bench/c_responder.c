/*
 * The C floor of the RESOLVE throughput benchmark: a minimal single-threaded epoll server on
 * a unix socket that speaks the ACM client framing and answers every RESOLVE with a fixed
 * 88-byte cached reply (one PATH entry), as the C ibacm does for a cache hit. It does proper
 * stream framing (8-byte header prefix gives the length), so pipelined requests work.
 *
 *   c_responder SOCKET_PATH
 *
 * Prints "ready" on stdout once it listens; runs until SIGTERM/SIGINT.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define HDR_LEN 16
#define MSG_MAX 592
#define REPLY_LEN 88
#define BUF_CAP (MSG_MAX * 8)
#define MAX_EVENTS 256

struct conn {
	int fd;
	size_t used;
	unsigned char buf[BUF_CAP];
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

/* The request length: host order (little-endian) for opcode 0x01, big-endian otherwise. */
static unsigned frame_length(const unsigned char *hdr)
{
	if (hdr[1] == 0x01)
		return hdr[6] | (hdr[7] << 8);
	return (hdr[6] << 8) | hdr[7];
}

static void build_reply(unsigned char *reply, const unsigned char *request)
{
	/* Header: version, opcode kept (provider replies), status 0, data 0, length 88, tid. */
	memset(reply, 0, REPLY_LEN);
	reply[0] = 1;
	reply[1] = request[1];
	reply[6] = REPLY_LEN & 0xff;
	reply[7] = REPLY_LEN >> 8;
	memcpy(reply + 8, request + 8, 8);
	/* Entry 0: flags 0x2b (GMP|PRIMARY|BIDIRECTIONAL), type PATH (0x10). */
	reply[HDR_LEN] = 0x2b;
	reply[HDR_LEN + 4] = 0x10;
	unsigned char *path = reply + HDR_LEN + 8;
	path[8] = 0xfe; path[9] = 0x80;              /* dgid fe80::1 */
	path[23] = 0x01;
	path[24] = 0xfe; path[25] = 0x80;            /* sgid fe80::2 */
	path[39] = 0x02;
	path[41] = 0x03;                             /* dlid 3 */
	path[43] = 0x02;                             /* slid 2 */
	path[49] = 0x80;                             /* reversible */
	path[50] = 0xff; path[51] = 0xff;            /* pkey */
	path[54] = 0x85;                             /* mtu 4096 */
	path[55] = 0x90;                             /* rate */
	path[56] = 0x92;                             /* packet lifetime */
}

static int send_all(int fd, const unsigned char *data, size_t len)
{
	while (len) {
		ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				/* Closed-loop clients never fill the socket buffer; wait briefly anyway. */
				usleep(50);
				continue;
			}
			return -1;
		}
		data += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Frame and answer what the connection holds; -1 closes it. */
static int serve(struct conn *c)
{
	unsigned char replies[REPLY_LEN * (BUF_CAP / HDR_LEN)];
	size_t out = 0, off = 0;
	while (c->used - off >= 8) {
		unsigned char *hdr = c->buf + off;
		unsigned len = frame_length(hdr);
		if (hdr[0] != 1 || len < HDR_LEN || len > MSG_MAX)
			return -1;
		if (c->used - off < len)
			break;
		if ((hdr[1] & 0x0f) != 0x01)
			return -1;
		build_reply(replies + out, hdr);
		out += REPLY_LEN;
		off += len;
	}
	memmove(c->buf, c->buf + off, c->used - off);
	c->used -= off;
	return out ? send_all(c->fd, replies, out) : 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s SOCKET_PATH\n", argv[0]);
		return 2;
	}
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	if (lfd < 0 || strlen(argv[1]) >= sizeof(addr.sun_path)) {
		perror("socket");
		return 1;
	}
	strcpy(addr.sun_path, argv[1]);
	unlink(argv[1]);
	if (bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) || listen(lfd, SOMAXCONN)) {
		perror("bind/listen");
		return 1;
	}
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
	printf("ready\n");
	fflush(stdout);

	struct epoll_event events[MAX_EVENTS];
	while (!stop) {
		int n = epoll_wait(ep, events, MAX_EVENTS, 200);
		for (int i = 0; i < n; i++) {
			struct conn *c = events[i].data.ptr;
			if (!c) {
				int fd;
				while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
					c = calloc(1, sizeof(*c));
					if (!c) {
						close(fd);
						continue;
					}
					c->fd = fd;
					struct epoll_event cev = { .events = EPOLLIN, .data.ptr = c };
					epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
				}
				continue;
			}
			ssize_t got = recv(c->fd, c->buf + c->used, BUF_CAP - c->used, 0);
			if (got < 0 && (errno == EAGAIN || errno == EINTR))
				continue;
			if (got <= 0) {
				close(c->fd);
				free(c);
				continue;
			}
			c->used += (size_t)got;
			if (serve(c)) {
				close(c->fd);
				free(c);
			}
		}
	}
	close(lfd);
	unlink(argv[1]);
	return 0;
}
