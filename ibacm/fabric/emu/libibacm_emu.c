/* libibacm_emu.so: an emulated HCA for unmodified programs linked against libibverbs.so.1 and
 * libibumad.so.3 (rdma-core's C ibacm and its libibacmp.so provider, pyverbs, ...).
 *
 * Loaded with LD_PRELOAD, it defines the verbs and umad entry points those programs call and
 * the fast paths libibverbs inlines (post_send/post_recv/poll_cq/req_notify_cq through
 * context->ops). Every call is marshalled to the node's device process (a Python program on the
 * project's simulated fabric) over SOCK_SEQPACKET connections to $IBACM_EMU_SOCKET; the logic
 * (QPs, multicast, SA, events, faults) lives there. This file only keeps what must be local to
 * the process: the C objects handed out, posted receive buffers (a received message is copied
 * into them, GRH first, as an HCA does), and file descriptors that poll/epoll can wait on: a
 * completion channel, a context's async events and a umad port are each a connection of their
 * own that the device writes to.
 *
 * The symbols are unversioned: the dynamic linker binds a versioned reference such as
 * ibv_open_device@IBVERBS_1.1 to an unversioned definition of a preloaded object. */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/umad.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "emu_protocol.h"

#undef ibv_query_port
#undef ibv_reg_mr

#define EXPORT __attribute__((visibility("default")))
#define MAX_IDS 4096
#define MAX_MSG (sizeof(struct emu_wc) + 4096)

struct emu_device {
	struct ibv_device dev; /* first: handed out as struct ibv_device * */
	struct emu_dev_info info;
	uint32_t index;
};

struct emu_context {
	struct ibv_context ctx; /* first */
	pthread_mutex_t lock;   /* one request and its reply at a time on ctx.cmd_fd */
	struct emu_device *edev;
	uint32_t id;
};

struct emu_cq {
	struct ibv_cq cq;
	int data_fd;
	uint32_t id;
	uint32_t polled; /* completions read from data_fd: the consumer index an arm carries */
	pthread_mutex_t poll_lock;
};

struct recv_wr {
	uint64_t wr_id;
	int num_sge;
	struct ibv_sge sge[4];
};

struct emu_qp {
	struct ibv_qp qp;
	uint32_t id;
	int sq_sig_all;
	pthread_mutex_t rq_lock;
	struct recv_wr *rq;
	uint32_t rq_size, rq_head, rq_count;
};

struct emu_channel {
	struct ibv_comp_channel channel; /* first */
	uint32_t id;
};

struct emu_ah {
	struct ibv_ah ah;
	struct ibv_ah_attr attr;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct emu_qp *qp_by_id[MAX_IDS];
static struct emu_cq *cq_by_id[MAX_IDS];
static struct emu_device *devices;
static int device_count = -1;

static int umad_ids[1024]; /* umad port fd -> device's umad id */

/* -- connections ------------------------------------------------------------------------ */

static int emu_connect(void)
{
	const char *path = getenv(EMU_SOCKET_ENV);
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int fd;

	if (!path || !*path || strlen(path) >= sizeof(addr.sun_path)) {
		errno = ENODEV;
		return -1;
	}
	strcpy(addr.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		int saved = errno;
		close(fd);
		errno = saved == ENOENT || saved == ECONNREFUSED ? ENODEV : saved;
		return -1;
	}
	return fd;
}

static ssize_t send_msg(int fd, const struct emu_req *req, const void *p1, size_t n1,
			const void *p2, size_t n2)
{
	struct iovec iov[3] = {
		{(void *)req, sizeof(*req)}, {(void *)p1, n1}, {(void *)p2, n2}};
	struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 3};
	ssize_t n;

	do
		n = sendmsg(fd, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n;
}

/* One request and its reply; returns the reply status (0 or -errno), payload into out. A
 * reply longer than MAX_MSG is no reply of a fixed-size op: -EMSGSIZE, never a cut one. */
static int call_fd(int fd, struct emu_req *req, const void *payload, size_t len,
		   struct emu_rep *rep, void *out, size_t out_len)
{
	char buf[MAX_MSG];
	struct iovec iov = {buf, sizeof(buf)};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n;

