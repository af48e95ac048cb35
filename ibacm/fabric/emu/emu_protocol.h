/* Messages between libibacm_emu.so (LD_PRELOAD in an unmodified verbs/umad program) and the
 * node's emulated device process (ibacm/fabric/emu/device.py). One SOCK_SEQPACKET message per
 * request, reply, completion or event; native byte order (both ends run on this machine).
 * ibacm/fabric/emu/protocol.py holds the same layouts; tests check that both agree. */
#ifndef IBACM_EMU_PROTOCOL_H
#define IBACM_EMU_PROTOCOL_H

#include <stdint.h>

#define EMU_PROTOCOL_VERSION 2
#define EMU_SOCKET_ENV "IBACM_EMU_SOCKET"
#define EMU_NAME_LEN 64

enum emu_op {
	EMU_OP_LIST = 1,          /* -> rep.a devices, payload emu_dev_info[a] */
	EMU_OP_OPEN = 2,          /* dev -> rep.a context id; the connection is the control one */
	EMU_OP_ASYNC = 3,         /* a=ctx (new connection) -> it carries emu_async records */
	EMU_OP_QUERY_PORT = 4,    /* dev, a=port -> payload emu_port_attr */
	EMU_OP_QUERY_GID = 5,     /* dev, a=port, b=index -> payload 16 bytes */
	EMU_OP_QUERY_PKEY = 6,    /* dev, a=port, b=index -> rep.a P_Key */
	EMU_OP_CHANNEL = 7,       /* a=ctx (new connection) -> rep.a channel id; then CQ ids */
	EMU_OP_CREATE_CQ = 8,     /* a=channel id or 0, b=cqe -> rep.a CQ id */
	EMU_OP_CQ_DATA = 9,       /* a=CQ id (new connection) -> it carries emu_wc records */
	EMU_OP_ARM_CQ = 10,       /* a=CQ id, b=completions polled so far (mod 2^32); no reply */
	EMU_OP_DESTROY_CQ = 11,   /* a=CQ id */
	EMU_OP_CREATE_QP = 12,    /* dev, a=send CQ, b=recv CQ, c=QP type, d=sq_sig_all -> a id, b QPN */
	EMU_OP_MODIFY_QP = 13,    /* a=QP id, b=attr mask, c=state; payload emu_qp_mod */
	EMU_OP_DESTROY_QP = 14,   /* a=QP id */
	EMU_OP_POST_SEND = 15,    /* a=QP id, b=signaled, c=remote QPN, d=Q_Key; emu_send + data; no reply */
	EMU_OP_POST_RECV = 16,    /* a=QP id, b=buffers posted; no reply */
	EMU_OP_ATTACH = 17,       /* a=QP id, b=MLID; payload MGID */
	EMU_OP_DETACH = 18,       /* a=QP id, b=MLID; payload MGID */
	EMU_OP_UMAD_OPEN = 19,    /* dev, a=port (new connection) -> rep.a umad id; then ib_user_mad */
	EMU_OP_UMAD_REGISTER = 20,   /* a=umad id, b=class, c=class version, d=RMPP version -> rep.a agent */
	EMU_OP_UMAD_UNREGISTER = 21, /* a=umad id, b=agent */
};

struct emu_req {
	uint32_t op, dev, a, b, c, d;
};

struct emu_rep {
	int32_t status; /* 0 or -errno */
	uint32_t a, b, c;
};

struct emu_dev_info {
	char name[EMU_NAME_LEN];
	char fw_ver[EMU_NAME_LEN];
	uint64_t node_guid;  /* as on the wire (big-endian bytes) */
	uint64_t sys_guid;   /* idem */
	uint32_t ports, vendor_id, vendor_part_id, hw_ver;
};

struct emu_port_attr {
	uint32_t state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz,
		 pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
		 active_width, active_speed, phys_state, link_layer, rate_gbps;
};

struct emu_qp_mod {
	uint32_t port_num, pkey_index, qkey, pad;
};

struct emu_send {
	uint64_t wr_id;
	uint32_t dlid, sl, src_path_bits, static_rate, is_global, flow_label, sgid_index,
		 hop_limit, traffic_class, length;
	uint8_t dgid[16];
};

struct emu_wc {
	uint64_t wr_id;     /* sends: the posted wr_id; receives: unused (the library pops its own) */
	uint32_t kind;      /* 0 send, 1 receive */
	uint32_t qp_id, status, byte_len, src_qp, slid, sl, path_bits, pkey_index, grh_present;
	uint8_t grh[40];
	/* then byte_len bytes of payload (receives) */
};

struct emu_async {
	uint32_t event_type, port_num;
};

#endif
