/* A small provider built for rdma-core's ibacm (acm_prov.h, version 1), used by the tests to
 * exercise every callback of struct acm_provider and every core function a provider can call.
 *
 *   -DPROV_NAME=\"testprov\"   its name
 *   -DWRONG_VERSION            provider_query reports version 2 (must be refused)
 *   -DFAIL_OPEN_DEVICE         open_device fails (the port must fall back)
 *
 * It resolves LID destinations with one SA PathRecord GET (acm_send_sa_mad) and answers a
 * QUERY_SA at once with the path it was given. Everything it sees it logs through acm_write,
 * one "testprov:" line per call, which the tests read back from the daemon's log. */
#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/acm_prov.h>
#include <stdlib.h>
#include <string.h>

#ifndef PROV_NAME
#define PROV_NAME "testprov"
#endif
#define ACM_ADDRESS_LID 0x05

struct resolve_ctx {
	uint64_t id;
	struct acm_msg msg;
};

static const struct acm_port *the_port;
static uint64_t events;

static int open_device(const struct acm_device *device, void **ctx)
{
	acm_log(0, "open_device verbs=%s guid=0x%016llx\n", device->verbs ? "yes" : "no",
		(unsigned long long)be64toh(device->dev_guid));
#ifdef FAIL_OPEN_DEVICE
	(void)ctx;
	return -1;
#else
	*ctx = (void *)device;
	return 0;
#endif
}

static void close_device(void *ctx)
{
	(void)ctx;
	acm_log(0, "close_device\n");
}

static int open_port(const struct acm_port *port, void *dev_ctx, void **ctx)
{
	union ibv_gid gid, back;
	char text[64];

	(void)dev_ctx;
	the_port = port;
	if (acm_get_gid((struct acm_port *)port, 0, &gid)) {
		acm_log(0, "ERROR - no GID 0\n");
		return -1;
	}
	acm_format_name(0, text, sizeof(text), 0x04 /* ACM_ADDRESS_GID */, gid.raw, 16);
	acm_log(0, "open_port %u gid0 %s index %u gid1 %s any %d\n", port->port_num, text,
		acm_gid_index((struct acm_port *)port, &gid),
		acm_get_gid((struct acm_port *)port, 1, &back) ? "none" : "some", ib_any_gid(&gid));
	*ctx = (void *)port;
	return 0;
}

static void close_port(void *ctx)
{
	(void)ctx;
	acm_log(0, "close_port\n");
}

static int open_endpoint(const struct acm_endpoint *endpoint, void *port_ctx, void **ctx)
{
	(void)port_ctx;
	acm_log(0, "open_endpoint pkey 0x%04x\n", endpoint->pkey);
	*ctx = (void *)endpoint;
	return 0;
}

static void close_endpoint(void *ctx)
{
	(void)ctx;
	acm_log(0, "close_endpoint\n");
}

static int add_address(const struct acm_address *addr, void *ep_ctx, void **ctx)
{
	char text[64];

	acm_format_name(0, text, sizeof(text), (uint8_t)addr->type, addr->info.addr,
			sizeof(addr->info.addr));
	acm_log(0, "add_address type %u %s id %s\n", addr->type, text, addr->id_string);
	*ctx = ep_ctx; /* the endpoint: resolutions send their SA query from it */
	return 0;
}

static void remove_address(void *ctx)
{
	(void)ctx;
	acm_log(0, "remove_address\n");
}

static void path_answer(struct acm_sa_mad *mad)
{
	struct resolve_ctx *rc = mad->context;
	struct acm_ep_addr_data *entry = &rc->msg.resolve_data[0];

	rc->msg.hdr.opcode |= ACM_OP_ACK;
	if (mad->umad.status || mad->sa_mad.mad_hdr.status) {
		acm_log(0, "resolve failed umad status %u\n", mad->umad.status);
		rc->msg.hdr.status = ACM_STATUS_ETIMEDOUT;
		rc->msg.hdr.length = ACM_MSG_HDR_LENGTH;
	} else {
		memset(entry, 0, sizeof(*entry));
		entry->flags = IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY | IBV_PATH_FLAG_BIDIRECTIONAL;
		entry->type = ACM_EP_INFO_PATH;
		memcpy(&entry->info.path, mad->sa_mad.data, sizeof(entry->info.path));
		rc->msg.hdr.status = ACM_STATUS_SUCCESS;
		rc->msg.hdr.length = ACM_MSG_HDR_LENGTH + ACM_MSG_EP_LENGTH;
		acm_log(0, "resolved dlid %u\n", be16toh(entry->info.path.dlid));
	}
	acm_resolve_response(rc->id, &rc->msg);
	acm_free_sa_mad(mad);
	free(rc);
}