	if (send_msg(fd, req, payload, len, NULL, 0) < 0)
		return -errno;
	do
		n = recvmsg(fd, &msg, 0);
	while (n < 0 && errno == EINTR);
	if (n < (ssize_t)sizeof(*rep))
		return n < 0 ? -errno : -EPROTO;
	if (msg.msg_flags & MSG_TRUNC)
		return -EMSGSIZE;
	memcpy(rep, buf, sizeof(*rep));
	if (out && out_len) {
		size_t have = (size_t)n - sizeof(*rep);
		memset(out, 0, out_len);
		memcpy(out, buf + sizeof(*rep), have < out_len ? have : out_len);
	}
	return rep->status;
}

static int ctx_call(struct ibv_context *context, struct emu_req *req, const void *payload,
		    size_t len, struct emu_rep *rep, void *out, size_t out_len)
{
	struct emu_context *ectx = (struct emu_context *)context;
	int ret;

	req->dev = ectx->edev->index;
	pthread_mutex_lock(&ectx->lock);
	ret = call_fd(context->cmd_fd, req, payload, len, rep, out, out_len);
	pthread_mutex_unlock(&ectx->lock);
	return ret;
}

/* One request with no reply (a doorbell); returns 0 or the errno of a failed send (EPIPE:
 * the device process is gone), which the verbs call returns. */
static int ctx_post(struct ibv_context *context, struct emu_req *req, const void *p1,
		    size_t n1, const void *p2, size_t n2)
{
	struct emu_context *ectx = (struct emu_context *)context;
	int err;

	req->dev = ectx->edev->index;
	pthread_mutex_lock(&ectx->lock);
	err = send_msg(context->cmd_fd, req, p1, n1, p2, n2) < 0 ? errno : 0;
	pthread_mutex_unlock(&ectx->lock);
	return err;
}

/* One request whose reply payload has no fixed size (LIST): its size is peeked first, so
 * nothing is cut. Returns the reply status; the payload in *out (malloc'd, *out_len bytes). */
static int call_fd_sized(int fd, struct emu_req *req, struct emu_rep *rep, void **out,
			 size_t *out_len)
{
	struct iovec iov[2] = {{rep, sizeof(*rep)}, {NULL, 0}};
	struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
	ssize_t size, n;

	*out = NULL;
	*out_len = 0;
	if (send_msg(fd, req, NULL, 0, NULL, 0) < 0)
		return -errno;
	do
		size = recv(fd, NULL, 0, MSG_PEEK | MSG_TRUNC);
	while (size < 0 && errno == EINTR);
	if (size < (ssize_t)sizeof(*rep))
		return size < 0 ? -errno : -EPROTO;
	iov[1].iov_len = (size_t)size - sizeof(*rep);
	iov[1].iov_base = malloc(iov[1].iov_len + 1);
	if (!iov[1].iov_base)
		return -ENOMEM;
	do
		n = recvmsg(fd, &msg, 0);
	while (n < 0 && errno == EINTR);
	if (n != size || (msg.msg_flags & MSG_TRUNC)) {
		free(iov[1].iov_base);
		return n < 0 ? -errno : -EPROTO;
	}
	*out = iov[1].iov_base;
	*out_len = iov[1].iov_len;
	return rep->status;
}

/* A new connection whose first message names what it is for (channel, CQ data, async...). */
static int open_stream(struct emu_req *req, struct emu_rep *rep)
{
	int fd = emu_connect();
	int ret;

	if (fd < 0)
		return -1;
	ret = call_fd(fd, req, NULL, 0, rep, NULL, 0);
	if (ret) {
		close(fd);
		errno = -ret;
		return -1;
	}
	return fd;
}

/* A verbs call's result: 0, or an errno value also left in errno (as ibv_post_* return). */
static int fail(int err)
{
	if (err)
		errno = err;
	return err;
}

/* -- devices ------------------------------------------------------------------------------ */

static int load_devices(void)
{
	struct emu_req req = {.op = EMU_OP_LIST};
	struct emu_rep rep;
	struct emu_dev_info *infos;
	void *payload;
	size_t len;
	int fd, ret, i;

	pthread_mutex_lock(&registry_lock);
	if (device_count >= 0) {
		pthread_mutex_unlock(&registry_lock);
		return device_count;
	}
	fd = emu_connect();
	if (fd < 0) {
		pthread_mutex_unlock(&registry_lock);
		return -1;
	}
	ret = call_fd_sized(fd, &req, &rep, &payload, &len);
	close(fd);
	if (!ret && len != (size_t)rep.a * sizeof(*infos))
		ret = -EPROTO; /* the count and the records disagree */
	if (ret) {
		free(payload);
		pthread_mutex_unlock(&registry_lock);
		errno = -ret;
		return -1;
	}
	infos = payload;
	devices = calloc(rep.a ? rep.a : 1, sizeof(*devices));
	for (i = 0; devices && i < (int)rep.a; i++) {
		struct emu_device *d = &devices[i];
		d->info = infos[i];
		d->index = (uint32_t)i;
		d->dev.node_type = IBV_NODE_CA;
		d->dev.transport_type = IBV_TRANSPORT_IB;
		snprintf(d->dev.name, sizeof(d->dev.name), "%.*s", EMU_NAME_LEN, infos[i].name);
		snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", i);
		snprintf(d->dev.dev_path, sizeof(d->dev.dev_path),
			 "/sys/class/infiniband_verbs/uverbs%d", i);
		snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "/sys/class/infiniband/%s",
			 d->dev.name);
	}
	free(payload);
	device_count = devices ? (int)rep.a : -1;
	pthread_mutex_unlock(&registry_lock);
	return device_count;
}

static struct emu_device *device_named(const char *name)
{
	int i, n = load_devices();

	for (i = 0; i < n; i++)
		if (!name || !strcmp(devices[i].dev.name, name))
			return &devices[i];
	return NULL;
}

EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	struct ibv_device **list;
	int i, n = load_devices();

	if (num_devices)
		*num_devices = 0;
	if (n < 0) {
		errno = ENOSYS; /* what libibverbs says when there is no RDMA device at all */
		return NULL;
	}
	list = calloc((size_t)n + 1, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	for (i = 0; i < n; i++)
		list[i] = &devices[i].dev;
	if (num_devices)
		*num_devices = n;
	return list;
}

EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list); /* the devices themselves live as long as the process */
}

EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	return ((struct emu_device *)device)->info.node_guid;
}

EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	return (int)((struct emu_device *)device)->index;
}

/* -- fast paths (context->ops) ----------------------------------------------------------- */

