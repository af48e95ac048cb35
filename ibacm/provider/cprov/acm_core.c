/* libibacm_core.so: the core functions of acm_prov.h (version 1) for C providers loaded into
 * the Python daemon (rdma-core's libibacmp.so, vendor providers).
 *
 * A provider built for rdma-core's ibacm calls acm_* functions that rdma-core's daemon exports.
 * This library exports them; it is loaded RTLD_GLOBAL before any provider, so the providers'
 * undefined acm_* symbols bind here. What needs the daemon (responses to clients, SA MADs, GID
 * tables, counters, the log) is handed to callbacks the daemon registers (ibacm/provider/cprov/); what
 * is pure (name formatting, rate/MTU tables, a path record's component mask) is done here. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/acm_prov.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* Address types of the client protocol beyond acm.h's ACM_EP_INFO_* (client-protocol.md). */
#define ACM_ADDRESS_GID 0x04
#define ACM_ADDRESS_LID 0x05

struct cprov_callbacks {
	void (*log)(int level, const char *text);
	int (*resolve_response)(uint64_t id, const struct acm_msg *msg);
	int (*query_response)(uint64_t id, const struct acm_msg *msg);
	int (*send_sa)(struct acm_sa_mad *mad, const struct acm_endpoint *endpoint);
	int (*get_gid)(const struct acm_port *port, int index, uint8_t *gid);
	void (*count)(int type);
};

static struct cprov_callbacks cb;
static char opts_file[4096];
static int log_level;

/* The daemon's side: its callbacks, its options file, its log level. */
EXPORT void cprov_init(const struct cprov_callbacks *callbacks, const char *opts, int level)
{
	cb = *callbacks;
	snprintf(opts_file, sizeof(opts_file), "%s", opts);
	log_level = level;
}

/* Each SA MAD carries the endpoint and handler it was allocated for, in front of it. */
struct sa_request {
	const struct acm_endpoint *endpoint;
	void (*handler)(struct acm_sa_mad *);
	struct acm_sa_mad mad;
};

EXPORT size_t cprov_sa_packet_offset(void)
{
	return offsetof(struct acm_sa_mad, sa_mad);
}

/* The SA answered (or not): the reply into the MAD, the status as umad gives it, then the
 * provider's handler. Called from a worker thread, as rdma-core calls it from its SA thread. */
EXPORT void cprov_sa_done(struct acm_sa_mad *mad, int status, const uint8_t *reply, size_t len)
{
	struct sa_request *req = (struct sa_request *)((char *)mad - offsetof(struct sa_request, mad));

	mad->umad.status = (uint32_t)status;
	if (reply && len) {
		if (len > sizeof(mad->sa_mad))
			len = sizeof(mad->sa_mad);
		memcpy(&mad->sa_mad, reply, len);
	}
	req->handler(mad);
}

EXPORT void acm_write(int level, const char *format, ...)
{
	char text[2048];
	va_list args;

	if (level > log_level || !cb.log)
		return;
	va_start(args, format);
	vsnprintf(text, sizeof(text), format, args);
	va_end(args);
	cb.log(level, text);
}

EXPORT void acm_format_name(int level, char *name, size_t name_size, uint8_t addr_type,
			    const uint8_t *addr, size_t addr_size)
{
	const struct ibv_path_record *path;

	if (level > log_level)
		return;
	switch (addr_type) {
	case ACM_EP_INFO_NAME:
		memcpy(name, addr, addr_size < name_size ? addr_size : name_size);
		name[name_size - 1] = '\0';
		break;
	case ACM_EP_INFO_ADDRESS_IP:
		inet_ntop(AF_INET, addr, name, (socklen_t)name_size);
		break;
	case ACM_EP_INFO_ADDRESS_IP6:
	case ACM_ADDRESS_GID:
		inet_ntop(AF_INET6, addr, name, (socklen_t)name_size);
		break;
	case ACM_EP_INFO_PATH:
		path = (const struct ibv_path_record *)addr;
		if (path->dlid)
			snprintf(name, name_size, "SLID(%u) DLID(%u)", be16toh(path->slid),
				 be16toh(path->dlid));
		else
			inet_ntop(AF_INET6, path->dgid.raw, name, (socklen_t)name_size);
		break;
	case ACM_ADDRESS_LID:
		snprintf(name, name_size, "LID(%u)", be16toh(*(const __be16 *)addr));
		break;
	default:
		snprintf(name, name_size, "Unknown");
		break;
	}
}