static int resolve(void *addr_ctx, struct acm_msg *msg, uint64_t id)
{
	const struct acm_endpoint *endpoint = addr_ctx;
	struct acm_ep_addr_data *dest = &msg->resolve_data[msg->hdr.dst_index];
	struct ibv_path_record *path;
	struct resolve_ctx *rc;
	struct acm_sa_mad *mad;
	union ibv_gid sgid;

	acm_increment_counter(ACM_CNTR_ROUTE_QUERY);
	if (msg->resolve_data[0].type == ACM_EP_INFO_PATH) {
		dest = &msg->resolve_data[0]; /* path form: the DLID is in the path */
	} else if (dest->type != ACM_ADDRESS_LID) {
		acm_log(0, "resolve of type %u: not supported\n", dest->type);
		return -1;
	}
	rc = calloc(1, sizeof(*rc));
	mad = rc ? acm_alloc_sa_mad(endpoint, rc, path_answer) : NULL;
	if (!mad) {
		free(rc);
		return -1;
	}
	rc->id = id;
	rc->msg = *msg;
	mad->sa_mad.mad_hdr.base_version = 1;
	mad->sa_mad.mad_hdr.mgmt_class = UMAD_CLASS_SUBN_ADM;
	mad->sa_mad.mad_hdr.class_version = UMAD_SA_CLASS_VERSION;
	mad->sa_mad.mad_hdr.method = UMAD_METHOD_GET;
	mad->sa_mad.mad_hdr.tid = htobe64(id + 0x1000);
	mad->sa_mad.mad_hdr.attr_id = htobe16(UMAD_SA_ATTR_PATH_REC);
	path = (struct ibv_path_record *)mad->sa_mad.data;
	acm_get_gid(endpoint->port, 0, &sgid);
	memcpy(path->sgid.raw, sgid.raw, 16);
	if (dest->type == ACM_EP_INFO_PATH)
		path->dlid = dest->info.path.dlid;
	else
		memcpy(&path->dlid, dest->info.addr, 2);
	path->reversible_numpath = 0x80 | 1;
	mad->sa_mad.comp_mask = acm_path_comp_mask(path);
	acm_log(0, "resolve id %llu dlid %u comp_mask 0x%016llx\n", (unsigned long long)id,
		be16toh(path->dlid), (unsigned long long)be64toh(mad->sa_mad.comp_mask));
	if (acm_send_sa_mad(mad)) {
		acm_free_sa_mad(mad);
		free(rc);
		return -1;
	}
	return 0;
}

static int query(void *addr_ctx, struct acm_msg *msg, uint64_t id)
{
	(void)addr_ctx;
	acm_log(0, "query id %llu\n", (unsigned long long)id);
	msg->hdr.opcode |= ACM_OP_ACK;
	msg->hdr.status = ACM_STATUS_SUCCESS;
	return acm_query_response(id, msg);
}

static int handle_event(void *port_ctx, enum ibv_event_type type)
{
	(void)port_ctx;
	events++;
	acm_log(0, "handle_event %d\n", (int)type);
	return 0;
}

static void query_perf(void *ep_ctx, uint64_t *values, uint8_t *cnt)
{
	int i;

	(void)ep_ctx;
	for (i = 0; i < ACM_MAX_COUNTER; i++)
		values[i] = htobe64((uint64_t)(100 + i));
	*cnt = ACM_MAX_COUNTER;
}

static struct acm_provider provider = {
	.size = sizeof(struct acm_provider),
#ifdef WRONG_VERSION
	.version = ACM_PROV_VERSION + 1,
#else
	.version = ACM_PROV_VERSION,
#endif
	.name = PROV_NAME,
	.open_device = open_device,
	.close_device = close_device,
	.open_port = open_port,
	.close_port = close_port,
	.open_endpoint = open_endpoint,
	.close_endpoint = close_endpoint,
	.add_address = add_address,
	.remove_address = remove_address,
	.resolve = resolve,
	.query = query,
	.handle_event = handle_event,
	.query_perf = query_perf,
};

int provider_query(struct acm_provider **info, uint32_t *version)
{
	acm_log(0, "provider_query opts %s mtu %d rate %d rate4xEDR %d\n", acm_get_opts_file(),
		acm_convert_mtu(2048), acm_convert_rate(40), acm_get_rate(2, 32));
	*info = &provider;
	*version = provider.version;
	return 0;
}