static int emu_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
static int emu_req_notify_cq(struct ibv_cq *cq, int solicited_only);
static int emu_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int emu_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct emu_device *edev = (struct emu_device *)device;
	struct emu_context *ectx;
	struct emu_req req = {.op = EMU_OP_OPEN, .dev = edev->index};
	struct emu_rep rep;
	int fd, ret;

	fd = emu_connect();
	if (fd < 0)
		return NULL;
	ret = call_fd(fd, &req, NULL, 0, &rep, NULL, 0);
	if (ret) {
		close(fd);
		errno = -ret;
		return NULL;
	}
	ectx = calloc(1, sizeof(*ectx));
	if (!ectx) {
		close(fd);
		errno = ENOMEM;
		return NULL;
	}
	ectx->edev = edev;
	ectx->id = rep.a;
	pthread_mutex_init(&ectx->lock, NULL);
	ectx->ctx.device = device;
	ectx->ctx.cmd_fd = fd;
	ectx->ctx.num_comp_vectors = 1;
	ectx->ctx.abi_compat = NULL; /* not a verbs_context: inline helpers take the legacy calls */
	pthread_mutex_init(&ectx->ctx.mutex, NULL);
	ectx->ctx.ops.poll_cq = emu_poll_cq;
	ectx->ctx.ops.req_notify_cq = emu_req_notify_cq;
	ectx->ctx.ops.post_send = emu_post_send;
	ectx->ctx.ops.post_recv = emu_post_recv;
	req = (struct emu_req){.op = EMU_OP_ASYNC, .a = ectx->id};
	ectx->ctx.async_fd = open_stream(&req, &rep);
	if (ectx->ctx.async_fd < 0) {
		int saved = errno;
		close(fd);
		free(ectx);
		errno = saved;
		return NULL;
	}
	return &ectx->ctx;
}

EXPORT int ibv_close_device(struct ibv_context *context)
{
	struct emu_context *ectx = (struct emu_context *)context;

	close(context->async_fd);
	close(context->cmd_fd);
	pthread_mutex_destroy(&ectx->lock);
	free(ectx);
	return 0;
}

EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	struct emu_dev_info *info = &((struct emu_context *)context)->edev->info;

	memset(attr, 0, sizeof(*attr));
	snprintf(attr->fw_ver, sizeof(attr->fw_ver), "%s", info->fw_ver);
	attr->node_guid = info->node_guid;
	attr->sys_image_guid = info->sys_guid;
	attr->max_mr_size = UINT64_MAX;
	attr->page_size_cap = 0xfffff000;
	attr->vendor_id = info->vendor_id;
	attr->vendor_part_id = info->vendor_part_id;
	attr->hw_ver = info->hw_ver;
	attr->max_qp = MAX_IDS;
	attr->max_qp_wr = 16384;
	attr->max_sge = 4;
	attr->max_cq = MAX_IDS;
	attr->max_cqe = 65536;
	attr->max_mr = 1 << 20;
	attr->max_pd = 1 << 20;
	attr->max_ah = 1 << 20;
	attr->max_mcast_grp = 1024;
	attr->max_mcast_qp_attach = 64;
	attr->max_total_mcast_qp_attach = 65536;
	attr->max_pkeys = 128;
	attr->local_ca_ack_delay = 16;
	attr->phys_port_cnt = (uint8_t)info->ports;
	return 0;
}

EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
			  struct _compat_ibv_port_attr *compat)
{
	struct ibv_port_attr *attr = (struct ibv_port_attr *)compat;
	struct emu_req req = {.op = EMU_OP_QUERY_PORT, .a = port_num};
	struct emu_port_attr pa;
	struct emu_rep rep;
	int ret = ctx_call(context, &req, NULL, 0, &rep, &pa, sizeof(pa));

	if (ret)
		return fail(-ret);
	/* The inline caller cleared the whole (current) struct before calling. */
	attr->state = (enum ibv_port_state)pa.state;
	attr->max_mtu = (enum ibv_mtu)pa.max_mtu;
	attr->active_mtu = (enum ibv_mtu)pa.active_mtu;
	attr->gid_tbl_len = (int)pa.gid_tbl_len;
	attr->port_cap_flags = pa.port_cap_flags;
	attr->max_msg_sz = pa.max_msg_sz;
	attr->bad_pkey_cntr = 0;
	attr->qkey_viol_cntr = 0;
	attr->pkey_tbl_len = (uint16_t)pa.pkey_tbl_len;
	attr->lid = (uint16_t)pa.lid;
	attr->sm_lid = (uint16_t)pa.sm_lid;
	attr->lmc = (uint8_t)pa.lmc;
	attr->max_vl_num = (uint8_t)pa.max_vl_num;
	attr->sm_sl = (uint8_t)pa.sm_sl;
	attr->subnet_timeout = (uint8_t)pa.subnet_timeout;
	attr->init_type_reply = 0;
	attr->active_width = (uint8_t)pa.active_width;
	attr->active_speed = (uint8_t)pa.active_speed;
	attr->phys_state = (uint8_t)pa.phys_state;
	attr->link_layer = (uint8_t)pa.link_layer;
	return 0;
}

EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index,
			 union ibv_gid *gid)
{
	struct emu_req req = {.op = EMU_OP_QUERY_GID, .a = port_num, .b = (uint32_t)index};
	struct emu_rep rep;
	int ret = ctx_call(context, &req, NULL, 0, &rep, gid->raw, sizeof(gid->raw));

	return ret ? -1 : 0;
}

EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index,
			  __be16 *pkey)
{
	struct emu_req req = {.op = EMU_OP_QUERY_PKEY, .a = port_num, .b = (uint32_t)index};
	struct emu_rep rep;
	int ret = ctx_call(context, &req, NULL, 0, &rep, NULL, 0);

	if (ret)
		return -1;
	*pkey = htobe16((uint16_t)rep.a);
	return 0;
}

EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	__be16 entry;
	int i;

	for (i = 0; i < 128; i++) {
		if (ibv_query_pkey(context, port_num, i, &entry))
			return -1;
		if (entry == pkey)
			return i;
	}
	return -1;
}

EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	struct emu_async rec;
	ssize_t n;

	do
		n = recv(context->async_fd, &rec, sizeof(rec), 0);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(rec))
		return -1; /* EAGAIN on a non-blocking fd, or the device went away */
	memset(event, 0, sizeof(*event));
	event->event_type = (enum ibv_event_type)rec.event_type;
	event->element.port_num = (int)rec.port_num;
	return 0;
}

EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	(void)event; /* nothing is held for an event: destroy never waits for acks */
}

/* -- PD, MR, AH (local objects: the device needs none of them) -------------------------- */

EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));

	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->context = context;
	return pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
				       uint64_t iova, unsigned int access)
{
	static uint32_t next_key = 0x100;
	struct ibv_mr *mr = calloc(1, sizeof(*mr));

	(void)iova;
	(void)access;
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = addr;
	mr->length = length;
	mr->lkey = mr->rkey = __atomic_fetch_add(&next_key, 1, __ATOMIC_RELAXED);
	return mr;
}

EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	free(mr);
	return 0;
}

EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct emu_ah *ah = calloc(1, sizeof(*ah));

	if (!ah) {
		errno = ENOMEM;
		return NULL;
	}
	ah->ah.context = pd->context;
	ah->ah.pd = pd;
	ah->attr = *attr;
	return &ah->ah;
}

EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	free(ah);
	return 0;
}

/* -- completion channels and CQs ---------------------------------------------------------- */

EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct emu_context *ectx = (struct emu_context *)context;
	struct emu_req req = {.op = EMU_OP_CHANNEL, .a = ectx->id};
	struct emu_rep rep;
	struct emu_channel *ech = calloc(1, sizeof(*ech));

	if (!ech) {
		errno = ENOMEM;
		return NULL;
	}
	ech->channel.fd = open_stream(&req, &rep);
	if (ech->channel.fd < 0) {
		free(ech);
		return NULL;
	}
	ech->id = rep.a;
	ech->channel.context = context;
	return &ech->channel;
}

EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	close(channel->fd);
	free(channel);
	return 0;
}

EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
				    struct ibv_comp_channel *channel, int comp_vector)
{
	struct emu_req req = {.op = EMU_OP_CREATE_CQ, .a = channel ? ((struct emu_channel *)channel)->id : 0,
			      .b = (uint32_t)cqe};
	struct emu_rep rep;
	struct emu_cq *ecq;
	int ret;

	(void)comp_vector;
	ret = ctx_call(context, &req, NULL, 0, &rep, NULL, 0);
	if (ret || rep.a >= MAX_IDS) {
		errno = ret ? -ret : ENOMEM;
		return NULL;
	}
	ecq = calloc(1, sizeof(*ecq));
	if (!ecq) {
		errno = ENOMEM;
		return NULL;
	}
	ecq->id = rep.a;
	req = (struct emu_req){.op = EMU_OP_CQ_DATA, .a = ecq->id};
	ecq->data_fd = open_stream(&req, &rep);
	if (ecq->data_fd < 0) {
		free(ecq);
		return NULL;
	}
	pthread_mutex_init(&ecq->poll_lock, NULL);
	ecq->cq.context = context;
	ecq->cq.channel = channel;
	ecq->cq.cq_context = cq_context;
	ecq->cq.handle = ecq->id;
	ecq->cq.cqe = cqe;
	pthread_mutex_init(&ecq->cq.mutex, NULL);
	pthread_cond_init(&ecq->cq.cond, NULL);
	pthread_mutex_lock(&registry_lock);
	cq_by_id[ecq->id] = ecq;
	pthread_mutex_unlock(&registry_lock);
	return &ecq->cq;
}

EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct emu_cq *ecq = (struct emu_cq *)cq;
	struct emu_req req = {.op = EMU_OP_DESTROY_CQ, .a = ecq->id};
	struct emu_rep rep;
	int ret = ctx_call(cq->context, &req, NULL, 0, &rep, NULL, 0);

	if (ret)
		return -ret;
	pthread_mutex_lock(&registry_lock);
	cq_by_id[ecq->id] = NULL;
	pthread_mutex_unlock(&registry_lock);
	close(ecq->data_fd);
	free(ecq);
	return 0;
}

EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
			    void **cq_context)
{
	uint32_t id;
	ssize_t n;

	do
		n = recv(channel->fd, &id, sizeof(id), 0);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(id) || id >= MAX_IDS)
		return -1;
	pthread_mutex_lock(&registry_lock);
	*cq = cq_by_id[id] ? &cq_by_id[id]->cq : NULL;
	pthread_mutex_unlock(&registry_lock);
	if (!*cq)
		return -1;
	*cq_context = (*cq)->cq_context;
	return 0;
}

EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_mutex_unlock(&cq->mutex);
}

/* Posted, as an HCA's arm doorbell is, with the consumer index (completions polled so far):
 * the device raises the event at once if it wrote more, so nothing waits for an answer and no
 * completion is missed (one polled meanwhile makes the event spurious). */