EXPORT int ib_any_gid(union ibv_gid *gid)
{
	return (gid->global.subnet_prefix | gid->global.interface_id) == 0;
}

EXPORT int acm_get_gid(struct acm_port *port, int index, union ibv_gid *gid)
{
	return cb.get_gid(port, index, gid->raw);
}

EXPORT uint8_t acm_gid_index(struct acm_port *port, union ibv_gid *gid)
{
	union ibv_gid entry;
	int i;

	/* The port's table in order; its length when the GID is not in it, as rdma-core does. */
	for (i = 0; i < 255 && cb.get_gid(port, i, entry.raw) == 0; i++)
		if (!memcmp(entry.raw, gid->raw, sizeof(entry.raw)))
			break;
	return (uint8_t)i;
}

/* IBA 15.2.5.16 PathRecord component mask bits. */
#define PR_BIT(n) htobe64(1ULL << (n))

EXPORT __be64 acm_path_comp_mask(struct ibv_path_record *path)
{
	uint32_t fl_hop = be32toh(path->flowlabel_hoplimit);
	uint16_t qos_sl = be16toh(path->qosclass_sl);
	__be64 mask = 0;

	if (path->service_id)
		mask |= PR_BIT(0) | PR_BIT(1);
	if (!ib_any_gid(&path->dgid))
		mask |= PR_BIT(2);
	if (!ib_any_gid(&path->sgid))
		mask |= PR_BIT(3);
	if (path->dlid)
		mask |= PR_BIT(4);
	if (path->slid)
		mask |= PR_BIT(5);
	if (fl_hop >> 8)
		mask |= PR_BIT(8);
	if (fl_hop & 0xFF)
		mask |= PR_BIT(9);
	if (path->tclass)
		mask |= PR_BIT(10);
	if (path->reversible_numpath & 0x80)
		mask |= PR_BIT(11);
	if (path->pkey)
		mask |= PR_BIT(13);
	if (qos_sl >> 4)
		mask |= PR_BIT(14);
	if (qos_sl & 0xF)
		mask |= PR_BIT(15);
	if (path->mtu & 0xC0)
		mask |= PR_BIT(16);
	if (path->mtu & 0x3F)
		mask |= PR_BIT(17);
	if (path->rate & 0xC0)
		mask |= PR_BIT(18);
	if (path->rate & 0x3F)
		mask |= PR_BIT(19);
	if (path->packetlifetime & 0xC0)
		mask |= PR_BIT(20);
	if (path->packetlifetime & 0x3F)
		mask |= PR_BIT(21);
	return mask;
}

EXPORT int acm_resolve_response(uint64_t id, struct acm_msg *msg)
{
	return cb.resolve_response(id, msg);
}

EXPORT int acm_query_response(uint64_t id, struct acm_msg *msg)
{
	return cb.query_response(id, msg);
}