static int emu_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	struct emu_cq *ecq = (struct emu_cq *)cq;
	struct emu_req req = {.op = EMU_OP_ARM_CQ, .a = ecq->id};

	(void)solicited_only;
	pthread_mutex_lock(&ecq->poll_lock);
	req.b = ecq->polled;
	pthread_mutex_unlock(&ecq->poll_lock);
	return fail(ctx_post(cq->context, &req, NULL, 0, NULL, 0));
}

static void scatter(const struct recv_wr *rwr, const uint8_t *data, size_t len)
{
	int i;

	for (i = 0; i < rwr->num_sge && len; i++) {
		size_t n = rwr->sge[i].length < len ? rwr->sge[i].length : len;
		memcpy((void *)(uintptr_t)rwr->sge[i].addr, data, n);
		data += n;
		len -= n;
	}
}

static int take_recv(struct emu_qp *qp, struct recv_wr *out)
{
	int ok = 0;

	pthread_mutex_lock(&qp->rq_lock);
	if (qp->rq_count) {
		*out = qp->rq[qp->rq_head];
		qp->rq_head = (qp->rq_head + 1) % qp->rq_size;
		qp->rq_count--;
		ok = 1;
	}
	pthread_mutex_unlock(&qp->rq_lock);
	return ok;
}

/* A receive: GRH area (40 bytes, written when a GRH came) then the payload, as an HCA does. */
static void fill_recv(struct emu_qp *qp, const struct emu_wc *m, const uint8_t *payload,
		      struct ibv_wc *wc)
{
	struct recv_wr rwr;
	uint8_t data[40 + 4096];
	size_t len = 40 + m->byte_len;

	if (!take_recv(qp, &rwr)) {
		wc->status = IBV_WC_LOC_QP_OP_ERR;
		return;
	}
	memset(data, 0, 40);
	if (m->grh_present)
		memcpy(data, m->grh, 40);
	memcpy(data + 40, payload, m->byte_len);
	scatter(&rwr, data, len);
	wc->wr_id = rwr.wr_id;
	wc->status = (enum ibv_wc_status)m->status;
	wc->opcode = IBV_WC_RECV;
	wc->byte_len = (uint32_t)len;
	wc->src_qp = m->src_qp;
	wc->slid = (uint16_t)m->slid;
	wc->sl = (uint8_t)m->sl;
	wc->dlid_path_bits = (uint8_t)m->path_bits;
	wc->pkey_index = (uint16_t)m->pkey_index;
	wc->wc_flags = m->grh_present ? IBV_WC_GRH : 0;
}

static int emu_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	struct emu_cq *ecq = (struct emu_cq *)cq;
	char buf[MAX_MSG];
	int done = 0;

	pthread_mutex_lock(&ecq->poll_lock);
	while (done < num_entries) {
		const struct emu_wc *m = (const struct emu_wc *)buf;
		struct emu_qp *qp;
		ssize_t n = recv(ecq->data_fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n <= 0)
			break; /* empty (EAGAIN) */
		ecq->polled++; /* a record the device counted as written, usable or not */
		if (n < (ssize_t)sizeof(*m) || m->qp_id >= MAX_IDS ||
		    (size_t)n < sizeof(*m) + (m->kind ? m->byte_len : 0))
			break; /* nothing usable */
		pthread_mutex_lock(&registry_lock);
		qp = qp_by_id[m->qp_id];
		pthread_mutex_unlock(&registry_lock);
		if (!qp)
			continue; /* the QP was destroyed meanwhile */
		memset(&wc[done], 0, sizeof(wc[done]));
		wc[done].qp_num = qp->qp.qp_num;
		if (m->kind) {
			fill_recv(qp, m, (const uint8_t *)(m + 1), &wc[done]);
		} else {
			wc[done].wr_id = m->wr_id;
			wc[done].status = (enum ibv_wc_status)m->status;
			wc[done].opcode = IBV_WC_SEND;
		}
		done++;
	}
	pthread_mutex_unlock(&ecq->poll_lock);
	return done;
}

/* -- QPs ---------------------------------------------------------------------------------- */

EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct emu_cq *scq = (struct emu_cq *)attr->send_cq, *rcq = (struct emu_cq *)attr->recv_cq;
	struct emu_req req = {.op = EMU_OP_CREATE_QP, .c = attr->qp_type,
			      .d = (uint32_t)attr->sq_sig_all};
	struct emu_rep rep;
	struct emu_qp *qp;
	int ret;

	if (attr->qp_type != IBV_QPT_UD || !scq || !rcq || attr->srq ||
	    attr->cap.max_recv_sge > 4) {
		errno = EOPNOTSUPP; /* the emulated HCA offers UD QPs only */
		return NULL;
	}
	req.a = scq->id;
	req.b = rcq->id;
	ret = ctx_call(pd->context, &req, NULL, 0, &rep, NULL, 0);
	if (ret || rep.a >= MAX_IDS) {
		errno = ret ? -ret : ENOMEM;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (qp)
		qp->rq = calloc(attr->cap.max_recv_wr + 1, sizeof(*qp->rq));
	if (!qp || !qp->rq) {
		free(qp);
		errno = ENOMEM;
		return NULL;
	}
	qp->id = rep.a;
	qp->rq_size = attr->cap.max_recv_wr + 1;
	qp->sq_sig_all = attr->sq_sig_all;
	pthread_mutex_init(&qp->rq_lock, NULL);
	qp->qp.context = pd->context;
	qp->qp.qp_context = attr->qp_context;
	qp->qp.pd = pd;
	qp->qp.send_cq = attr->send_cq;
	qp->qp.recv_cq = attr->recv_cq;
	qp->qp.handle = qp->id;
	qp->qp.qp_num = rep.b;
	qp->qp.state = IBV_QPS_RESET;
	qp->qp.qp_type = IBV_QPT_UD;
	pthread_mutex_init(&qp->qp.mutex, NULL);
	pthread_cond_init(&qp->qp.cond, NULL);
	attr->cap.max_inline_data = 0;
	pthread_mutex_lock(&registry_lock);
	qp_by_id[qp->id] = qp;
	pthread_mutex_unlock(&registry_lock);
	return &qp->qp;
}

EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct emu_qp *eqp = (struct emu_qp *)qp;
	struct emu_req req = {.op = EMU_OP_MODIFY_QP, .a = eqp->id, .b = (uint32_t)attr_mask,
			      .c = attr->qp_state};
	struct emu_qp_mod mod = {attr->port_num, attr->pkey_index, attr->qkey, 0};
	struct emu_rep rep;
	int ret = ctx_call(qp->context, &req, &mod, sizeof(mod), &rep, NULL, 0);

	if (ret)
		return -ret;
	if (attr_mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	return 0;
}

EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
			struct ibv_qp_init_attr *init_attr)
{
	struct emu_qp *eqp = (struct emu_qp *)qp;

	(void)attr_mask;
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = attr->cur_qp_state = qp->state;
	attr->cap.max_recv_wr = eqp->rq_size - 1;
	attr->cap.max_recv_sge = 4;
	attr->cap.max_send_sge = 4;
	if (init_attr) {
		memset(init_attr, 0, sizeof(*init_attr));
		init_attr->qp_context = qp->qp_context;
		init_attr->send_cq = qp->send_cq;
		init_attr->recv_cq = qp->recv_cq;
		init_attr->qp_type = qp->qp_type;
		init_attr->sq_sig_all = eqp->sq_sig_all;
		init_attr->cap = attr->cap;
	}
	return 0;
}

EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct emu_qp *eqp = (struct emu_qp *)qp;
	struct emu_req req = {.op = EMU_OP_DESTROY_QP, .a = eqp->id};
	struct emu_rep rep;
	int ret = ctx_call(qp->context, &req, NULL, 0, &rep, NULL, 0);

	if (ret)
		return -ret;
	pthread_mutex_lock(&registry_lock);
	qp_by_id[eqp->id] = NULL;
	pthread_mutex_unlock(&registry_lock);
	free(eqp->rq);
	free(eqp);
	return 0;
}

static int emu_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct emu_qp *eqp = (struct emu_qp *)qp;

	for (; wr; wr = wr->next) {
		struct emu_ah *ah = (struct emu_ah *)wr->wr.ud.ah;
		struct emu_req req = {.op = EMU_OP_POST_SEND, .a = eqp->id,
				      .c = wr->wr.ud.remote_qpn, .d = wr->wr.ud.remote_qkey};
		struct emu_send s = {.wr_id = wr->wr_id};
		uint8_t data[4096];
		size_t len = 0;
		int i, err;

		if (qp->state != IBV_QPS_RTS || !ah ||
		    (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM)) {
			*bad = wr;
			return fail(EINVAL);
		}
		for (i = 0; i < wr->num_sge; i++) {
			if (len + wr->sg_list[i].length > sizeof(data)) {
				*bad = wr;
				return fail(EINVAL);
			}
			memcpy(data + len, (void *)(uintptr_t)wr->sg_list[i].addr,
			       wr->sg_list[i].length);
			len += wr->sg_list[i].length;
		}
		req.b = eqp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
		s.dlid = ah->attr.dlid;
		s.sl = ah->attr.sl;
		s.src_path_bits = ah->attr.src_path_bits;
		s.static_rate = ah->attr.static_rate;
		s.is_global = ah->attr.is_global;
		s.flow_label = ah->attr.grh.flow_label;
		s.sgid_index = ah->attr.grh.sgid_index;
		s.hop_limit = ah->attr.grh.hop_limit;
		s.traffic_class = ah->attr.grh.traffic_class;
		memcpy(s.dgid, ah->attr.grh.dgid.raw, 16);
		s.length = (uint32_t)len;
		err = ctx_post(qp->context, &req, &s, sizeof(s), data, len);
		if (err) {
			*bad = wr; /* this one and those after it were not posted */
			return fail(err);
		}
	}
	return 0;
}

static int emu_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct emu_qp *eqp = (struct emu_qp *)qp;
	struct emu_req req = {.op = EMU_OP_POST_RECV, .a = eqp->id};
	struct ibv_recv_wr *first = wr;
	uint32_t posted = 0;
	int ret = 0, err;

	/* Held until the device is told, so that posts reach it in the order of the queue. */
	pthread_mutex_lock(&eqp->rq_lock);
	for (; wr; wr = wr->next) {
		struct recv_wr *slot;
		int i;

		if (eqp->rq_count + 1 >= eqp->rq_size || wr->num_sge > 4) {
			*bad = wr;
			ret = ENOMEM;
			break;
		}
		slot = &eqp->rq[(eqp->rq_head + eqp->rq_count) % eqp->rq_size];
		slot->wr_id = wr->wr_id;
		slot->num_sge = wr->num_sge;
		for (i = 0; i < wr->num_sge; i++)
			slot->sge[i] = wr->sg_list[i];
		eqp->rq_count++;
		posted++;
	}
	if (posted) {
		req.b = posted; /* the device delivers only into posted buffers */
		err = ctx_post(qp->context, &req, NULL, 0, NULL, 0);
		if (err) {
			/* The device never heard of them: none of this call's buffers is posted. */
			eqp->rq_count -= posted;
			*bad = first;
			ret = err;
		}
	}
	pthread_mutex_unlock(&eqp->rq_lock);
	return fail(ret);
}