EXPORT enum ibv_rate acm_get_rate(uint8_t width, uint8_t speed)
{
	/* Rows: 1x, 4x, 8x, 12x; columns: SDR, DDR, QDR/FDR10, FDR, EDR. */
	static const enum ibv_rate table[4][5] = {
		{IBV_RATE_2_5_GBPS, IBV_RATE_5_GBPS, IBV_RATE_10_GBPS, IBV_RATE_14_GBPS,
		 IBV_RATE_25_GBPS},
		{IBV_RATE_10_GBPS, IBV_RATE_20_GBPS, IBV_RATE_40_GBPS, IBV_RATE_56_GBPS,
		 IBV_RATE_100_GBPS},
		{IBV_RATE_20_GBPS, IBV_RATE_40_GBPS, IBV_RATE_80_GBPS, IBV_RATE_112_GBPS,
		 IBV_RATE_200_GBPS},
		{IBV_RATE_30_GBPS, IBV_RATE_60_GBPS, IBV_RATE_120_GBPS, IBV_RATE_168_GBPS,
		 IBV_RATE_300_GBPS},
	};
	int row, column;

	switch (width) {
	case 1: row = 0; break;
	case 2: row = 1; break;
	case 4: row = 2; break;
	case 8: row = 3; break;
	default: return IBV_RATE_MAX;
	}
	switch (speed) {
	case 1: column = 0; break;
	case 2: column = 1; break;
	case 4: case 8: column = 2; break;
	case 16: column = 3; break;
	case 32: column = 4; break;
	default: return IBV_RATE_MAX;
	}
	return table[row][column];
}

EXPORT enum ibv_mtu acm_convert_mtu(int mtu)
{
	switch (mtu) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 4096: return IBV_MTU_4096;
	default: return IBV_MTU_2048;
	}
}

EXPORT enum ibv_rate acm_convert_rate(int rate)
{
	switch (rate) {
	case 2: return IBV_RATE_2_5_GBPS;
	case 5: return IBV_RATE_5_GBPS;
	case 20: return IBV_RATE_20_GBPS;
	case 30: return IBV_RATE_30_GBPS;
	case 40: return IBV_RATE_40_GBPS;
	case 60: return IBV_RATE_60_GBPS;
	case 80: return IBV_RATE_80_GBPS;
	case 120: return IBV_RATE_120_GBPS;
	case 14: return IBV_RATE_14_GBPS;
	case 56: return IBV_RATE_56_GBPS;
	case 112: return IBV_RATE_112_GBPS;
	case 168: return IBV_RATE_168_GBPS;
	case 25: return IBV_RATE_25_GBPS;
	case 100: return IBV_RATE_100_GBPS;
	case 200: return IBV_RATE_200_GBPS;
	case 300: return IBV_RATE_300_GBPS;
	default: return IBV_RATE_10_GBPS;
	}
}

EXPORT struct acm_sa_mad *acm_alloc_sa_mad(const struct acm_endpoint *endpoint, void *context,
					   void (*handler)(struct acm_sa_mad *))
{
	struct sa_request *req;

	if (!endpoint)
		return NULL;
	req = calloc(1, sizeof(*req));
	if (!req)
		return NULL;
	req->endpoint = endpoint;
	req->handler = handler;
	req->mad.context = context;
	return &req->mad;
}

EXPORT void acm_free_sa_mad(struct acm_sa_mad *mad)
{
	if (mad)
		free((char *)mad - offsetof(struct sa_request, mad));
}

EXPORT int acm_send_sa_mad(struct acm_sa_mad *mad)
{
	struct sa_request *req = (struct sa_request *)((char *)mad - offsetof(struct sa_request, mad));

	return cb.send_sa(mad, req->endpoint);
}

EXPORT const char *acm_get_opts_file(void)
{
	return opts_file;
}

EXPORT void acm_increment_counter(int type)
{
	if (type >= 0 && type < ACM_MAX_COUNTER && cb.count)
		cb.count(type);
}

/* The GID behind an IPoIB interface: bytes 4..19 of its 20-byte hardware address. */
EXPORT int acm_if_get_sgid(char *ifname, union ibv_gid *sgid)
{
	char path[256], text[128];
	unsigned int byte;
	FILE *f;
	int i;

	snprintf(path, sizeof(path), "/sys/class/net/%s/address", ifname);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (!fgets(text, sizeof(text), f) || strlen(text) < 59) {
		fclose(f);
		return -1;
	}
	fclose(f);
	for (i = 0; i < 16; i++) {
		if (sscanf(text + 12 + 3 * i, "%2x", &byte) != 1)
			return -1;
		sgid->raw[i] = (uint8_t)byte;
	}
	return 0;
}