static int mcast(struct ibv_qp *qp, uint32_t op, const union ibv_gid *gid, uint16_t lid)
{
	struct emu_req req = {.op = op, .a = ((struct emu_qp *)qp)->id, .b = lid};
	struct emu_rep rep;
	int ret = ctx_call(qp->context, &req, gid->raw, 16, &rep, NULL, 0);

	return ret ? fail(-ret) : 0;
}

EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return mcast(qp, EMU_OP_ATTACH, gid, lid);
}

EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return mcast(qp, EMU_OP_DETACH, gid, lid);
}

/* -- umad --------------------------------------------------------------------------------- */

static int umad_debug_level;

EXPORT int umad_init(void)
{
	return load_devices() < 0 ? -1 : 0;
}

EXPORT int umad_done(void)
{
	return 0;
}

EXPORT int umad_debug(int level)
{
	if (level >= 0)
		umad_debug_level = level;
	return umad_debug_level;
}

EXPORT int umad_get_cas_names(char cas[][UMAD_CA_NAME_LEN], int max)
{
	int i, n = load_devices();

	if (n < 0)
		return -ENODEV;
	for (i = 0; i < n && i < max; i++)
		snprintf(cas[i], UMAD_CA_NAME_LEN, "%s", devices[i].dev.name);
	return i;
}

static int query_port_by_index(uint32_t dev, int port, struct emu_port_attr *pa,
			       uint8_t gid[16], uint16_t *pkeys, unsigned *npkeys)
{
	struct emu_req req = {.op = EMU_OP_QUERY_PORT, .dev = dev, .a = (uint32_t)port};
	struct emu_rep rep;
	int fd = emu_connect(), ret;
	unsigned i;

	if (fd < 0)
		return -ENODEV;
	ret = call_fd(fd, &req, NULL, 0, &rep, pa, sizeof(*pa));
	req = (struct emu_req){.op = EMU_OP_QUERY_GID, .dev = dev, .a = (uint32_t)port};
	if (!ret)
		ret = call_fd(fd, &req, NULL, 0, &rep, gid, 16);
	for (i = 0; !ret && i < pa->pkey_tbl_len && i < *npkeys; i++) {
		req = (struct emu_req){.op = EMU_OP_QUERY_PKEY, .dev = dev, .a = (uint32_t)port,
				       .b = i};
		if (call_fd(fd, &req, NULL, 0, &rep, NULL, 0))
			break;
		pkeys[i] = (uint16_t)rep.a;
	}
	*npkeys = i;
	close(fd);
	return ret;
}

EXPORT int umad_get_port(const char *ca_name, int portnum, umad_port_t *port)
{
	struct emu_device *d = device_named(ca_name);
	struct emu_port_attr pa;
	uint8_t gid[16];
	uint16_t pkeys[128];
	unsigned npkeys = 128;
	int ret;

	if (!d)
		return -ENODEV;
	if (portnum < 1 || portnum > (int)d->info.ports)
		return -EINVAL;
	ret = query_port_by_index(d->index, portnum, &pa, gid, pkeys, &npkeys);
	if (ret)
		return ret;
	memset(port, 0, sizeof(*port));
	snprintf(port->ca_name, sizeof(port->ca_name), "%s", d->dev.name);
	port->portnum = portnum;
	port->base_lid = pa.lid;
	port->lmc = pa.lmc;
	port->sm_lid = pa.sm_lid;
	port->sm_sl = pa.sm_sl;
	port->state = pa.state;
	port->phys_state = pa.phys_state;
	port->rate = pa.rate_gbps;
	port->capmask = htobe32(pa.port_cap_flags);
	memcpy(&port->gid_prefix, gid, 8);
	memcpy(&port->port_guid, gid + 8, 8);
	port->pkeys = calloc(npkeys ? npkeys : 1, sizeof(uint16_t));
	if (!port->pkeys)
		return -ENOMEM;
	memcpy(port->pkeys, pkeys, npkeys * sizeof(uint16_t));
	port->pkeys_size = npkeys;
	snprintf(port->link_layer, sizeof(port->link_layer), "InfiniBand");
	return 0;
}

EXPORT int umad_release_port(umad_port_t *port)
{
	free(port->pkeys);
	port->pkeys = NULL;
	return 0;
}

EXPORT int umad_get_ca(const char *ca_name, umad_ca_t *ca)
{
	struct emu_device *d = device_named(ca_name);
	int p;

	if (!d)
		return -ENODEV;
	memset(ca, 0, sizeof(*ca));
	snprintf(ca->ca_name, sizeof(ca->ca_name), "%s", d->dev.name);
	ca->node_type = IBV_NODE_CA;
	ca->numports = (int)d->info.ports;
	snprintf(ca->fw_ver, sizeof(ca->fw_ver), "%s", d->info.fw_ver);
	snprintf(ca->ca_type, sizeof(ca->ca_type), "ibacm emulated HCA");
	ca->node_guid = d->info.node_guid;
	ca->system_guid = d->info.sys_guid;
	/* Indexed by port number, as libibumad does. */
	for (p = 1; p <= ca->numports && p < UMAD_CA_MAX_PORTS; p++) {
		ca->ports[p] = calloc(1, sizeof(umad_port_t));
		if (ca->ports[p] && umad_get_port(ca_name, p, ca->ports[p])) {
			free(ca->ports[p]);
			ca->ports[p] = NULL;
		}
	}
	return 0;
}

EXPORT int umad_release_ca(umad_ca_t *ca)
{
	int p;

	for (p = 0; p < UMAD_CA_MAX_PORTS; p++) {
		if (ca->ports[p]) {
			umad_release_port(ca->ports[p]);
			free(ca->ports[p]);
			ca->ports[p] = NULL;
		}
	}
	return 0;
}

EXPORT int umad_open_port(const char *ca_name, int portnum)
{
	struct emu_device *d = device_named(ca_name);
	struct emu_req req = {.op = EMU_OP_UMAD_OPEN};
	struct emu_rep rep;
	int fd;

	if (!d)
		return -ENODEV;
	if (portnum == 0)
		portnum = 1; /* libibumad: 0 means the first port */
	req.dev = d->index;
	req.a = (uint32_t)portnum;
	fd = open_stream(&req, &rep);
	if (fd < 0)
		return -errno;
	if (fd >= (int)(sizeof(umad_ids) / sizeof(umad_ids[0]))) {
		close(fd);
		return -EMFILE;
	}
	umad_ids[fd] = (int)rep.a;
	return fd;
}

EXPORT int umad_close_port(int portid)
{
	return close(portid) ? -errno : 0;
}

EXPORT int umad_get_fd(int portid)
{
	return portid;
}

static int umad_agent_call(uint32_t op, int portid, uint32_t b, uint32_t c, uint32_t d)
{
	struct emu_req req = {.op = op, .b = b, .c = c, .d = d};
	struct emu_rep rep;
	int fd, ret;

	if (portid < 0 || portid >= (int)(sizeof(umad_ids) / sizeof(umad_ids[0])))
		return -EINVAL;
	req.a = (uint32_t)umad_ids[portid];
	fd = emu_connect();
	if (fd < 0)
		return -ENODEV;
	ret = call_fd(fd, &req, NULL, 0, &rep, NULL, 0);
	close(fd);
	return ret ? ret : (int)rep.a;
}

EXPORT int umad_register(int portid, int mgmt_class, int mgmt_version, uint8_t rmpp_version,
			 long method_mask[])
{
	(void)method_mask; /* solicited responses only, as with a NULL mask */
	return umad_agent_call(EMU_OP_UMAD_REGISTER, portid, (uint32_t)mgmt_class,
			       (uint32_t)mgmt_version, rmpp_version);
}

EXPORT int umad_unregister(int portid, int agentid)
{
	int ret = umad_agent_call(EMU_OP_UMAD_UNREGISTER, portid, (uint32_t)agentid, 0, 0);

	return ret < 0 ? ret : 0;
}

/* The umad port connection speaks the kernel's umad ABI: struct ib_user_mad then the MAD. */
EXPORT int umad_send(int portid, int agentid, void *umad, int length, int timeout_ms,
		     int retries)
{
	struct ib_user_mad *mad = umad;
	ssize_t n, total = (ssize_t)sizeof(*mad) + length;

	mad->agent_id = (uint32_t)agentid;
	mad->timeout_ms = (uint32_t)timeout_ms;
	mad->retries = (uint32_t)retries;
	mad->length = (uint32_t)total;
	do
		n = send(portid, mad, (size_t)total, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n == total)
		return 0;
	errno = n < 0 ? errno : EIO;
	return -EIO;
}

EXPORT int umad_recv(int portid, void *umad, int *length, int timeout_ms)
{
	struct ib_user_mad *mad = umad;
	struct pollfd pfd = {.fd = portid, .events = POLLIN};
	ssize_t n, need;
	int ret;

	if (!umad || !length)
		return -EINVAL;
	if (timeout_ms) {
		do
			ret = poll(&pfd, 1, timeout_ms);
		while (ret < 0 && errno == EINTR);
		if (ret == 0) {
			errno = ETIMEDOUT;
			return -ETIMEDOUT;
		}
		if (ret < 0)
			return -errno;
	}
	need = recv(portid, NULL, 0, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
	if (need < 0)
		return -errno;
	if (need == 0) {
		errno = ECONNRESET; /* the device process is gone */
		return -ECONNRESET;
	}
	if (need > (ssize_t)sizeof(*mad) + *length) {
		/* As the kernel: the message stays queued and the length says what it needs. */
		*length = (int)(need - (ssize_t)sizeof(*mad));
		errno = ENOSPC;
		return -ENOSPC;
	}
	n = recv(portid, mad, (size_t)need, MSG_DONTWAIT);
	if (n < (ssize_t)sizeof(*mad))
		return n < 0 ? -errno : -EIO;
	*length = (int)(n - (ssize_t)sizeof(*mad));
	return (int)mad->agent_id;
}

/* A real kernel switches libibumad to the umad ABI with P_Key indexes when a port is opened
 * (IB_USER_MAD_ENABLE_PKEY); the emulated ports always speak it, so the layout helpers must
 * agree with it from the start: a 64-byte header, the MAD right after it. */
EXPORT size_t umad_size(void)
{
	return sizeof(struct ib_user_mad);
}

EXPORT void *umad_get_mad(void *umad)
{
	return ((struct ib_user_mad *)umad)->data;
}

EXPORT int umad_set_pkey(void *umad, int pkey_index)
{
	((struct ib_user_mad *)umad)->addr.pkey_index = (uint16_t)pkey_index;
	return 0;
}

EXPORT int umad_get_pkey(void *umad)
{
	return ((struct ib_user_mad *)umad)->addr.pkey_index;
}
